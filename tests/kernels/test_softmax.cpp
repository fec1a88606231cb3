// Tests for kernels/cpu/softmax.h against float64 references (forward and backward).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/softmax.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

KILN_OP_TESTED(Op::Softmax);

template <typename T>
void check_softmax(int64_t rows, int64_t cols, double scale, uint64_t seed) {
  auto x = test::random_normal_vec<T>(rows * cols, seed, 0, scale);
  auto dy = test::random_normal_vec<T>(rows * cols, seed + 1);
  const auto xd = test::to_f64(x);
  const auto y_ref = test::ref_softmax(rows, cols, xd);
  const auto ly_ref = test::ref_log_softmax(rows, cols, xd);
  std::vector<double> dx_ref(rows * cols), ldx_ref(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0, sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      dot += double(dy[r * cols + c]) * y_ref[r * cols + c];
      sum += dy[r * cols + c];
    }
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      dx_ref[i] = y_ref[i] * (dy[i] - dot);
      ldx_ref[i] = dy[i] - y_ref[i] * sum;
    }
  }
  const bool f = std::is_same_v<T, float>;
  std::vector<T> y(rows * cols), ly(rows * cols), dx(rows * cols), ldx(rows * cols);
  cpu::softmax_forward<T>(rows, cols, x.data(), y.data());
  EXPECT_TRUE(test::all_close(y, y_ref, f ? 1e-7 : 1e-15, f ? 1e-5 : 1e-13));
  cpu::log_softmax_forward<T>(rows, cols, x.data(), ly.data());
  EXPECT_TRUE(test::all_close(ly, ly_ref, f ? 2e-6 * scale : 1e-13, f ? 1e-6 : 1e-13));
  // Backward from the kernel's own forward output, as autograd would call it.
  cpu::softmax_backward<T>(rows, cols, y.data(), dy.data(), dx.data());
  EXPECT_TRUE(test::all_close(dx, dx_ref, f ? 1e-6 : 1e-14, f ? 1e-5 : 1e-12));
  cpu::log_softmax_backward<T>(rows, cols, ly.data(), dy.data(), ldx.data());
  EXPECT_TRUE(test::all_close(ldx, ldx_ref, f ? 1e-5 : 1e-12, f ? 1e-5 : 1e-12));
  // In place forward.
  cpu::softmax_forward<T>(rows, cols, x.data(), x.data());
  EXPECT_TRUE(test::all_close(x, y_ref, f ? 1e-7 : 1e-15, f ? 1e-5 : 1e-13));
}

TEST(Softmax, OddSizes) {
  uint64_t seed = 1;
  for (int64_t rows : {1, 7, 33})
    for (int64_t cols : {1, 7, 33, 129, 1000}) {
      check_softmax<float>(rows, cols, 1.0, seed += 2);
      check_softmax<double>(rows, cols, 1.0, seed += 2);
    }
  check_softmax<float>(600, 64, 1.0, 99);  // parallel rows
}

TEST(Softmax, LargeLogitsAreStable) {
  check_softmax<float>(5, 257, 50.0, 7);
  check_softmax<double>(5, 257, 300.0, 8);
  const std::vector<float> x = {1000.f, 1000.f, -1000.f};
  std::vector<float> y(3), ly(3);
  cpu::softmax_forward<float>(1, 3, x.data(), y.data());
  cpu::log_softmax_forward<float>(1, 3, x.data(), ly.data());
  EXPECT_FLOAT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[2], 0.f);
  EXPECT_FLOAT_EQ(ly[0], -std::log(2.f));
  EXPECT_FLOAT_EQ(ly[2], -2000.f - std::log(2.f));
}

TEST(Softmax, MaskedRowsWithMinusInfinity) {
  const std::vector<float> x = {0.f, -INFINITY, 1.f, -INFINITY};
  std::vector<float> y(4);
  cpu::softmax_forward<float>(1, 4, x.data(), y.data());
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[3], 0.f);
  EXPECT_NEAR(y[0], 1 / (1 + std::exp(1.0)), 1e-7);
}

}  // namespace
}  // namespace kiln
