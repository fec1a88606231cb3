// Fused cross-entropy against float64 log-softmax + NLL; ignore_index rows; out-of-range targets
// throw before anything is written; in-place backward; finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/cross_entropy.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
KILN_OP_TESTED(Op::CrossEntropy);

namespace {
using namespace kiln::test;

constexpr int32_t kIgnore = -100;

template <typename T>
void check_ce(double tol) {
  for (int64_t N : {int64_t(1), int64_t(7), int64_t(65)})
    for (int64_t V : {int64_t(1), int64_t(33), int64_t(1000), int64_t(32000)}) {
      if (N * V > 400000) continue;
      auto logits = random_normal_vec<T>(N * V, N * 7 + V, 0.0, 4.0);
      auto targets = random_int_vec<int32_t>(N, N + V, 0, V);
      if (N > 1) targets[1] = kIgnore;
      auto dloss = random_uniform_vec<T>(N, 3 * N + V, 0.1, 1.0);
      std::vector<T> loss(N, T(-7)), lse(N);
      cpu::cross_entropy_forward<T>(N, V, logits.data(), targets.data(), kIgnore, loss.data(),
                                    lse.data());
      const auto ls = ref_log_softmax(N, V, to_f64(logits));
      std::vector<double> loss_r(N), lse_r(N), dl_r(N * V);
      for (int64_t n = 0; n < N; ++n) {
        lse_r[n] = double(logits[n * V]) - ls[n * V];
        const bool ign = targets[n] == kIgnore;
        loss_r[n] = ign ? 0.0 : -ls[n * V + targets[n]];
        for (int64_t v = 0; v < V; ++v)
          dl_r[n * V + v] =
              ign ? 0.0 : double(dloss[n]) * (std::exp(ls[n * V + v]) - (v == targets[n]));
      }
      EXPECT_TRUE(all_close(loss, loss_r, tol, tol)) << N << "x" << V;
      EXPECT_TRUE(all_close(lse, lse_r, tol, tol)) << N << "x" << V;
      std::vector<T> dlogits(N * V, T(99));
      cpu::cross_entropy_backward<T>(N, V, logits.data(), lse.data(), targets.data(), kIgnore,
                                     dloss.data(), dlogits.data());
      EXPECT_TRUE(all_close(dlogits, dl_r, tol, tol)) << N << "x" << V;
      // In place: the gradient overwrites the logits.
      std::vector<T> inplace = logits;
      cpu::cross_entropy_backward<T>(N, V, inplace.data(), lse.data(), targets.data(), kIgnore,
                                     dloss.data(), inplace.data());
      EXPECT_EQ(inplace, dlogits);
    }
}

TEST(CrossEntropy, MatchesReference) {
  check_ce<float>(2e-6);
  check_ce<double>(1e-12);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  const int64_t N = 2, V = 5;
  std::vector<float> logits = {1000.f, -1000.f, 0.f, 999.f, 3.f, -50.f, -50.f, -50.f, -50.f, -49.f};
  std::vector<int32_t> targets = {3, 0};
  std::vector<float> loss(N), lse(N);
  cpu::cross_entropy_forward<float>(N, V, logits.data(), targets.data(), kIgnore, loss.data(),
                                    lse.data());
  EXPECT_NEAR(loss[0], 1.0 + std::log1p(std::exp(-1.0)), 1e-5);
  const double l1 = -49.0 + std::log(4 * std::exp(-1.0) + 1.0);
  EXPECT_NEAR(lse[1], l1, 1e-5);
  EXPECT_NEAR(loss[1], l1 + 50.0, 1e-5);
}

TEST(CrossEntropy, FiniteDifferencesDouble) {
  const int64_t N = 5, V = 13;
  auto logits = random_normal_vec<double>(N * V, 1);
  std::vector<int32_t> targets = {0, 12, kIgnore, 5, 5};
  const auto dloss = random_uniform_vec<double>(N, 2, 0.5, 1.5);
  std::vector<double> loss(N), lse(N), dlogits(N * V), lp(N), lm(N);
  cpu::cross_entropy_forward<double>(N, V, logits.data(), targets.data(), kIgnore, loss.data(),
                                     lse.data());
  cpu::cross_entropy_backward<double>(N, V, logits.data(), lse.data(), targets.data(), kIgnore,
                                      dloss.data(), dlogits.data());
  const double h = 1e-6;
  std::vector<double> g(N * V);
  for (int64_t i = 0; i < N * V; ++i) {
    const double x0 = logits[i];
    logits[i] = x0 + h;
    cpu::cross_entropy_forward<double>(N, V, logits.data(), targets.data(), kIgnore, lp.data(),
                                       lse.data());
    logits[i] = x0 - h;
    cpu::cross_entropy_forward<double>(N, V, logits.data(), targets.data(), kIgnore, lm.data(),
                                       lse.data());
    logits[i] = x0;
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += dloss[n] * (lp[n] - lm[n]);
    g[i] = s / (2 * h);
  }
  EXPECT_TRUE(all_close(dlogits, g, 1e-8, 1e-6));
}

TEST(CrossEntropy, OutOfRangeTargetsThrow) {
  const int64_t N = 3, V = 10;
  const auto logits = random_normal_vec<float>(N * V, 1);
  std::vector<float> loss(N, 5.f), lse(N, 5.f), dl(N * V, 5.f), dloss(N, 1.f);
  for (int32_t bad : {10, -1, 1 << 30, kIgnore + 1}) {
    std::vector<int32_t> targets = {1, bad, 2};
    try {
      cpu::cross_entropy_forward<float>(N, V, logits.data(), targets.data(), kIgnore, loss.data(),
                                        lse.data());
      ADD_FAILURE() << "no throw for target " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[cross_entropy] target " + std::to_string(bad) +
                                           " out of range [0, 10)"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(cpu::cross_entropy_backward<float>(N, V, logits.data(), lse.data(),
                                                    targets.data(), kIgnore, dloss.data(),
                                                    dl.data()),
                 Error);
  }
  // Nothing was written.
  for (float v : loss) EXPECT_EQ(v, 5.f);
  for (float v : dl) EXPECT_EQ(v, 5.f);
  // ignore_index itself is fine even though it is out of range.
  std::vector<int32_t> targets = {kIgnore, kIgnore, kIgnore};
  cpu::cross_entropy_forward<float>(N, V, logits.data(), targets.data(), kIgnore, loss.data(),
                                    lse.data());
  for (float v : loss) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace kiln
