// Shared helpers for the kernel tests (tests/kernels/*.cpp):
//  - KILN_OP_TESTED(Op::X): registers that this file tests op X; test_coverage.cpp checks
//    that every op in kOpList has at least one registration.
//  - random fills (deterministic, seeded), float64 copies and plain float64 references,
//  - max-abs / max-rel comparisons that report the worst index (gtest AssertionResult).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/op_list.h"

namespace kiln::test {

// Every CPU level from scalar up to the detected one: a kernel test runs at each of them.
inline std::vector<cpu::CpuIsa> supported_levels() {
  std::vector<cpu::CpuIsa> levels;
  for (int l = 0; l <= static_cast<int>(cpu::cpu_isa_detected()); ++l)
    levels.push_back(static_cast<cpu::CpuIsa>(l));
  return levels;
}

// ---- op test registry ---------------------------------------------------------------------------
// One set per test binary (function-local static, so registration order is safe).
inline std::set<Op>& tested_ops() {
  static std::set<Op> ops;
  return ops;
}
struct OpTestedRegistrar {
  explicit OpTestedRegistrar(Op op) { tested_ops().insert(op); }
};
#define KILN_TEST_CONCAT_INNER(a, b) a##b
#define KILN_TEST_CONCAT(a, b) KILN_TEST_CONCAT_INNER(a, b)
// Use at namespace scope in a test file: KILN_OP_TESTED(Op::Softmax);
#define KILN_OP_TESTED(op)                                                                        \
  [[maybe_unused]] static const ::kiln::test::OpTestedRegistrar KILN_TEST_CONCAT(kiln_op_tested_, \
                                                                                 __COUNTER__) {   \
    op                                                                                            \
  }

// Sizes worth trying in every kernel: 1, odd, just past powers of two.
inline const std::vector<int64_t> kOddSizes = {1, 7, 33, 129};

// ---- random data --------------------------------------------------------------------------------
// Uniform in [lo, hi), deterministic for a given seed.
template <typename T = float>
std::vector<T> random_uniform_vec(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// Normal(mean, std), deterministic for a given seed.
template <typename T = float>
std::vector<T> random_normal_vec(int64_t n, uint64_t seed, double mean = 0.0, double std = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(mean, std);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// Integers uniform in [lo, hi).
template <typename I = int32_t>
std::vector<I> random_int_vec(int64_t n, uint64_t seed, int64_t lo, int64_t hi) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<I> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<I>(dist(gen));
  return v;
}

template <typename T>
std::vector<double> to_f64(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// ---- float64 references -------------------------------------------------------------------------
// C(M,N) = A(M,K) @ B(K,N), all row-major contiguous, in float64.
inline std::vector<double> ref_matmul(int64_t M, int64_t N, int64_t K, const std::vector<double>& A,
                                      const std::vector<double>& B) {
  std::vector<double> C(static_cast<size_t>(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const double a = A[i * K + k];
      for (int64_t j = 0; j < N; ++j) C[i * N + j] += a * B[k * N + j];
    }
  return C;
}

// Row-wise softmax of x: (rows, cols), float64.
inline std::vector<double> ref_softmax(int64_t rows, int64_t cols, const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, x[r * cols + c]);
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - mx);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = std::exp(x[r * cols + c] - mx) / s;
  }
  return y;
}

// Row-wise log-softmax of x: (rows, cols), float64.
inline std::vector<double> ref_log_softmax(int64_t rows, int64_t cols,
                                           const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, x[r * cols + c]);
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - mx);
    const double lse = mx + std::log(s);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] - lse;
  }
  return y;
}

// ---- comparisons --------------------------------------------------------------------------------
// Default tolerances for comparing a T kernel against a float64 reference.
template <typename T>
constexpr double default_atol() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}
template <typename T>
constexpr double default_rtol() {
  return std::is_same_v<T, double> ? 1e-10 : 1e-5;
}

template <typename A, typename B>
double max_abs_diff(std::span<const A> a, std::span<const B> b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

// max |a-b| / max(|b|, floor): relative to the reference b.
template <typename A, typename B>
double max_rel_diff(std::span<const A> a, std::span<const B> b, double floor = 1e-30) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    m = std::max(m, d / std::max(std::abs(static_cast<double>(b[i])), floor));
  }
  return m;
}

// Passes when every |actual - ref| <= atol + rtol*|ref| (NaN in either fails unless both NaN).
// Usage: EXPECT_TRUE(all_close(std::span(out), std::span(ref), 1e-5, 1e-5));
template <typename A, typename B>
::testing::AssertionResult all_close(std::span<const A> actual, std::span<const B> ref, double atol,
                                     double rtol) {
  if (actual.size() != ref.size())
    return ::testing::AssertionFailure()
           << "size mismatch: " << actual.size() << " vs ref " << ref.size();
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = static_cast<double>(actual[i]), r = static_cast<double>(ref[i]);
    if (std::isnan(x) && std::isnan(r)) continue;
    const double d = std::abs(x - r), lim = atol + rtol * std::abs(r);
    if (!(d <= lim) && !(x == r)) {  // x == r covers matching infinities
      ++bad;
      const double excess = std::isnan(d) ? INFINITY : d - lim;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(17);
  os << bad << " of " << ref.size() << " elements differ (atol " << atol << ", rtol " << rtol
     << "); worst at [" << worst << "]: got " << static_cast<double>(actual[worst]) << ", ref "
     << static_cast<double>(ref[worst]);
  return ::testing::AssertionFailure() << os.str();
}

// Convenience overload for vectors.
template <typename A, typename B>
::testing::AssertionResult all_close(const std::vector<A>& actual, const std::vector<B>& ref,
                                     double atol, double rtol) {
  return all_close(std::span<const A>(actual), std::span<const B>(ref), atol, rtol);
}

}  // namespace kiln::test
