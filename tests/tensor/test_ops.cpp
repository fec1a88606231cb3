// The op front end (tensor/ops.h) against plain float64 references computed here, on odd sizes
// and non-contiguous inputs, in f64 (tight), f32 and bf16 (computed in f32, returned as bf16):
// elementwise, reductions, matmul and the front end's refusals. The nn ops are test_ops_nn.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tests/tensor/ops_reference.h"

namespace kiln {
namespace {

using V = ops_ref::V;
using ops_ref::close;
using ops_ref::flat;
using ops_ref::randt;
using ops_ref::unravel;

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
  const auto tables = ops::rope_tables(16, 8, 10000.0);  // not bound: clang 14 cannot capture that
  const Tensor &cos = std::get<0>(tables), &sin = std::get<1>(tables);
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

}  // namespace
}  // namespace kiln
