// The op front end (tensor/ops.h) against plain float64 references computed here, on odd sizes
// and non-contiguous inputs, in f64 (tight), f32 and bf16 (computed in f32, returned as bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tests/error_of.h"

namespace kiln {
namespace {

using V = std::vector<double>;

Tensor randt(const Shape& shape, std::uint64_t seed, DType dtype = DType::F64, double lo = -1.0,
             double hi = 1.0) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  V v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(g);
  Tensor t = ops::from_vector(v, shape, DType::F64);
  return dtype == DType::F64 ? t : t.to(dtype);
}

// Row-major index of a multi-index.
std::int64_t flat(const Shape& shape, const std::vector<std::int64_t>& idx) {
  std::int64_t f = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}
std::vector<std::int64_t> unravel(std::int64_t i, const Shape& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

::testing::AssertionResult close(const V& got, const V& want, double rtol, double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    double tol = atol + rtol * std::abs(want[i]);
    if (!(std::abs(got[i] - want[i]) <= tol))
      return ::testing::AssertionFailure()
             << "index " << i << ": got " << got[i] << " want " << want[i];
  }
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult close(const Tensor& got, const V& want, double rtol = 1e-12,
                                 double atol = 1e-12) {
  return close(got.to_double_vector(), want, rtol, atol);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- elementwise ----------------------------------------------------------------------------

TEST(Ops, BinaryBroadcastNonContiguous) {
  Tensor a = randt({3, 1, 5}, 1);
  Tensor b = randt({5, 4}, 2, DType::F64, 0.5, 2.0).transpose(0, 1);  // (4, 5), strided
  Shape out{3, 4, 5};
  EXPECT_EQ(ops::broadcast_shapes(a.shape(), b.shape(), "t"), out);
  auto av = a.to_double_vector(), bv = b.to_double_vector();
  for (auto op : {ops::Binary::Add, ops::Binary::Sub, ops::Binary::Mul, ops::Binary::Div,
                  ops::Binary::Max, ops::Binary::Min}) {
    Tensor c = ops::binary(op, a, b);
    ASSERT_EQ(c.shape(), out);
    V want(60);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 5; ++k) {
          double x = av[i * 5 + k], y = bv[j * 5 + k], r = 0;
          switch (op) {
            case ops::Binary::Add:
              r = x + y;
              break;
            case ops::Binary::Sub:
              r = x - y;
              break;
            case ops::Binary::Mul:
              r = x * y;
              break;
            case ops::Binary::Div:
              r = x / y;
              break;
            case ops::Binary::Max:
              r = std::max(x, y);
              break;
            case ops::Binary::Min:
              r = std::min(x, y);
              break;
          }
          want[(i * 4 + j) * 5 + k] = r;
        }
    EXPECT_TRUE(close(c, want)) << static_cast<int>(op);
    // f32 too.
    Tensor c32 = ops::binary(op, a.to(DType::F32), b.to(DType::F32));
    EXPECT_EQ(c32.dtype(), DType::F32);
    EXPECT_TRUE(close(c32, want, 1e-6, 1e-6)) << static_cast<int>(op);
  }
  EXPECT_THROW(ops::add(randt({3, 4}, 1), randt({3, 5}, 2)), Error);
  EXPECT_THROW(ops::add(randt({3}, 1), randt({3}, 2, DType::F32)), Error);
}

TEST(Ops, UnaryAffineInPlace) {
  Tensor x = randt({7, 9}, 3, DType::F64, 0.2, 2.0).narrow(1, 1, 7);  // positive, strided
  auto xv = x.to_double_vector();
  struct Case {
    ops::Unary op;
    double (*f)(double);
  };
  std::vector<Case> cases = {
      {ops::Unary::Neg, [](double v) { return -v; }},
      {ops::Unary::Exp, [](double v) { return std::exp(v); }},
      {ops::Unary::Log, [](double v) { return std::log(v); }},
      {ops::Unary::Sqrt, [](double v) { return std::sqrt(v); }},
      {ops::Unary::Rsqrt, [](double v) { return 1.0 / std::sqrt(v); }},
      {ops::Unary::Abs, [](double v) { return std::abs(v); }},
      {ops::Unary::Square, [](double v) { return v * v; }},
      {ops::Unary::Reciprocal, [](double v) { return 1.0 / v; }},
      {ops::Unary::Tanh, [](double v) { return std::tanh(v); }},
      {ops::Unary::Sigmoid, [](double v) { return 1.0 / (1.0 + std::exp(-v)); }},
  };
  for (const auto& c : cases) {
    V want;
    for (double v : xv) want.push_back(c.f(v));
    EXPECT_TRUE(close(ops::unary(c.op, x), want, 1e-12, 1e-12)) << static_cast<int>(c.op);
    EXPECT_TRUE(close(ops::unary(c.op, x.to(DType::F32)), want, 2e-6, 1e-6))
        << static_cast<int>(c.op);
  }
  V aff;
  for (double v : xv) aff.push_back(-1.5 * v + 0.25);
  EXPECT_TRUE(close(ops::affine(x, -1.5, 0.25), aff));
  Tensor y = x.contiguous().clone();
  ops::axpy_(y, 2.0, x);
  V ax;
  for (double v : xv) ax.push_back(3 * v);
  EXPECT_TRUE(close(y, ax));
  ops::scale_(y, 0.5);
  for (double& v : ax) v *= 0.5;
  EXPECT_TRUE(close(y, ax));
  Tensor yb = x.to(DType::BF16);
  ops::scale_(yb, 2.0);  // bf16 in place
  EXPECT_EQ(yb.dtype(), DType::BF16);
  V twice;
  for (double v : xv) twice.push_back(2 * v);
  EXPECT_TRUE(close(yb, twice, 8e-3, 1e-6));
}

// ---- reductions -----------------------------------------------------------------------------

TEST(Ops, ReduceEachDimNonContiguous) {
  Tensor x = randt({5, 3, 4}, 4).permute({1, 2, 0});  // (3, 4, 5), non-contiguous
  Shape s = x.shape();
  auto xv = x.to_double_vector();
  for (int dim = 0; dim < 3; ++dim)
    for (bool keepdim : {false, true})
      for (auto op : {ops::Reduce::Sum, ops::Reduce::Mean, ops::Reduce::Max, ops::Reduce::Min}) {
        Shape os = s;
        os[dim] = 1;
        std::int64_t on = shape_numel(os);
        V want(on, 0.0);
        std::vector<bool> first(on, true);
        for (std::int64_t i = 0; i < 60; ++i) {
          auto idx = unravel(i, s);
          idx[dim] = 0;
          std::int64_t o = flat(os, idx);
          double v = xv[i];
          if (op == ops::Reduce::Sum || op == ops::Reduce::Mean) want[o] += v;
          if (op == ops::Reduce::Max) want[o] = first[o] ? v : std::max(want[o], v);
          if (op == ops::Reduce::Min) want[o] = first[o] ? v : std::min(want[o], v);
          first[o] = false;
        }
        if (op == ops::Reduce::Mean)
          for (auto& w : want) w /= static_cast<double>(s[dim]);
        Tensor r = ops::reduce(op, x, dim, keepdim);
        Shape expect_shape = os;
        if (!keepdim) expect_shape.erase(expect_shape.begin() + dim);
        EXPECT_EQ(r.shape(), expect_shape);
        EXPECT_TRUE(close(r, want)) << dim << keepdim << static_cast<int>(op);
        Tensor r32 = ops::reduce(op, x.to(DType::F32), dim - 3, keepdim);  // negative dim
        EXPECT_TRUE(close(r32, want, 1e-5, 1e-6));
      }
  // argmax over each dim.
  for (int dim = 0; dim < 3; ++dim) {
    Tensor am = ops::argmax(x, dim);
    EXPECT_EQ(am.dtype(), DType::I64);
    Shape os = s;
    os[dim] = 1;
    V best(shape_numel(os), -1e300), want(shape_numel(os), 0);
    for (std::int64_t i = 0; i < 60; ++i) {
      auto idx = unravel(i, s);
      std::int64_t at = idx[dim];
      idx[dim] = 0;
      std::int64_t o = flat(os, idx);
      if (xv[i] > best[o]) {
        best[o] = xv[i];
        want[o] = static_cast<double>(at);
      }
    }
    EXPECT_EQ(am.to_double_vector(), want) << dim;
  }
  V all = xv;
  double tot = 0;
  for (double v : all) tot += v;
  EXPECT_NEAR(ops::sum_all(x).item(), tot, 1e-12);
  double sq = 0;
  for (double v : all) sq += v * v;
  EXPECT_NEAR(ops::sum_squares(x), sq, 1e-12);
}

// Clipping's global norm: every tensor's squares in one call, in any float dtype and layout,
// against an f64 sum of the values; the CPU sums tensor by tensor in order, so it equals the
// ordered sum of sum_squares exactly.
TEST(Ops, SumSquaresMultiSumsEveryTensor) {
  const std::vector<Tensor> ts = {randt({3, 5}, 11), Tensor(),
                                  randt({4, 6}, 12).to(DType::F32).transpose(0, 1),
                                  ops::zeros({0, 3}), randt({7}, 13).to(DType::BF16)};
  double want = 0, ordered = 0;
  for (const Tensor& t : ts) {
    if (!t.defined()) continue;
    for (double v : t.to_double_vector()) want += v * v;
    ordered += ops::sum_squares(t);
  }
  const double got = ops::sum_squares_multi(ts);
  EXPECT_NEAR(got, want, 1e-6 * want);
  EXPECT_EQ(got, ordered);
  EXPECT_EQ(ops::sum_squares_multi(std::vector<Tensor>{}), 0.0);
  EXPECT_EQ(ops::sum_squares_multi(std::vector<Tensor>{Tensor(), ops::zeros({0})}), 0.0);
  EXPECT_THROW(ops::sum_squares_multi(std::vector<Tensor>{ops::zeros({2}, DType::I32)}), Error);
  EXPECT_THROW(ops::sum_squares_multi(std::vector<Tensor>{
                   ops::zeros({2}), ops::zeros({2}, DType::F32, Device::meta())}),
               Error);
}

// Checks the CUDA glue alone used to make are the front end's now, for every backend: each
// inconsistent call is refused by name on the CPU, before any kernel reads past a buffer.
TEST(Ops, FrontEndRefusesWhatOnlyTheCudaGlueChecked) {
  auto refused = [](auto&& f, const std::string& part) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what()).find(part) != std::string::npos
                 ? testing::AssertionSuccess()
                 : testing::AssertionFailure() << "message: " << e.what();
    }
    return testing::AssertionFailure() << "accepted";
  };
  const Tensor x = randt({3, 8}, 1, DType::F32), w = randt({8}, 2, DType::F32);
  EXPECT_TRUE(refused(
      [&] {
        ops::linear(x, randt({5, 8}, 3, DType::F32), randt({4}, 4, DType::F32));
      },
      "[linear] bias (4,) does not match 5 outputs"));
  Tensor dw = ops::zeros({8});
  EXPECT_TRUE(refused([&] { ops::rmsnorm_backward(x, w, ops::zeros({2}), x, &dw); },
                      "[rmsnorm] backward: weight of 8 and 2 row statistics for 3 rows of 8"));
  Tensor short_dw = ops::zeros({7});
  EXPECT_TRUE(refused([&] { ops::rmsnorm_backward(x, w, ops::zeros({3}), x, &short_dw); },
                      "[rmsnorm] weight gradient must be contiguous with 8 elements"));
  EXPECT_TRUE(refused(
      [&] {
        ops::swiglu_backward(x, randt({3, 7}, 5, DType::F32), x);
      },
      "[swiglu] shapes"));
  EXPECT_TRUE(refused(
      [&] {
        ops::dropout_backward(x, ops::zeros({3, 8}), 0.1);
      },
      "[dropout] the mask must be bool, got f32"));
  Tensor p = ops::zeros({8}), buf = ops::zeros({7});
  EXPECT_TRUE(refused([&] { ops::sgd_step_(p, w, buf, 0.1, 0.9, 0, 0, false, 1); }, "[sgd]"));
  const Tensor logits = randt({4, 6}, 6, DType::F32);
  const Tensor targets = ops::from_vector(std::vector<std::int32_t>{0, 1, 2, 3}, {4});
  EXPECT_TRUE(refused(
      [&] { ops::cross_entropy_backward(logits, ops::zeros({3}), targets, ops::zeros({4}), -100); },
      "[cross_entropy] backward: logits (4, 6) need (N) i32 targets and (N) lse"));
  const Tensor q = randt({1, 4, 2, 8}, 7, DType::F32), k = randt({1, 4, 1, 8}, 8, DType::F32);
  EXPECT_TRUE(refused(
      [&] {
        ops::attention_backward(q, k, k, q, ops::zeros({1, 2, 3}), q, 0.3);
      },
      "[attention] backward: lse (1, 2, 3) must be (B, Hq, T) = (1, 2, 4)"));
  EXPECT_TRUE(refused(
      [&] {
        ops::attention_backward(q, k, randt({1, 4, 2, 8}, 9, DType::F32), q, ops::zeros({1, 2, 4}),
                                q, 0.3);
      },
      "[attention] backward: q (1, 4, 2, 8) k (1, 4, 1, 8) v (1, 4, 2, 8)"));
  auto [cos, sin] = ops::rope_tables(16, 8, 10000.0);
  EXPECT_TRUE(
      refused([&] { ops::rope(q, cos, sin.narrow(0, 0, 8), ops::RopeStyle::RotateHalf, 0); },
              "[rope] sin table (8, 4) differs from cos table (16, 4)"));
  Tensor dtable = ops::zeros({10, 8});
  EXPECT_TRUE(refused([&] { ops::embedding_backward_(dtable, ops::zeros({3}, DType::I64), x); },
                      "[embedding] token ids must be i32, got i64"));
  // One device for every tensor of every multi-tensor AdamW item.
  std::vector<ops::AdamWTensors> items{{ops::zeros({8}), ops::zeros({8}), Tensor(),
                                        ops::zeros({8}, DType::F32, Device::meta()),
                                        ops::zeros({8}), 0.0}};
  EXPECT_TRUE(refused([&] { ops::adamw_multi_step_(items, 1e-3, 0.9, 0.99, 1e-8, 1); },
                      "[adamw] tensors on different devices: cpu and meta"));
}

// An empty first item does not stand for the whole multi-tensor AdamW step (the dispatcher
// runs nothing for an empty anchor): the second item is still updated.
TEST(Ops, AdamWMultiStepWithAnEmptyFirstItemUpdatesTheRest) {
  std::vector<ops::AdamWTensors> items{
      {ops::zeros({0}), ops::zeros({0}), Tensor(), ops::zeros({0}), ops::zeros({0}), 0.0},
      {ops::ones({4}), ops::full({4}, 0.5), Tensor(), ops::zeros({4}), ops::zeros({4}), 0.0}};
  ops::adamw_multi_step_(items, 0.1, 0.9, 0.99, 1e-8, 1);
  // The first AdamW step moves every weight by lr * sign(grad) (m / sqrt(v) = 1 after bias
  // correction, up to eps).
  for (double v : items[1].param.to_double_vector()) EXPECT_NEAR(v, 0.9, 1e-6);
}

TEST(Ops, SumTo) {
  Tensor x = randt({2, 3, 4}, 5);
  auto xv = x.to_double_vector();
  struct Case {
    Shape to;
  };
  for (Shape to : {Shape{3, 4}, Shape{4}, Shape{3, 1}, Shape{1, 3, 1}, Shape{2, 1, 4},
                   Shape{1, 1, 1}, Shape{1, 4}, Shape{2, 3, 4}}) {
    Tensor r = ops::sum_to(x, to);
    ASSERT_EQ(r.shape(), to);
    // Reference: every element of x adds to the target position it broadcast from.
    std::size_t lead = 3 - to.size();
    V want(shape_numel(to), 0.0);
    for (std::int64_t i = 0; i < 24; ++i) {
      auto idx = unravel(i, {2, 3, 4});
      std::vector<std::int64_t> t(to.size());
      for (std::size_t d = 0; d < to.size(); ++d) t[d] = to[d] == 1 ? 0 : idx[d + lead];
      want[flat(to, t)] += xv[i];
    }
    EXPECT_TRUE(close(r, want)) << shape_str(to);
  }
  EXPECT_THROW(ops::sum_to(x, {5}), Error);
}

// ---- matmul / linear ------------------------------------------------------------------------

// C[b] = op(A[b]) op(B[b]) with op chosen by transpose flags; inputs as logical values.
V ref_matmul(const V& a, const V& b, std::int64_t batch, std::int64_t M, std::int64_t N,
             std::int64_t K, bool ta, bool tb, bool b_batched) {
  V c(batch * M * N, 0.0);
  for (std::int64_t p = 0; p < batch; ++p)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          double x = ta ? a[p * M * K + k * M + i] : a[p * M * K + i * K + k];
          std::int64_t bo = b_batched ? p * K * N : 0;
          double y = tb ? b[bo + j * K + k] : b[bo + k * N + j];
          s += x * y;
        }
        c[(p * M + i) * N + j] = s;
      }
  return c;
}

TEST(Ops, MatmulTransposesAndBatches) {
  const std::int64_t M = 5, N = 7, K = 9, Bt = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Shape as = ta ? Shape{K, M} : Shape{M, K}, bs = tb ? Shape{N, K} : Shape{K, N};
      Tensor a = randt(as, 10), b = randt(bs, 11);
      V want = ref_matmul(a.to_double_vector(), b.to_double_vector(), 1, M, N, K, ta, tb, false);
      Tensor c = ops::matmul(a, b, ta, tb);
      EXPECT_EQ(c.shape(), (Shape{M, N}));
      EXPECT_TRUE(close(c, want)) << ta << tb;
      EXPECT_TRUE(close(ops::matmul(a.to(DType::F32), b.to(DType::F32), ta, tb), want, 1e-5, 1e-5));
      // Batched, and batched @ 2-d.
      Shape ab = {Bt, as[0], as[1]}, bb = {Bt, bs[0], bs[1]};
      Tensor a3 = randt(ab, 12), b3 = randt(bb, 13);
      V w3 = ref_matmul(a3.to_double_vector(), b3.to_double_vector(), Bt, M, N, K, ta, tb, true);
      EXPECT_TRUE(close(ops::matmul(a3, b3, ta, tb), w3)) << ta << tb;
      V w32 = ref_matmul(a3.to_double_vector(), b.to_double_vector(), Bt, M, N, K, ta, tb, false);
      Tensor c32 = ops::matmul(a3, b, ta, tb);
      EXPECT_EQ(c32.shape(), (Shape{Bt, M, N}));
      EXPECT_TRUE(close(c32, w32)) << ta << tb;
    }
  // Non-contiguous operands (a transposed view passed without the flag).
  Tensor at = randt({K, M}, 14).transpose(0, 1);  // (M, K) strided
  Tensor b = randt({K, N}, 15);
  V want = ref_matmul(at.to_double_vector(), b.to_double_vector(), 1, M, N, K, false, false, false);
  EXPECT_TRUE(close(ops::matmul(at, b), want));
  EXPECT_THROW(ops::matmul(randt({3, 4}, 1), randt({5, 6}, 2)), Error);
  EXPECT_THROW(ops::matmul(randt({3, 4}, 1), randt({2, 4, 6}, 2)), Error);
  EXPECT_THROW(ops::matmul(randt({2, 3, 4}, 1), randt({3, 4, 6}, 2)), Error);
  // gemm_ accumulates with beta.
  Tensor c = randt({M, N}, 16);
  auto c0 = c.to_double_vector();
  Tensor a2 = randt({M, K}, 17);
  ops::gemm_(c, a2, b, false, false, 2.0, 0.5);
  V g = ref_matmul(a2.to_double_vector(), b.to_double_vector(), 1, M, N, K, false, false, false);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = 2.0 * g[i] + 0.5 * c0[i];
  EXPECT_TRUE(close(c, g));
}

TEST(Ops, LinearWithAndWithoutBias) {
  Tensor x = randt({2, 3, 11}, 20), w = randt({6, 11}, 21), b = randt({6}, 22);
  auto xv = x.to_double_vector(), wv = w.to_double_vector(), bv = b.to_double_vector();
  V want(36), want_nb(36);
  for (int r = 0; r < 6; ++r)
    for (int o = 0; o < 6; ++o) {
      double s = 0;
      for (int k = 0; k < 11; ++k) s += xv[r * 11 + k] * wv[o * 11 + k];
      want_nb[r * 6 + o] = s;
      want[r * 6 + o] = s + bv[o];
    }
  Tensor y = ops::linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 6}));
  EXPECT_TRUE(close(y, want));
  EXPECT_TRUE(close(ops::linear(x, w, Tensor()), want_nb));
  // Non-contiguous x (a transposed view) and f32.
  Tensor xt = x.transpose(0, 1);  // (3, 2, 11)
  V want_t(36);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int o = 0; o < 6; ++o) want_t[(i * 2 + j) * 6 + o] = want[(j * 3 + i) * 6 + o];
  EXPECT_TRUE(close(ops::linear(xt, w, b), want_t));
  EXPECT_TRUE(
      close(ops::linear(x.to(DType::F32), w.to(DType::F32), b.to(DType::F32)), want, 1e-5, 1e-5));
  EXPECT_THROW(ops::linear(x, randt({6, 10}, 1), b), Error);
}

// ---- nn ops ---------------------------------------------------------------------------------

TEST(Ops, SoftmaxLogSoftmax) {
  Tensor x = randt({9, 4}, 30, DType::F64, -5, 5).transpose(0, 1);  // rows of 9, strided
  auto xv = x.to_double_vector();
  V sm(36), lsm(36);
  for (int r = 0; r < 4; ++r) {
    double mx = -1e300, s = 0;
    for (int c = 0; c < 9; ++c) mx = std::max(mx, xv[r * 9 + c]);
    for (int c = 0; c < 9; ++c) s += std::exp(xv[r * 9 + c] - mx);
    for (int c = 0; c < 9; ++c) {
      sm[r * 9 + c] = std::exp(xv[r * 9 + c] - mx) / s;
      lsm[r * 9 + c] = xv[r * 9 + c] - mx - std::log(s);
    }
  }
  EXPECT_TRUE(close(ops::softmax(x), sm));
  EXPECT_TRUE(close(ops::log_softmax(x), lsm));
  EXPECT_TRUE(close(ops::softmax(x.to(DType::F32)), sm, 1e-5, 1e-7));
  EXPECT_TRUE(close(ops::log_softmax(x.to(DType::F32)), lsm, 1e-5, 1e-5));
  // Large logits stay finite.
  Tensor big = ops::affine(x, 1.0, 1000.0);
  EXPECT_TRUE(close(ops::softmax(big.to(DType::F32)), sm, 1e-4, 1e-6));
}

TEST(Ops, EmbeddingAndBadIds) {
  Tensor table = randt({11, 5}, 40);
  Tensor ids = ops::from_vector(std::vector<std::int32_t>{3, 0, 10, 3, 7, 1}, {2, 3});
  Tensor out = ops::embedding(ids, table);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 5}));
  auto tv = table.to_double_vector();
  std::vector<int> idv = {3, 0, 10, 3, 7, 1};
  V want;
  for (int id : idv)
    for (int c = 0; c < 5; ++c) want.push_back(tv[id * 5 + c]);
  EXPECT_TRUE(close(out, want));
  // Backward accumulates rows (+=).
  Tensor dt = ops::zeros({11, 5}, DType::F64);
  Tensor dout = randt({2, 3, 5}, 41);
  ops::embedding_backward_(dt, ids, dout);
  ops::embedding_backward_(dt, ids, dout);
  auto dv = dout.to_double_vector();
  V wd(55, 0.0);
  for (int t = 0; t < 6; ++t)
    for (int c = 0; c < 5; ++c) wd[idv[t] * 5 + c] += 2 * dv[t * 5 + c];
  EXPECT_TRUE(close(dt, wd));
  for (std::int32_t bad : {11, -1, 1 << 30}) {
    Tensor b = ops::from_vector(std::vector<std::int32_t>{1, bad}, {2});
    EXPECT_THROW(ops::embedding(b, table), Error) << bad;
  }
  EXPECT_THROW(ops::embedding(ids.to(DType::F32), table), Error);
}

TEST(Ops, RmsNormLayerNorm) {
  const int R = 6, C = 13;
  Tensor x = randt({C, R}, 50, DType::F64, -2, 2).transpose(0, 1);  // (R, C), strided
  Tensor w = randt({C}, 51), b = randt({C}, 52);
  auto xv = x.to_double_vector(), wv = w.to_double_vector(), bv = b.to_double_vector();
  const double eps = 1e-5;
  V y(R * C), rs(R), yl(R * C), mu(R), rl(R);
  for (int r = 0; r < R; ++r) {
    double ss = 0, m = 0;
    for (int c = 0; c < C; ++c) ss += xv[r * C + c] * xv[r * C + c], m += xv[r * C + c];
    m /= C;
    rs[r] = 1.0 / std::sqrt(ss / C + eps);
    double var = 0;
    for (int c = 0; c < C; ++c) var += (xv[r * C + c] - m) * (xv[r * C + c] - m);
    var /= C;
    mu[r] = m;
    rl[r] = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) {
      y[r * C + c] = xv[r * C + c] * rs[r] * wv[c];
      yl[r * C + c] = (xv[r * C + c] - m) * rl[r] * wv[c] + bv[c];
    }
  }
  auto [yr, rstd] = ops::rmsnorm(x, w, eps);
  EXPECT_TRUE(close(yr, y));
  EXPECT_TRUE(close(rstd, rs));
  auto [ylr, mean, rstd2] = ops::layernorm(x, w, b, eps);
  EXPECT_TRUE(close(ylr, yl, 1e-11, 1e-11));
  EXPECT_TRUE(close(mean, mu));
  EXPECT_TRUE(close(rstd2, rl, 1e-11, 1e-11));
  auto [y32, r32] = ops::rmsnorm(x.to(DType::F32), w.to(DType::F32), eps);
  EXPECT_EQ(r32.dtype(), DType::F32);
  EXPECT_TRUE(close(y32, y, 1e-5, 1e-5));
  EXPECT_THROW(ops::rmsnorm(x, randt({C + 1}, 1), eps), Error);
}

// add_rmsnorm is add() then rmsnorm(): against float64 sums here, and bit for bit against the two
// ops in every float dtype, on rows with vector tails and decode's one wide row.
TEST(Ops, AddRmsNormIsTheAddThenTheNorm) {
  const int R = 5, C = 19;
  const double eps = 1e-5;
  Tensor x = randt({C, R}, 60, DType::F64, -2, 2).transpose(0, 1);  // (R, C), strided
  Tensor r = randt({R, C}, 61, DType::F64, -2, 2), w = randt({C}, 62);
  auto xv = x.to_double_vector(), rv = r.to_double_vector(), wv = w.to_double_vector();
  V s(R * C), y(R * C), rs(R);
  for (int i = 0; i < R; ++i) {
    double ss = 0;
    for (int c = 0; c < C; ++c) {
      s[i * C + c] = xv[i * C + c] + rv[i * C + c];
      ss += s[i * C + c] * s[i * C + c];
    }
    rs[i] = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) y[i * C + c] = s[i * C + c] * rs[i] * wv[c];
  }
  auto [s64, y64, rstd64] = ops::add_rmsnorm(x, r, w, eps);
  EXPECT_TRUE(close(s64, s));
  EXPECT_TRUE(close(y64, y));
  EXPECT_TRUE(close(rstd64, rs));

  for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (const Shape& shape : {Shape{2, 3, 37}, Shape{1, 1, 4096}}) {
      const Tensor a = randt(shape, 63, dt, -3, 3), b = randt(shape, 64, dt, -3, 3);
      const Tensor g = randt({shape.back()}, 65, dt, 0.5, 1.5);
      auto [sf, yf, rf] = ops::add_rmsnorm(a, b, g, eps);
      const Tensor su = ops::add(a, b);
      auto [yu, ru] = ops::rmsnorm(su, g, eps);
      EXPECT_EQ(sf.dtype(), dt);
      EXPECT_EQ(yf.shape(), shape);
      EXPECT_EQ(rf.dtype(), ru.dtype());
      EXPECT_EQ(sf.to_double_vector(), su.to_double_vector()) << dtype_name(dt);
      EXPECT_EQ(yf.to_double_vector(), yu.to_double_vector()) << dtype_name(dt);
      EXPECT_EQ(rf.to_double_vector(), ru.to_double_vector()) << dtype_name(dt);
    }
  }

  // Both backends have a kernel: the meta device, simulating each, gives the shapes.
  for (DeviceType simulated : {DeviceType::CPU, DeviceType::CUDA}) {
    MetaSimulatesScope scope(simulated);
    const Tensor m = ops::zeros({2, 7, 64}, DType::BF16, Device::meta());
    auto [sm, ym, rm] = ops::add_rmsnorm(m, m, ops::zeros({64}, DType::BF16, Device::meta()), eps);
    EXPECT_EQ(sm.shape(), (Shape{2, 7, 64}));
    EXPECT_EQ(ym.dtype(), DType::BF16);
    EXPECT_EQ(rm.shape(), (Shape{14}));
    EXPECT_EQ(rm.dtype(), DType::F32);
  }

  test::expect_error(
      [&] {
        ops::add_rmsnorm(x, randt({R, C + 1}, 66), w, eps);
      },
      "residual (5, 20) f64 does not match input (5, 19) f64", "[add_rmsnorm]");
  test::expect_error([&] { ops::add_rmsnorm(x, r.to(DType::F32), w, eps); },
                     "residual (5, 19) f32 does not match input (5, 19) f64", "[add_rmsnorm]");
  test::expect_error([&] { ops::add_rmsnorm(x, r, randt({C + 1}, 67), eps); },
                     "input (5, 19) does not match weight (20,)", "[add_rmsnorm]");
}

// x: (B, T, H, D) logical values; reference rotation with angles in double.
V ref_rope(const V& x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, double theta,
           ops::RopeStyle style, std::int64_t off) {
  V y(x.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        std::int64_t base = ((b * T + t) * H + h) * D;
        for (std::int64_t i = 0; i < D / 2; ++i) {
          double ang = static_cast<double>(off + t) * std::pow(theta, -2.0 * i / D);
          std::int64_t i0 = style == ops::RopeStyle::Interleaved ? 2 * i : i;
          std::int64_t i1 = style == ops::RopeStyle::Interleaved ? 2 * i + 1 : i + D / 2;
          double a = x[base + i0], c = x[base + i1];
          y[base + i0] = a * std::cos(ang) - c * std::sin(ang);
          y[base + i1] = a * std::sin(ang) + c * std::cos(ang);
        }
      }
  return y;
}

TEST(Ops, RopeBothStyles) {
  const std::int64_t B = 2, T = 5, H = 3, D = 8;
  auto [cos, sin] = ops::rope_tables(16, D, 10000.0, DType::F64);
  EXPECT_EQ(cos.shape(), (Shape{16, D / 2}));
  auto [cos32, sin32] = ops::rope_tables(16, D, 10000.0, DType::BF16);
  EXPECT_EQ(cos32.dtype(), DType::F32);                // tables in the compute dtype
  Tensor x = randt({B, H, T, D}, 60).transpose(1, 2);  // (B, T, H, D), strided
  for (auto style : {ops::RopeStyle::Interleaved, ops::RopeStyle::RotateHalf})
    for (std::int64_t off : {0, 3}) {
      V want = ref_rope(x.to_double_vector(), B, T, H, D, 10000.0, style, off);
      Tensor y = ops::rope(x, cos, sin, style, off);
      EXPECT_TRUE(close(y, want, 1e-12, 1e-12)) << static_cast<int>(style) << off;
      // Backward is the inverse rotation.
      Tensor back = ops::rope(y, cos, sin, style, off, true);
      EXPECT_TRUE(close(back, x.to_double_vector(), 1e-12, 1e-12));
      Tensor yb = ops::rope(x.to(DType::BF16), cos32, sin32, style, off);
      EXPECT_EQ(yb.dtype(), DType::BF16);
      EXPECT_TRUE(close(yb, want, 1.6e-2, 1.6e-2));
    }
  EXPECT_THROW(ops::rope(x, cos, sin, ops::RopeStyle::Interleaved, 12), Error);
}

TEST(Ops, Activations) {
  Tensor x = randt({7, 5}, 70, DType::F64, -4, 4).transpose(0, 1);
  Tensor u = randt({5, 7}, 71);
  auto xv = x.to_double_vector(), uv = u.to_double_vector();
  V si, ge, sw;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    double v = xv[i];
    si.push_back(v * sigmoid(v));
    double c = std::sqrt(2.0 / M_PI);
    ge.push_back(0.5 * v * (1 + std::tanh(c * (v + 0.044715 * v * v * v))));
    sw.push_back(v * sigmoid(v) * uv[i]);
  }
  EXPECT_TRUE(close(ops::silu(x), si, 1e-12, 1e-12));
  EXPECT_TRUE(close(ops::gelu_tanh(x), ge, 1e-12, 1e-12));
  EXPECT_TRUE(close(ops::swiglu(x, u), sw, 1e-12, 1e-12));
  EXPECT_TRUE(close(ops::silu(x.to(DType::F32)), si, 1e-5, 1e-6));
  EXPECT_TRUE(close(ops::gelu_tanh(x.to(DType::F32)), ge, 1e-5, 1e-6));
  EXPECT_TRUE(close(ops::swiglu(x.to(DType::F32), u.to(DType::F32)), sw, 1e-5, 1e-6));
  EXPECT_THROW(ops::swiglu(x, randt({5, 6}, 1)), Error);
}

// Causal GQA attention reference. q: (B, Tq, Hq, D), k/v: (B, Tk, Hkv, D) logical values.
void ref_attention(const V& q, const V& k, const V& v, std::int64_t B, std::int64_t Tq,
                   std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D, double scale,
                   std::int64_t off, V& out, V& lse) {
  out.assign(B * Tq * Hq * D, 0.0);
  lse.assign(B * Hq * Tq, 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      std::int64_t hk = h / (Hq / Hkv);
      for (std::int64_t i = 0; i < Tq; ++i) {
        std::int64_t n = off + i + 1;
        V s(n);
        double mx = -1e300;
        for (std::int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (std::int64_t c = 0; c < D; ++c)
            d += q[((b * Tq + i) * Hq + h) * D + c] * k[((b * Tk + j) * Hkv + hk) * D + c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double x : s) z += std::exp(x - mx);
        lse[(b * Hq + h) * Tq + i] = mx + std::log(z);
        for (std::int64_t j = 0; j < n; ++j) {
          double p = std::exp(s[j] - mx) / z;
          for (std::int64_t c = 0; c < D; ++c)
            out[((b * Tq + i) * Hq + h) * D + c] += p * v[((b * Tk + j) * Hkv + hk) * D + c];
        }
      }
    }
}

TEST(Ops, AttentionGqaOffsetAndCacheView) {
  const std::int64_t B = 2, Hq = 4, Hkv = 2, D = 6;
  const double scale = 1.0 / std::sqrt(6.0);
  // Training shape: Tq == Tk, offset 0.
  {
    const std::int64_t T = 7;
    Tensor q = randt({B, T, Hq, D}, 80), k = randt({B, T, Hkv, D}, 81),
           v = randt({B, T, Hkv, D}, 82);
    V out, lse;
    ref_attention(q.to_double_vector(), k.to_double_vector(), v.to_double_vector(), B, T, T, Hq,
                  Hkv, D, scale, 0, out, lse);
    auto [o, l] = ops::attention(q, k, v, scale, 0);
    EXPECT_TRUE(close(o, out, 1e-11, 1e-11));
    EXPECT_TRUE(close(l, lse, 1e-11, 1e-11));
    auto [o32, l32] =
        ops::attention(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), scale, 0);
    EXPECT_TRUE(close(o32, out, 1e-5, 1e-5));
    auto [ob, lb] =
        ops::attention(q.to(DType::BF16), k.to(DType::BF16), v.to(DType::BF16), scale, 0);
    EXPECT_EQ(ob.dtype(), DType::BF16);
    EXPECT_EQ(lb.dtype(), DType::F32);
    EXPECT_TRUE(close(ob, out, 3e-2, 3e-2));
  }
  // Decode-like: 3 queries at positions 4..6 against a narrowed KV cache of capacity 10.
  {
    const std::int64_t Tq = 3, Tk = 7, Tmax = 10, off = 4;
    Tensor q = randt({B, Tq, Hq, D}, 83);
    Tensor kc = randt({B, Tmax, Hkv, D}, 84), vc = randt({B, Tmax, Hkv, D}, 85);
    Tensor k = kc.narrow(1, 0, Tk), v = vc.narrow(1, 0, Tk);
    EXPECT_FALSE(k.is_contiguous());
    V out, lse;
    ref_attention(q.to_double_vector(), k.to_double_vector(), v.to_double_vector(), B, Tq, Tk, Hq,
                  Hkv, D, scale, off, out, lse);
    auto [o, l] = ops::attention(q, k, v, scale, off);
    EXPECT_EQ(o.shape(), q.shape());
    EXPECT_TRUE(close(o, out, 1e-11, 1e-11));
    EXPECT_TRUE(close(l, lse, 1e-11, 1e-11));
    // A permuted (non-dense) k is copied, with the same result.
    Tensor kp = randt({B, Hkv, Tk, D}, 86).transpose(1, 2);
    ref_attention(q.to_double_vector(), kp.to_double_vector(), v.to_double_vector(), B, Tq, Tk, Hq,
                  Hkv, D, scale, off, out, lse);
    Tensor vp = v.contiguous();
    EXPECT_THROW(ops::attention(q, k, vp, scale, off), Error);  // batch strides differ
    auto [o2, l2] = ops::attention(q, kp, kp, scale, off);
    ref_attention(q.to_double_vector(), kp.to_double_vector(), kp.to_double_vector(), B, Tq, Tk, Hq,
                  Hkv, D, scale, off, out, lse);
    EXPECT_TRUE(close(o2, out, 1e-11, 1e-11));
    EXPECT_THROW(ops::attention(q, k, v, scale, 5), Error);  // needs keys up to 8
    EXPECT_THROW(ops::attention(q, randt({B, Tk, 3, D}, 1), randt({B, Tk, 3, D}, 2), scale, off),
                 Error);
  }
}

TEST(Ops, CrossEntropyIgnoreIndex) {
  const int N = 7, Vc = 11;
  Tensor logits = randt({Vc, N}, 90, DType::F64, -3, 3).transpose(0, 1);  // strided
  std::vector<std::int32_t> tg = {3, -100, 0, 10, -100, 5, 5};
  Tensor targets = ops::from_vector(tg, {N});
  auto lv = logits.to_double_vector();
  V loss(N), lse(N);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int c = 0; c < Vc; ++c) mx = std::max(mx, lv[n * Vc + c]);
    for (int c = 0; c < Vc; ++c) z += std::exp(lv[n * Vc + c] - mx);
    lse[n] = mx + std::log(z);
    loss[n] = tg[n] == -100 ? 0.0 : lse[n] - lv[n * Vc + tg[n]];
  }
  auto [l, s] = ops::cross_entropy(logits, targets, -100);
  EXPECT_TRUE(close(l, loss, 1e-12, 1e-12));
  EXPECT_TRUE(close(s, lse, 1e-12, 1e-12));
  Tensor dloss = randt({N}, 91);
  auto dl = dloss.to_double_vector();
  Tensor d = ops::cross_entropy_backward(logits, s, targets, dloss, -100);
  V wd(N * Vc, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < Vc; ++c)
      if (tg[n] != -100)
        wd[n * Vc + c] = dl[n] * (std::exp(lv[n * Vc + c] - lse[n]) - (c == tg[n]));
  EXPECT_TRUE(close(d, wd, 1e-12, 1e-12));
  auto [l32, s32] = ops::cross_entropy(logits.to(DType::BF16), targets, -100);
  EXPECT_EQ(l32.dtype(), DType::F32);
  Tensor bad = ops::from_vector(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 11}, {N});
  EXPECT_THROW(ops::cross_entropy(logits, bad, -100), Error);
  EXPECT_THROW(ops::cross_entropy(logits, targets.narrow(0, 0, 5), -100), Error);
}

TEST(Ops, DropoutMaskStatistics) {
  const std::int64_t n = 40000;
  const double p = 0.3;
  Tensor x = randt({n}, 100, DType::F32, 0.5, 1.5);
  Generator gen(123, 7);
  auto [y, mask] = ops::dropout(x, p, gen);
  EXPECT_EQ(mask.dtype(), DType::Bool);
  EXPECT_GT(gen.offset, 7u);
  auto xv = x.to_double_vector(), yv = y.to_double_vector(), mv = mask.to_double_vector();
  double kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    kept += mv[i];
    double want = mv[i] != 0 ? xv[i] / (1 - p) : 0.0;
    ASSERT_NEAR(yv[i], want, 1e-6 * std::abs(want)) << i;
  }
  // Binomial(n, 0.7): std of the fraction ~0.0023; allow 5 sigma.
  EXPECT_NEAR(kept / n, 1 - p, 0.012);
  // Same generator state, same mask; the next draw differs.
  Generator again(123, 7);
  auto [y2, m2] = ops::dropout(x, p, again);
  EXPECT_EQ(m2.to_double_vector(), mv);
  auto [y3, m3] = ops::dropout(x, p, gen);
  EXPECT_NE(m3.to_double_vector(), mv);
  // Backward: dy / (1 - p) where kept.
  Tensor dy = randt({n}, 101, DType::F32);
  auto dv = dy.to_double_vector();
  auto dx = ops::dropout_backward(dy, mask, p).to_double_vector();
  for (std::int64_t i = 0; i < n; i += 97)
    EXPECT_NEAR(dx[i], mv[i] != 0 ? dv[i] / (1 - p) : 0.0, 1e-6);
  EXPECT_THROW(ops::dropout(x, 1.0, gen), Error);
}

TEST(Ops, RandnStatisticsAndReproducibility) {
  const std::int64_t n = 50000;
  Generator g(42, 1000);
  Tensor a = ops::randn({n}, g);
  EXPECT_EQ(g.offset, 1000u + n);
  auto v = a.to_double_vector();
  double m = 0, s2 = 0;
  for (double x : v) m += x;
  m /= n;
  for (double x : v) s2 += (x - m) * (x - m);
  double sd = std::sqrt(s2 / (n - 1));
  EXPECT_NEAR(m, 0.0, 0.03);   // ~7 sigma of the mean
  EXPECT_NEAR(sd, 1.0, 0.03);  // ~9 sigma of the std
  // Same (seed, offset): same numbers, in every floating dtype (drawn in f32, then converted).
  Generator g2(42, 1000);
  EXPECT_EQ(ops::randn({n}, g2).to_double_vector(), v);
  Generator g3(42, 1000);
  Tensor b16 = ops::randn({n}, g3, 0.0, 1.0, DType::BF16);
  auto bv = b16.to_double_vector();
  for (std::int64_t i = 0; i < n; i += 101) EXPECT_NEAR(bv[i], v[i], 8e-3 * std::abs(v[i]));
  // Other seeds or offsets differ; mean/std parameters apply.
  Generator g4(43, 1000);
  EXPECT_NE(ops::randn({16}, g4).to_double_vector(), V(v.begin(), v.begin() + 16));
  Generator g5(42, 1000);
  auto sh = ops::randn({16}, g5, 3.0, 0.5, DType::F64).to_double_vector();
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(sh[i], 3.0 + 0.5 * v[i], 1e-6);
  Generator g6(9);
  auto u = ops::rand_uniform({n}, g6, -2.0, 5.0).to_double_vector();
  double um = 0;
  for (double x : u) {
    ASSERT_GE(x, -2.0);
    ASSERT_LT(x, 5.0);
    um += x;
  }
  EXPECT_NEAR(um / n, 1.5, 0.05);
  EXPECT_THROW(ops::randn({4}, g6, 0, 1, DType::I32), Error);
}

TEST(Ops, Bf16ComputesInF32) {
  // bf16 inputs with exactly representable values; outputs bf16, equal to the f32 result
  // rounded to bf16.
  Tensor a = randt({4, 6}, 110).to(DType::BF16), b = randt({6, 5}, 111).to(DType::BF16);
  Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::BF16);
  Tensor c32 = ops::matmul(a.to(DType::F32), b.to(DType::F32));
  EXPECT_EQ(c.to_double_vector(), c32.to(DType::BF16).to_double_vector());
  Tensor s = ops::add(a, a);
  EXPECT_EQ(s.dtype(), DType::BF16);
  EXPECT_EQ(s.to_double_vector(), ops::affine(a.to(DType::F32), 2.0).to_double_vector());
  Tensor sm = ops::softmax(a);
  EXPECT_EQ(sm.dtype(), DType::BF16);
  EXPECT_EQ(sm.to_double_vector(),
            ops::softmax(a.to(DType::F32)).to(DType::BF16).to_double_vector());
  Tensor w = ops::ones({6}, DType::BF16);
  auto [y, rstd] = ops::rmsnorm(a, w, 1e-5);
  EXPECT_EQ(y.dtype(), DType::BF16);
  EXPECT_EQ(rstd.dtype(), DType::F32);
  auto [y32, r32] = ops::rmsnorm(a.to(DType::F32), w.to(DType::F32), 1e-5);
  EXPECT_EQ(y.to_double_vector(), y32.to(DType::BF16).to_double_vector());
  EXPECT_EQ(ops::sum(a, 1).dtype(), DType::BF16);
  EXPECT_EQ(ops::silu(a.to(DType::F16)).dtype(), DType::F16);
  EXPECT_EQ(ops::linear(a, b.transpose(0, 1), Tensor()).dtype(), DType::BF16);
}

}  // namespace
}  // namespace kiln
