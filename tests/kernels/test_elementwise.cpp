// Tests for kernels/cpu/elementwise.h against float64 references, with broadcasting.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/elementwise.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

KILN_OP_TESTED(Op::Binary);
KILN_OP_TESTED(Op::Unary);

using cpu::BinaryOp;
using cpu::UnaryOp;

double ref_binary(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::Add:
      return a + b;
    case BinaryOp::Sub:
      return a - b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      return a / b;
    case BinaryOp::Max:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case BinaryOp::Min:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
  }
  return NAN;
}

// Shapes of a and b, broadcast numpy-style to out (same ndim, size 1 dims broadcast).
struct Case {
  std::vector<int64_t> a, b;
};

std::vector<int64_t> contiguous_strides_bcast(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    st[d] = shape[d] == 1 ? 0 : s;
    s *= shape[d];
  }
  return st;
}

template <typename T>
void check_binary(BinaryOp op, const Case& c, uint64_t seed) {
  const int nd = int(c.a.size());
  std::vector<int64_t> out(nd);
  int64_t na = 1, nb = 1, n = 1;
  for (int d = 0; d < nd; ++d) {
    out[d] = c.a[d] == 1 ? c.b[d] : c.a[d];
    na *= c.a[d], nb *= c.b[d], n *= out[d];
  }
  auto a = test::random_uniform_vec<T>(na, seed, -2, 2);
  auto b = test::random_uniform_vec<T>(nb, seed + 1, 0.5, 2);  // away from 0 for Div
  const auto sa = contiguous_strides_bcast(c.a), sb = contiguous_strides_bcast(c.b);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, oa = 0, ob = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t k = rem % out[d];
      rem /= out[d];
      oa += k * sa[d], ob += k * sb[d];
    }
    ref[i] = ref_binary(op, a[oa], b[ob]);
  }
  std::vector<T> y(n);
  cpu::binary<T>(op, nd, out.data(), a.data(), sa.data(), b.data(), sb.data(), y.data());
  EXPECT_TRUE(test::all_close(y, ref, test::default_atol<T>(), test::default_rtol<T>()))
      << "op " << int(op);
}

TEST(Binary, BroadcastCases) {
  const std::vector<Case> cases = {
      {{1}, {1}},
      {{129}, {129}},  // same shape
      {{7, 33}, {7, 33}},
      {{7, 33}, {1, 1}},             // b scalar
      {{1, 1}, {7, 33}},             // a scalar
      {{12, 33}, {1, 33}},           // bias add
      {{12, 33}, {12, 1}},           // per-row scale
      {{1, 33}, {7, 1}},             // outer product broadcast
      {{3, 1, 5, 7}, {1, 4, 5, 1}},  // mixed
      {{2, 3, 4, 5, 6}, {2, 1, 4, 1, 6}},
      {{300, 129}, {300, 129}},  // parallel
      {{300, 129}, {1, 129}},
      {{40000}, {1}},
      {{5, 0}, {5, 1}},  // empty
  };
  uint64_t seed = 1;
  for (auto op :
       {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min})
    for (const auto& c : cases) {
      check_binary<float>(op, c, seed += 2);
      check_binary<double>(op, c, seed += 2);
    }
}

TEST(Binary, NonContiguousAndInPlace) {
  // a: a transposed (5, 7) view of a (7, 5) array; b: every other element of a row of 14.
  auto a = test::random_uniform_vec<float>(35, 1);
  auto b = test::random_uniform_vec<float>(14, 2);
  const int64_t shape[] = {5, 7}, sa[] = {1, 5}, sb[] = {0, 2};
  std::vector<float> y(35);
  cpu::binary<float>(BinaryOp::Mul, 2, shape, a.data(), sa, b.data(), sb, y.data());
  std::vector<double> ref(35);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j) ref[i * 7 + j] = double(a[j * 5 + i]) * b[2 * j];
  EXPECT_TRUE(test::all_close(y, ref, 1e-6, 1e-6));
  // In place: out == a.
  auto x = test::random_uniform_vec<float>(33, 3);
  const auto x0 = test::to_f64(x);
  const int64_t s1[] = {33}, st1[] = {1}, st0[] = {0};
  const float two = 2.f;
  cpu::binary<float>(BinaryOp::Add, 1, s1, x.data(), st1, &two, st0, x.data());
  for (int i = 0; i < 33; ++i) EXPECT_FLOAT_EQ(x[i], float(x0[i] + 2));
}

TEST(Binary, MaxMinPropagateNan) {
  const std::vector<float> a = {NAN, 1.f, 2.f}, b = {0.f, NAN, 1.f};
  const int64_t shape[] = {3}, st[] = {1};
  std::vector<float> y(3);
  for (auto op : {BinaryOp::Max, BinaryOp::Min}) {
    cpu::binary<float>(op, 1, shape, a.data(), st, b.data(), st, y.data());
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_TRUE(std::isnan(y[1]));
    EXPECT_EQ(y[2], op == BinaryOp::Max ? 2.f : 1.f);
  }
}

double ref_unary(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Exp:
      return std::exp(x);
    case UnaryOp::Log:
      return std::log(x);
    case UnaryOp::Sqrt:
      return std::sqrt(x);
    case UnaryOp::Rsqrt:
      return 1 / std::sqrt(x);
    case UnaryOp::Abs:
      return std::fabs(x);
    case UnaryOp::Square:
      return x * x;
    case UnaryOp::Reciprocal:
      return 1 / x;
    case UnaryOp::Tanh:
      return std::tanh(x);
    case UnaryOp::Sigmoid:
      return 1 / (1 + std::exp(-x));
  }
  return NAN;
}

TEST(Unary, AllOpsOddSizes) {
  uint64_t seed = 1;
  for (auto op :
       {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Abs,
        UnaryOp::Square, UnaryOp::Reciprocal, UnaryOp::Tanh, UnaryOp::Sigmoid}) {
    const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt ||
                          op == UnaryOp::Reciprocal;
    for (int64_t n : {1, 7, 33, 129, 70001}) {
      auto xf = test::random_uniform_vec<float>(n, seed++, positive ? 0.1 : -5, 5);
      auto xd = test::random_uniform_vec<double>(n, seed++, positive ? 0.1 : -5, 5);
      std::vector<double> rf(n), rd(n);
      for (int64_t i = 0; i < n; ++i) rf[i] = ref_unary(op, xf[i]), rd[i] = ref_unary(op, xd[i]);
      std::vector<float> yf(n);
      std::vector<double> yd(n);
      cpu::unary<float>(op, n, xf.data(), yf.data());
      cpu::unary<double>(op, n, xd.data(), yd.data());
      EXPECT_TRUE(test::all_close(yf, rf, 1e-6, 2e-6)) << "op " << int(op) << " n " << n;
      EXPECT_TRUE(test::all_close(yd, rd, 1e-14, 1e-14)) << "op " << int(op) << " n " << n;
      cpu::unary<float>(op, n, xf.data(), xf.data());  // in place
      EXPECT_TRUE(test::all_close(xf, rf, 1e-6, 2e-6)) << "in place, op " << int(op);
    }
  }
}

TEST(Unary, ScaleAddAxpyScalars) {
  for (int64_t n : {1, 7, 33, 129, 50001}) {
    auto x = test::random_uniform_vec<double>(n, 1 + n),
         y = test::random_uniform_vec<double>(n, 2 + n);
    std::vector<float> xf(x.begin(), x.end()), yf(y.begin(), y.end());
    std::vector<double> r_sa(n), r_ax(n), r_as(n), r_ms(n);
    for (int64_t i = 0; i < n; ++i) {
      r_sa[i] = 0.5 * double(xf[i]) - 3.0 * double(yf[i]);
      r_ax[i] = double(yf[i]) + 0.25 * double(xf[i]);
      r_as[i] = double(xf[i]) + 1.5;
      r_ms[i] = double(xf[i]) * -2.0;
    }
    std::vector<float> out(n);
    cpu::scale_add<float>(n, 0.5f, xf.data(), -3.f, yf.data(), out.data());
    EXPECT_TRUE(test::all_close(out, r_sa, 1e-6, 1e-6));
    cpu::add_scalar<float>(n, xf.data(), 1.5f, out.data());
    EXPECT_TRUE(test::all_close(out, r_as, 1e-6, 1e-6));
    cpu::mul_scalar<float>(n, xf.data(), -2.f, out.data());
    EXPECT_TRUE(test::all_close(out, r_ms, 1e-6, 1e-6));
    cpu::axpy<float>(n, 0.25f, xf.data(), yf.data());
    EXPECT_TRUE(test::all_close(yf, r_ax, 1e-6, 1e-6));
    std::vector<double> yd = y;
    cpu::axpy<double>(n, 0.25, x.data(), yd.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(yd[i], y[i] + 0.25 * x[i], 1e-15);
  }
}

TEST(Binary, RejectsBadArguments) {
  float x = 1, y = 0;
  const int64_t neg[] = {-2}, one[] = {1}, negst[] = {-1};
  EXPECT_THROW(cpu::binary<float>(BinaryOp::Add, 1, neg, &x, one, &x, one, &y), Error);
  EXPECT_THROW(cpu::binary<float>(BinaryOp::Add, 1, one, &x, negst, &x, one, &y), Error);
  EXPECT_THROW(cpu::unary<float>(UnaryOp::Exp, -1, &x, &y), Error);
}

}  // namespace
}  // namespace kiln
