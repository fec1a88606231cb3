// Tests for kernels/cpu/gemv_bf16.h (gemv_bf16, and gemv_f16 on f16 weights) against a float64
// reference, at every ISA level this machine supports (ScopedCpuIsa), for bf16 and f32 x and y
// (f16 and f32 with f16 weights), with and without bias, odd sizes and padded row strides.
//
// Tolerance, per output element, with S = sum_k |x_k w_k| + |bias| (the f64 reference uses the
// exact bf16 values of w, and of x and bias when they are bf16):
//   f32 accumulation          (K + 2) * 2^-24 * S   (K rounded products and sums, the bias add)
//   x rounded to bf16         2^-8 * S         (only on AVX512-BF16, and only for f32 x: the
//                                               kernel feeds vdpbf16ps bf16 pairs; half an ulp
//                                               is 2^-9, doubled for the f32 sums around it)
//   y rounded to bf16         2^-8 * |ref|     (bf16 y: half an ulp of bf16 is 2^-9 relative)
//   y rounded to f16          2^-10 * |ref| + 2^-24  (half an ulp of f16 is 2^-11 relative;
//                                               below 2^-14 f16 is subnormal, spaced 2^-24)
// Padding columns of x and w hold NaN, so a read past K in any row shows up as NaN, and
// padding of y holds a sentinel that must survive.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/half.h"
#include "kernels/cpu/gemv_bf16.h"
#include "kernels/cpu/isa.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using test::supported_levels;

KILN_OP_TESTED(Op::Gemm);

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, f16>)
    return float_to_f16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16_to_float(v);
  else if constexpr (std::is_same_v<T, f16>)
    return f16_to_float(v);
  else
    return static_cast<double>(v);
}

template <typename X, typename Y, typename W = bf16>
::testing::AssertionResult check_gemv(cpu::CpuIsa level, int64_t M, int64_t N, int64_t K,
                                      bool with_bias, int64_t pad, uint64_t seed) {
  const int64_t ldx = K + pad, ldw = K + pad, ldy = N + pad;
  const double nan = std::nan("");
  auto xr = test::random_uniform_vec<double>(M * ldx, seed);
  auto wr = test::random_uniform_vec<double>(N * ldw, seed + 1);
  auto br = test::random_uniform_vec<double>(N, seed + 2);
  std::vector<X> x(xr.size());
  std::vector<W> w(wr.size());
  std::vector<Y> bias(br.size());
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = from_double<X>(static_cast<int64_t>(i) % ldx < K ? xr[i] : nan);
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = from_double<W>(static_cast<int64_t>(i) % ldw < K ? wr[i] : nan);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = from_double<Y>(br[i]);
  const Y sentinel = from_double<Y>(12345.0);
  std::vector<Y> y(static_cast<size_t>(M * ldy), sentinel);

  if constexpr (std::is_same_v<W, f16>)
    cpu::gemv_f16<X, Y>(M, N, K, x.data(), ldx, w.data(), ldw, with_bias ? bias.data() : nullptr,
                        y.data(), ldy);
  else
    cpu::gemv_bf16<X, Y>(M, N, K, x.data(), ldx, w.data(), ldw, with_bias ? bias.data() : nullptr,
                         y.data(), ldy);

  const bool x_rounded =
      level >= cpu::CpuIsa::Avx512Bf16 && std::is_same_v<X, float> && std::is_same_v<W, bf16>;
  const bool y_bf16 = std::is_same_v<Y, bf16>, y_f16 = std::is_same_v<Y, f16>;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < ldy; ++n) {
      const double got = to_double(y[m * ldy + n]);
      if (n >= N) {
        if (got != to_double(sentinel))
          return ::testing::AssertionFailure()
                 << "padding of y written at [" << m << ", " << n << "]";
        continue;
      }
      double ref = with_bias ? to_double(bias[n]) : 0.0, mag = std::abs(ref);
      for (int64_t k = 0; k < K; ++k) {
        const double p = to_double(x[m * ldx + k]) * to_double(w[n * ldw + k]);
        ref += p;
        mag += std::abs(p);
      }
      const double tol = double(K + 2) * 0x1p-24 * mag + (x_rounded ? 0x1p-8 * mag : 0.0) +
                         (y_bf16 ? 0x1p-8 * std::abs(ref) : 0.0) +
                         (y_f16 ? 0x1p-10 * std::abs(ref) + 0x1p-24 : 0.0) + 1e-30;
      if (!(std::abs(got - ref) <= tol))
        return ::testing::AssertionFailure() << "at [" << m << ", " << n << "]: got " << got
                                             << ", ref " << ref << ", tol " << tol;
    }
  return ::testing::AssertionSuccess();
}

template <typename X, typename Y, typename W = bf16>
void check_all_shapes() {
  uint64_t seed = 7;
  for (cpu::CpuIsa level : supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    for (int64_t M : {1, 2, 3, 4, 5, 9})
      for (int64_t N : {1, 3, 4, 5, 37})
        for (int64_t K : {0, 1, 7, 16, 31, 32, 33, 47, 64, 100, 515})
          for (bool bias : {false, true}) {
            const int64_t pad = (seed % 3 == 0) ? 0 : 5;
            EXPECT_TRUE((check_gemv<X, Y, W>(level, M, N, K, bias, pad, seed += 3)))
                << "level " << cpu::cpu_isa_name(level) << " M " << M << " N " << N << " K " << K
                << " bias " << bias << " pad " << pad;
          }
  }
}

TEST(GemvBf16, Bf16InBf16Out) { check_all_shapes<bf16, bf16>(); }
TEST(GemvBf16, Bf16InF32Out) { check_all_shapes<bf16, float>(); }
TEST(GemvBf16, F32InBf16Out) { check_all_shapes<float, bf16>(); }
TEST(GemvBf16, F32InF32Out) { check_all_shapes<float, float>(); }
// f16 weights (gemv_f16): F16C widening at AVX2 and up, half.h in the scalar blocks.
TEST(GemvF16, F16InF16Out) { check_all_shapes<f16, f16, f16>(); }
TEST(GemvF16, F32InF32Out) { check_all_shapes<float, float, f16>(); }
TEST(GemvF16, ThreadedLargeShape) {
  for (cpu::CpuIsa level : supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    EXPECT_TRUE((check_gemv<f16, f16, f16>(level, 2, 1023, 1037, true, 3, 300)))
        << "level " << cpu::cpu_isa_name(level);
  }
}

// Large enough to run on all OpenMP threads, with a row count that leaves a partial last block
// and K with a tail, as Qwen3's projections would not but a vocabulary might.
TEST(GemvBf16, ThreadedLargeShape) {
  for (cpu::CpuIsa level : supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    for (int64_t M : {1, 3})
      EXPECT_TRUE((check_gemv<bf16, float>(level, M, 1023, 1037, true, 3, 100 + M)))
          << "level " << cpu::cpu_isa_name(level) << " M " << M;
  }
}

TEST(GemvBf16, RejectsBadStrides) {
  std::vector<bf16> x(8), w(8), y(8);
  EXPECT_THROW(
      (cpu::gemv_bf16<bf16, bf16>(1, 2, 4, x.data(), 4, w.data(), 3, nullptr, y.data(), 2)), Error);
  EXPECT_THROW(
      (cpu::gemv_bf16<bf16, bf16>(-1, 2, 4, x.data(), 4, w.data(), 4, nullptr, y.data(), 2)),
      Error);
}

}  // namespace
}  // namespace kiln
