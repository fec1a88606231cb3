// Dropout: the mask follows the Philox stream contract element by element, outputs match a
// float64 reference, the kept fraction is about 1 - p, offsets continue a stream, results do not
// depend on the thread count, and backward matches central differences.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/dropout.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
KILN_OP_TESTED(Op::Dropout);

namespace {
using namespace kiln::test;

template <typename T>
void check_dropout(double tol) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(33), int64_t(129), int64_t(50001)})
    for (float p : {0.1f, 0.5f, 0.9f}) {
      const uint64_t seed = 0x1234567890abcdefull + n, offset = 77;
      const auto x = random_normal_vec<T>(n, n);
      std::vector<T> y(n, T(9));
      std::vector<uint8_t> mask(n, 7);
      cpu::dropout_forward<T>(n, p, seed, offset, x.data(), y.data(), mask.data());
      std::vector<double> yr(n);
      const double scale = double(1.0f / (1.0f - p));
      for (int64_t i = 0; i < n; ++i) {
        const bool keep = philox_uniform_at(seed, offset, uint64_t(i)) >= p;
        ASSERT_EQ(mask[i], keep ? 1 : 0) << "i=" << i;
        yr[i] = keep ? double(x[i]) * scale : 0.0;
      }
      EXPECT_TRUE(all_close(y, yr, tol, tol));
      // backward
      const auto dy = random_normal_vec<T>(n, n + 1);
      std::vector<T> dx(n, T(9));
      cpu::dropout_backward<T>(n, p, mask.data(), dy.data(), dx.data());
      std::vector<double> dxr(n);
      for (int64_t i = 0; i < n; ++i) dxr[i] = mask[i] ? double(dy[i]) * scale : 0.0;
      EXPECT_TRUE(all_close(dx, dxr, tol, tol));
      // in place
      std::vector<T> inplace = x;
      std::vector<uint8_t> mask2(n);
      cpu::dropout_forward<T>(n, p, seed, offset, inplace.data(), inplace.data(), mask2.data());
      EXPECT_EQ(inplace, y);
      if (n > 50000) {
        int64_t kept = 0;
        for (auto m : mask) kept += m;
        const double sigma = std::sqrt(n * p * (1 - p));
        EXPECT_NEAR(double(kept), n * (1.0 - p), 5 * sigma) << "p=" << p;
      }
    }
}

TEST(Dropout, MatchesPhiloxContract) {
  check_dropout<float>(1e-6);
  check_dropout<double>(1e-14);
}

TEST(Dropout, OffsetContinuesStreamAndThreadsDoNotMatter) {
  const int64_t n = 40000;
  const auto x = random_normal_vec<float>(n, 1);
  std::vector<float> y(n), y1(n - 8), y2(n);
  std::vector<uint8_t> m(n), m1(n - 8), m2(n);
  cpu::dropout_forward<float>(n, 0.3f, 42, 100, x.data(), y.data(), m.data());
  // Starting 2 counters later is the same stream shifted by 8 elements.
  cpu::dropout_forward<float>(n - 8, 0.3f, 42, 102, x.data() + 8, y1.data(), m1.data());
  EXPECT_EQ(std::vector<uint8_t>(m.begin() + 8, m.end()), m1);
  EXPECT_EQ(std::vector<float>(y.begin() + 8, y.end()), y1);
  const int nt = omp_get_max_threads();
  omp_set_num_threads(nt == 1 ? 3 : 1);
  cpu::dropout_forward<float>(n, 0.3f, 42, 100, x.data(), y2.data(), m2.data());
  omp_set_num_threads(nt);
  EXPECT_EQ(m, m2);
  EXPECT_EQ(y, y2);
  // A different seed gives a different mask.
  cpu::dropout_forward<float>(n, 0.3f, 43, 100, x.data(), y2.data(), m2.data());
  EXPECT_NE(m, m2);
}

TEST(Dropout, EdgeProbabilities) {
  const int64_t n = 100;
  const auto x = random_normal_vec<float>(n, 1);
  std::vector<float> y(n), dx(n);
  std::vector<uint8_t> m(n, 5);
  cpu::dropout_forward<float>(n, 0.0f, 1, 0, x.data(), y.data(), m.data());
  EXPECT_EQ(y, x);
  for (auto v : m) EXPECT_EQ(v, 1);
  cpu::dropout_forward<float>(n, 0.0f, 1, 0, x.data(), y.data(), nullptr);  // mask optional
  cpu::dropout_backward<float>(n, 0.0f, nullptr, x.data(), dx.data());
  EXPECT_EQ(dx, x);
  cpu::dropout_forward<float>(n, 1.0f, 1, 0, x.data(), y.data(), m.data());
  for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(y[i] == 0.0f && m[i] == 0);
  cpu::dropout_backward<float>(n, 1.0f, m.data(), x.data(), dx.data());
  for (auto v : dx) EXPECT_EQ(v, 0.0f);
  EXPECT_THROW(cpu::dropout_forward<float>(n, 1.5f, 1, 0, x.data(), y.data(), m.data()), Error);
  EXPECT_THROW(cpu::dropout_forward<float>(n, -0.1f, 1, 0, x.data(), y.data(), m.data()), Error);
  EXPECT_THROW(cpu::dropout_forward<float>(n, std::nanf(""), 1, 0, x.data(), y.data(), m.data()),
               Error);
  EXPECT_THROW(cpu::dropout_forward<float>(n, 0.5f, 1, 0, x.data(), y.data(), nullptr), Error);
}

TEST(Dropout, BackwardFiniteDifferences) {
  const int64_t n = 37;
  auto x = random_normal_vec<double>(n, 1);
  const auto dy = random_normal_vec<double>(n, 2);
  std::vector<double> y(n), yp(n), ym(n), dx(n), g(n);
  std::vector<uint8_t> m(n);
  cpu::dropout_forward<double>(n, 0.4f, 9, 3, x.data(), y.data(), m.data());
  cpu::dropout_backward<double>(n, 0.4f, m.data(), dy.data(), dx.data());
  const double h = 1e-6;
  for (int64_t i = 0; i < n; ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    cpu::dropout_forward<double>(n, 0.4f, 9, 3, x.data(), yp.data(), m.data());
    x[i] = x0 - h;
    cpu::dropout_forward<double>(n, 0.4f, 9, 3, x.data(), ym.data(), m.data());
    x[i] = x0;
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += dy[j] * (yp[j] - ym[j]);
    g[i] = s / (2 * h);
  }
  EXPECT_TRUE(all_close(dx, g, 1e-8, 1e-6));
}

}  // namespace
}  // namespace kiln
