// Tests for kernels/cpu/reduce.h against float64 references over (outer, dim, inner) views.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/reduce.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

KILN_OP_TESTED(Op::Reduce);

using cpu::ReduceOp;

template <typename T>
std::vector<double> ref_reduce(ReduceOp op, int64_t outer, int64_t dim, int64_t inner,
                               const std::vector<T>& x) {
  std::vector<double> out(outer * inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double acc = op == ReduceOp::Max ? -INFINITY : op == ReduceOp::Min ? INFINITY : 0.0;
      for (int64_t d = 0; d < dim; ++d) {
        const double v = x[(o * dim + d) * inner + i];
        if (op == ReduceOp::Max)
          acc = std::max(acc, v);
        else if (op == ReduceOp::Min)
          acc = std::min(acc, v);
        else
          acc += v;
      }
      out[o * inner + i] = op == ReduceOp::Mean ? acc / double(dim) : acc;
    }
  return out;
}

template <typename T>
void check_reduce(int64_t outer, int64_t dim, int64_t inner, uint64_t seed) {
  auto x = test::random_uniform_vec<T>(outer * dim * inner, seed, -1, 1);
  for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
    const auto ref = ref_reduce(op, outer, dim, inner, x);
    std::vector<T> out(outer * inner);
    cpu::reduce<T>(op, outer, dim, inner, x.data(), out.data());
    // Sums accumulate in double, so only the final rounding to T remains.
    const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-12;
    EXPECT_TRUE(test::all_close(out, ref, tol, tol))
        << "op " << int(op) << " (" << outer << ", " << dim << ", " << inner << ")";
  }
  std::vector<int64_t> am(outer * inner);
  cpu::argmax<T>(outer, dim, inner, x.data(), am.data());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      for (int64_t d = 1; d < dim; ++d)
        if (x[(o * dim + d) * inner + i] > x[(o * dim + best) * inner + i]) best = d;
      ASSERT_EQ(am[o * inner + i], best) << o << "," << i;
    }
}

TEST(Reduce, OddShapes) {
  uint64_t seed = 1;
  for (int64_t outer : {1, 7, 33})
    for (int64_t dim : {1, 7, 33, 129})
      for (int64_t inner : {1, 7, 33, 300}) {
        check_reduce<float>(outer, dim, inner, ++seed);
        check_reduce<double>(outer, dim, inner, ++seed);
      }
}

TEST(Reduce, LargeShapesUseParallelPaths) {
  check_reduce<float>(1, 100003, 1, 1);  // sum_all-like, chunked
  check_reduce<float>(1, 3000, 64, 2);   // bias gradient: split-dim path
  check_reduce<float>(2, 2049, 100, 3);  // split-dim, two outer rows, ragged tile
  check_reduce<float>(500, 129, 1, 4);   // row reductions
  check_reduce<double>(3, 1000, 77, 5);
}

TEST(Reduce, SumAllAndSumSquares) {
  for (int64_t n : {0, 1, 7, 33, 129, 100001}) {
    auto x = test::random_uniform_vec<float>(n, 10 + n);
    double s = 0, ss = 0;
    for (float v : x) s += v, ss += double(v) * v;
    float out = -1;
    cpu::sum_all<float>(n, x.data(), &out);
    EXPECT_NEAR(out, s, 1e-6 * (1 + std::abs(s)));
    EXPECT_NEAR(cpu::sum_squares<float>(n, x.data()), ss, 1e-12 * (1 + ss));
    auto xd = test::to_f64(x);
    double outd = -1;
    cpu::sum_all<double>(n, xd.data(), &outd);
    EXPECT_NEAR(outd, s, 1e-12 * (1 + std::abs(s)));
    EXPECT_NEAR(cpu::sum_squares<double>(n, xd.data()), ss, 1e-12 * (1 + ss));
  }
  // float accumulation would lose the small terms; double does not.
  std::vector<float> x(1 << 20, 1.0f);
  x[0] = 1e8f;
  float out = 0;
  cpu::sum_all<float>(int64_t(x.size()), x.data(), &out);
  EXPECT_EQ(out, float(1e8 + double(x.size() - 1)));
}

TEST(Reduce, NanAndEmpty) {
  const std::vector<float> x = {1.f, NAN, 3.f, 2.f};
  float out = 0;
  cpu::reduce<float>(ReduceOp::Max, 1, 4, 1, x.data(), &out);
  EXPECT_TRUE(std::isnan(out));
  cpu::reduce<float>(ReduceOp::Min, 1, 4, 1, x.data(), &out);
  EXPECT_TRUE(std::isnan(out));
  int64_t am = -1;
  cpu::argmax<float>(1, 4, 1, x.data(), &am);
  EXPECT_EQ(am, 1);
  std::vector<float> o2(3, -1.f);
  cpu::reduce<float>(ReduceOp::Sum, 1, 0, 3, x.data(), o2.data());
  for (float v : o2) EXPECT_EQ(v, 0.f);
  cpu::reduce<float>(ReduceOp::Mean, 1, 0, 3, x.data(), o2.data());
  for (float v : o2) EXPECT_TRUE(std::isnan(v));
  EXPECT_THROW(cpu::reduce<float>(ReduceOp::Max, 1, 0, 3, x.data(), o2.data()), Error);
  EXPECT_THROW(cpu::reduce<float>(ReduceOp::Sum, -1, 1, 1, x.data(), o2.data()), Error);
  EXPECT_THROW(cpu::argmax<float>(1, 0, 1, x.data(), &am), Error);
}

TEST(Reduce, ArgmaxFirstOfTies) {
  const std::vector<double> x = {1, 3, 3, 2, 3};
  int64_t am = -1;
  cpu::argmax<double>(1, 5, 1, x.data(), &am);
  EXPECT_EQ(am, 1);
}

}  // namespace
}  // namespace kiln
