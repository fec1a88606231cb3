// Finite-difference gradient checks in float64 for every differentiable op of autograd/ops.h.
//
// For an op f with inputs x_i, the checker contracts the output with a fixed random tensor W,
// L = sum(f(x) * W), so one backward checks a full vector-Jacobian product, and compares dL/dx
// with central differences (L(x + h e_j) - L(x - h e_j)) / 2h, h = 1e-6, element by element.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "autograd/ops.h"

namespace kiln {
namespace {

using V = std::vector<double>;
using ops::RopeStyle;
using ops::Unary;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor rand_input(const Shape& shape, std::uint64_t seed, double lo = -1.0, double hi = 1.0,
                  bool grad = true) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  V v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(g);
  Tensor t = ops::from_vector(v, shape, DType::F64);
  if (grad) t.set_requires_grad(true);
  return t;
}

double contract(const Tensor& out, const Tensor& w) {
  auto o = out.to_double_vector(), wv = w.to_double_vector();
  double s = 0;
  for (std::size_t i = 0; i < o.size(); ++i) s += o[i] * wv[i];
  return s;
}

// Checks every input that requires grad. Inputs must be contiguous f64 leaves.
void gradcheck(const Fn& f, const std::vector<Tensor>& in, const std::string& what,
               double rtol = 1e-6, double atol = 1e-8) {
  SCOPED_TRACE(what);
  Tensor probe;
  {
    NoGradGuard ng;
    probe = f(in);
  }
  ASSERT_EQ(probe.dtype(), DType::F64);
  Tensor w = rand_input(probe.shape(), 4242, -1.0, 1.0, false);

  for (const auto& x : in) {
    ASSERT_TRUE(x.is_contiguous() && x.dtype() == DType::F64);
    if (x.requires_grad()) x.impl()->grad.reset();
  }
  Tensor out = f(in);
  ASSERT_TRUE(out.requires_grad());
  Tensor loss = ag::sum_all(ag::mul(out, w));
  backward(loss);

  const double h = 1e-6;
  for (std::size_t i = 0; i < in.size(); ++i) {
    Tensor x = in[i];
    if (!x.requires_grad()) continue;
    Tensor g = x.grad();
    ASSERT_TRUE(g.defined()) << "input " << i << " got no gradient";
    ASSERT_EQ(g.shape(), x.shape());
    auto gv = g.to_double_vector();
    double* p = x.data<double>();
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      double keep = p[j];
      double lp, lm;
      {
        NoGradGuard ng;
        p[j] = keep + h;
        lp = contract(f(in), w);
        p[j] = keep - h;
        lm = contract(f(in), w);
        p[j] = keep;
      }
      double num = (lp - lm) / (2 * h);
      double tol = atol + rtol * std::max(std::abs(num), std::abs(gv[j]));
      ASSERT_LE(std::abs(gv[j] - num), tol)
          << "input " << i << " element " << j << ": analytic " << gv[j] << " numeric " << num;
    }
  }
}

// The checker itself: a wrong gradient (one factor detached) must fail.
void broken_check() {
  Tensor x = rand_input({4}, 99);
  gradcheck([](auto& v) { return ag::mul(v[0], v[0].detach()); }, {x}, "broken");
}
TEST(GradCheck, DetectsWrongGradients) { EXPECT_FATAL_FAILURE(broken_check(), "numeric"); }

// ---- elementwise ----------------------------------------------------------------------------

TEST(GradCheck, BinaryBroadcasting) {
  Tensor a = rand_input({3, 1, 4}, 1), b = rand_input({2, 4}, 2, 0.5, 2.0);
  gradcheck([](auto& x) { return ag::add(x[0], x[1]); }, {a, b}, "add");
  gradcheck([](auto& x) { return ag::sub(x[0], x[1]); }, {a, b}, "sub");
  gradcheck([](auto& x) { return ag::mul(x[0], x[1]); }, {a, b}, "mul");
  gradcheck([](auto& x) { return ag::div(x[0], x[1]); }, {a, b}, "div");
  // Only one side requires grad; a scalar-like (1) operand.
  Tensor c = rand_input({2, 4}, 3, 0.5, 2.0, false), s = rand_input({1}, 4, 0.5, 2.0);
  gradcheck([](auto& x) { return ag::div(x[0], x[1]); }, {a, c}, "div a only");
  gradcheck([](auto& x) { return ag::mul(x[0], x[1]); }, {c, s}, "mul scalar");
  gradcheck([](auto& x) { return ag::sub(x[1], x[0]); }, {c, s}, "sub scalar");
}

TEST(GradCheck, AffineAndUnary) {
  Tensor x = rand_input({3, 5}, 5, 0.3, 2.0);  // positive: log, sqrt, rsqrt, reciprocal
  gradcheck([](auto& v) { return ag::affine(v[0], -1.7, 0.4); }, {x}, "affine");
  for (auto op : {Unary::Neg, Unary::Exp, Unary::Log, Unary::Sqrt, Unary::Rsqrt, Unary::Square,
                  Unary::Reciprocal, Unary::Tanh, Unary::Sigmoid}) {
    gradcheck([op](auto& v) { return ag::unary(op, v[0]); }, {x},
              "unary " + std::to_string(static_cast<int>(op)));
  }
  // Mixed signs for the ones defined everywhere.
  Tensor y = rand_input({4, 3}, 6, -2.0, 2.0);
  for (auto op : {Unary::Neg, Unary::Exp, Unary::Square, Unary::Tanh, Unary::Sigmoid})
    gradcheck([op](auto& v) { return ag::unary(op, v[0]); }, {y},
              "unary signed " + std::to_string(static_cast<int>(op)));
  // Abs has no gradient: backward says so.
  Tensor a = ag::sum_all(ag::unary(Unary::Abs, y));
  EXPECT_THROW(backward(a), Error);
}

// ---- reductions -----------------------------------------------------------------------------

TEST(GradCheck, Reductions) {
  Tensor x = rand_input({3, 4, 5}, 7);
  for (int dim : {0, 1, 2, -1})
    for (bool keep : {false, true}) {
      std::string tag = std::to_string(dim) + (keep ? " keepdim" : "");
      gradcheck([dim, keep](auto& v) { return ag::sum(v[0], dim, keep); }, {x}, "sum " + tag);
      gradcheck([dim, keep](auto& v) { return ag::mean(v[0], dim, keep); }, {x}, "mean " + tag);
    }
  gradcheck([](auto& v) { return ag::sum_all(v[0]); }, {x}, "sum_all");
  gradcheck([](auto& v) { return ag::mean_all(v[0]); }, {x}, "mean_all");
  // Upstream gradient through a scaled scalar.
  gradcheck([](auto& v) { return ag::affine(ag::mean_all(ag::mul(v[0], v[0])), 3.0); }, {x},
            "mean_all of square");
}

// ---- views ----------------------------------------------------------------------------------

TEST(GradCheck, Views) {
  Tensor x = rand_input({2, 3, 4}, 8);
  gradcheck([](auto& v) { return ag::reshape(v[0], {4, -1}); }, {x}, "reshape");
  gradcheck([](auto& v) { return ag::reshape(ag::transpose(v[0], 0, 2), {-1}); }, {x},
            "reshape of transpose (copy)");
  gradcheck([](auto& v) { return ag::transpose(v[0], 0, 2); }, {x}, "transpose");
  gradcheck([](auto& v) { return ag::permute(v[0], {1, 2, 0}); }, {x}, "permute");
  gradcheck([](auto& v) { return ag::narrow(v[0], 2, 1, 2); }, {x}, "narrow");
  gradcheck([](auto& v) { return ag::narrow(ag::narrow(v[0], 1, 1, 2), 0, 1, 1); }, {x},
            "narrow twice");
  gradcheck(
      [](auto& v) {
        return ag::contiguous(ag::permute(v[0], {2, 0, 1}));
      },
      {x}, "contiguous");
  Tensor y = rand_input({3, 1}, 9);
  gradcheck([](auto& v) { return ag::expand(v[0], {2, 3, 4}); }, {y}, "expand");
  // A view used by a differentiable op downstream.
  gradcheck(
      [](auto& v) {
        return ag::mul(ag::transpose(v[0], 1, 2), ag::expand(v[1], {2, 4, 3}));
      },
      {x, rand_input({4, 1}, 10)}, "mul of views");
}

TEST(GradCheck, ToDtype) {
  // The f32 round trip is not smooth at h = 1e-6; check the chain rule directly instead.
  Tensor x = rand_input({5}, 11);
  Tensor y = ag::to_dtype(x, DType::F32);
  EXPECT_EQ(y.dtype(), DType::F32);
  Tensor loss = ag::sum_all(ag::affine(y, 3.0));
  backward(loss);
  EXPECT_EQ(x.grad().dtype(), DType::F64);
  for (double g : x.grad().to_double_vector()) EXPECT_EQ(g, 3.0);
  EXPECT_EQ(ag::to_dtype(x, DType::F64).impl(), x.impl());
}

// ---- linear algebra -------------------------------------------------------------------------

TEST(GradCheck, Matmul) {
  const std::int64_t M = 3, K = 4, N = 5, B = 2;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::string tag = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      Shape as = ta ? Shape{K, M} : Shape{M, K}, bs = tb ? Shape{N, K} : Shape{K, N};
      Fn f = [ta, tb](auto& v) { return ag::matmul(v[0], v[1], ta, tb); };
      gradcheck(f, {rand_input(as, 20), rand_input(bs, 21)}, "2d " + tag);
      gradcheck(f, {rand_input({B, as[0], as[1]}, 22), rand_input({B, bs[0], bs[1]}, 23)},
                "batched " + tag);
      if (!ta)
        gradcheck(f, {rand_input({B, as[0], as[1]}, 24), rand_input(bs, 25)}, "3d@2d " + tag);
      // Only one operand requires grad.
      gradcheck(f, {rand_input(as, 26), rand_input(bs, 27, -1, 1, false)}, "a only " + tag);
      gradcheck(f, {rand_input(as, 28, -1, 1, false), rand_input(bs, 29)}, "b only " + tag);
    }
  // (B, K, M)^T @ (K, N) has no gradient: a clear error at record time.
  EXPECT_THROW(ag::matmul(rand_input({B, K, M}, 30), rand_input({K, N}, 31), true, false), Error);
}

TEST(GradCheck, Linear) {
  Tensor x = rand_input({2, 3, 5}, 32), w = rand_input({4, 5}, 33), b = rand_input({4}, 34);
  gradcheck([](auto& v) { return ag::linear(v[0], v[1], v[2]); }, {x, w, b}, "with bias");
  gradcheck([](auto& v) { return ag::linear(v[0], v[1]); }, {x, w}, "without bias");
  gradcheck([](auto& v) { return ag::linear(v[0], v[1]); },
            {rand_input({3, 5}, 35, -1, 1, false), w}, "weight only");
  gradcheck([](auto& v) { return ag::linear(v[0], v[1], v[2]); },
            {x, rand_input({4, 5}, 36, -1, 1, false), b}, "x and bias");
  // A non-leaf weight (its gradient is returned, not accumulated in place).
  gradcheck([](auto& v) { return ag::linear(v[0], ag::affine(v[1], 2.0)); }, {x, w},
            "non-leaf weight");
}

// ---- nn ops ---------------------------------------------------------------------------------

TEST(GradCheck, SoftmaxLogSoftmax) {
  Tensor x = rand_input({3, 7}, 40, -2, 2);
  gradcheck([](auto& v) { return ag::softmax(v[0]); }, {x}, "softmax");
  gradcheck([](auto& v) { return ag::log_softmax(v[0]); }, {x}, "log_softmax");
  gradcheck([](auto& v) { return ag::softmax(ag::transpose(v[0], 0, 1)); }, {x},
            "softmax of a transpose");
}

TEST(GradCheck, Embedding) {
  Tensor table = rand_input({6, 4}, 41);
  Tensor ids = ops::from_vector(std::vector<std::int32_t>{5, 0, 2, 5, 5, 1, 0}, {7});
  gradcheck([ids](auto& v) { return ag::embedding(ids, v[0]); }, {table}, "leaf table");
  gradcheck(
      [ids](auto& v) {
        return ag::embedding(ids.reshape({1, 7}), ag::affine(v[0], 0.5));
      },
      {table}, "non-leaf table");
}

TEST(GradCheck, Norms) {
  Tensor x = rand_input({2, 3, 6}, 42, -2, 2), w = rand_input({6}, 43, 0.5, 1.5),
         b = rand_input({6}, 44);
  gradcheck([](auto& v) { return ag::rmsnorm(v[0], v[1], 1e-5); }, {x, w}, "rmsnorm");
  gradcheck([](auto& v) { return ag::rmsnorm(v[0], v[1], 1e-5); },
            {x, rand_input({6}, 45, 0.5, 1.5, false)}, "rmsnorm x only");
  gradcheck([](auto& v) { return ag::rmsnorm(v[0], ag::affine(v[1], 1.5), 1e-5); }, {x, w},
            "rmsnorm non-leaf weight");
  gradcheck([](auto& v) { return ag::layernorm(v[0], v[1], v[2], 1e-5); }, {x, w, b}, "layernorm");
  gradcheck([](auto& v) { return ag::layernorm(v[0], ag::affine(v[1], 2.0), v[2], 1e-5); },
            {x, w, b}, "layernorm non-leaf weight");
  gradcheck([](auto& v) { return ag::layernorm(v[0], v[1], v[2], 1e-5); },
            {rand_input({2, 6}, 46, -1, 1, false), w, b}, "layernorm params only");
}

TEST(GradCheck, Rope) {
  auto [cos, sin] = ops::rope_tables(12, 6, 10000.0, DType::F64);
  Tensor x = rand_input({2, 5, 3, 6}, 47);
  for (auto style : {RopeStyle::Interleaved, RopeStyle::RotateHalf})
    for (std::int64_t off : {0, 4}) {
      Tensor c = cos, s = sin;
      gradcheck(
          [c, s, style, off](auto& v) { return ag::rope(v[0], c, s, style, off); }, {x},
          "rope " + std::to_string(static_cast<int>(style)) + " offset " + std::to_string(off));
    }
}

TEST(GradCheck, Activations) {
  Tensor x = rand_input({3, 5}, 48, -3, 3), u = rand_input({3, 5}, 49, -2, 2);
  for (Op op : kActivations)  // silu, gelu_tanh, gelu, ...
    gradcheck([op](auto& v) { return ag::activation(op, v[0]); }, {x}, std::string(op_name(op)));
  gradcheck([](auto& v) { return ag::swiglu(v[0], v[1]); }, {x, u}, "swiglu");
  gradcheck([](auto& v) { return ag::swiglu(v[0], v[1]); },
            {x, rand_input({3, 5}, 50, -2, 2, false)}, "swiglu gate only");
}

TEST(GradCheck, AttentionGqa) {
  const std::int64_t B = 2, T = 5, Hq = 4, Hkv = 2, D = 4;
  Tensor q = rand_input({B, T, Hq, D}, 51), k = rand_input({B, T, Hkv, D}, 52),
         v = rand_input({B, T, Hkv, D}, 53);
  double scale = 1.0 / std::sqrt(static_cast<double>(D));
  gradcheck([scale](auto& x) { return ag::attention(x[0], x[1], x[2], scale); }, {q, k, v},
            "attention");
  // Through the projections' layout: (B, T, H*D) reshaped, as the layers do.
  Tensor qf = rand_input({B, T, Hq * D}, 54);
  gradcheck(
      [scale](auto& x) {
        Tensor qq = ag::reshape(x[0], {2, 5, 4, 4});
        return ag::attention(qq, x[1], x[2], 0.7);
      },
      {qf, k, v}, "attention from reshaped q");
  // A query offset only works without gradients.
  EXPECT_THROW(ag::attention(q, k, v, scale, 1), Error);
  {
    // Two queries at positions 3 and 4 of the cache (offset 3) are rows 3 and 4 of a full causal
    // pass whose queries there are the same: checked in f64, to rounding.
    NoGradGuard ng;
    const Tensor qs = ag::narrow(q, 1, 0, 2).contiguous();
    const Tensor got = ag::attention(qs, k, v, scale, 3);
    Tensor qfull = ops::zeros(q.shape(), q.dtype());
    Tensor rows = qfull.narrow(1, 3, 2);
    rows.copy_(qs);
    const Tensor want = ag::attention(qfull, k, v, scale).narrow(1, 3, 2).contiguous();
    const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
    ASSERT_EQ(g.size(), w.size());
    for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-12) << i;
  }
}

TEST(GradCheck, CrossEntropy) {
  Tensor logits = rand_input({6, 7}, 55, -2, 2);
  Tensor targets = ops::from_vector(std::vector<std::int32_t>{3, -100, 0, 6, -100, 3}, {6});
  gradcheck([targets](auto& v) { return ag::cross_entropy(v[0], targets); }, {logits},
            "ignore -100");
  Tensor t2 = ops::from_vector(std::vector<std::int32_t>{1, 1, 5, 0, 2, 4}, {6});
  gradcheck([t2](auto& v) { return ag::cross_entropy(v[0], t2, 5); }, {logits}, "ignore 5");
  gradcheck([t2](auto& v) { return ag::affine(ag::cross_entropy(ag::mul(v[0], v[0]), t2), 2.0); },
            {logits}, "upstream chain");
  // The loss value: mean over non-ignored rows.
  auto lv = logits.to_double_vector();
  std::vector<int> tg = {3, -100, 0, 6, -100, 3};
  double want = 0;
  for (int n = 0; n < 6; ++n) {
    if (tg[n] < 0) continue;
    double z = 0;
    for (int c = 0; c < 7; ++c) z += std::exp(lv[n * 7 + c]);
    want += std::log(z) - lv[n * 7 + tg[n]];
  }
  EXPECT_NEAR(ag::cross_entropy(logits, targets).item(), want / 4, 1e-12);
  // All rows ignored: loss 0, zero gradient.
  Tensor none = ops::full({6}, -100, DType::F32).to(DType::I32);
  logits.impl()->grad.reset();
  Tensor l0 = ag::cross_entropy(logits, none);
  EXPECT_EQ(l0.item(), 0.0);
  backward(l0);
  for (double g : logits.grad().to_double_vector()) EXPECT_EQ(g, 0.0);
}

TEST(GradCheck, DropoutFixedMask) {
  Tensor x = rand_input({4, 9}, 56);
  // A fresh generator with the same state on every call: the same mask each time.
  gradcheck(
      [](auto& v) {
        Generator g(77, 5);
        return ag::dropout(v[0], 0.4, g, true);
      },
      {x}, "dropout");
  // Eval mode and p = 0 are the identity (same tensor, no node).
  Generator g(1);
  EXPECT_EQ(ag::dropout(x, 0.4, g, false).impl(), x.impl());
  EXPECT_EQ(ag::dropout(x, 0.0, g, true).impl(), x.impl());
}

TEST(GradCheck, Checkpoint) {
  Tensor x = rand_input({2, 3, 4}, 57), w1 = rand_input({6, 4}, 58), w2 = rand_input({4, 6}, 59);
  Tensor nw = rand_input({4}, 60, 0.5, 1.5);
  auto block = [](const Tensor& h, const Tensor& a, const Tensor& b, const Tensor& n) {
    Tensor y = ag::linear(ag::silu(ag::linear(ag::rmsnorm(h, n, 1e-5), a)), b);
    return ag::add(h, y);
  };
  Fn f = [block](auto& v) {
    Tensor a = v[1], b = v[2], n = v[3];
    return ag::checkpoint([=](const std::vector<Tensor>& in) { return block(in[0], a, b, n); },
                          {v[0]});
  };
  gradcheck(f, {x, w1, w2, nw}, "checkpointed block");
}

}  // namespace
}  // namespace kiln
