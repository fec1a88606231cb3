// kernels/cpu/bf16_util.h: the bulk bf16 <-> f32 and f16 <-> f32 conversions give half.h's bits at
// every ISA level this machine supports (every bf16 and f16 pattern; f32 patterns covering ties,
// subnormals, NaN, inf, overflow and random bits), for every length and tail. The one allowed
// difference: F16C quiets a signalling NaN, so an f16 NaN only has to stay a NaN of the same sign.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/bf16_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln::cpu {
namespace {

using test::supported_levels;

TEST(Bf16Util, WidenIsExactForEveryPatternAtEveryLevel) {
  std::vector<bf16> src(65536);
  for (uint32_t i = 0; i < 65536; ++i) src[i].bits = static_cast<uint16_t>(i);
  for (CpuIsa level : supported_levels()) {
    ScopedCpuIsa cap(level);
    std::vector<float> dst(src.size());
    bf16_to_f32(static_cast<int64_t>(src.size()), src.data(), dst.data());
    for (uint32_t i = 0; i < 65536; ++i)
      ASSERT_EQ(float_bits(dst[i]), uint32_t(i) << 16) << cpu_isa_name(level) << " pattern " << i;
  }
}

// f32 bit patterns worth rounding: exact ties either side of even, just above/below ties,
// subnormals, +-0, inf, quiet and signalling NaNs, values rounding up to inf, then random bits.
std::vector<float> rounding_cases() {
  std::vector<uint32_t> bits;
  for (uint32_t hi : {0x0000u, 0x0001u, 0x0040u, 0x007fu, 0x0080u, 0x3f80u, 0x3f81u, 0x7f7fu,
                      0x7f80u, 0x7f81u, 0x7fc0u, 0x7fffu})
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      for (uint32_t sign : {0u, 0x80000000u}) bits.push_back(sign | (hi << 16) | lo);
  std::mt19937 gen(7);
  for (int i = 0; i < 200000; ++i) bits.push_back(gen());
  std::vector<float> v;
  for (uint32_t b : bits) v.push_back(bits_float(b));
  return v;
}

TEST(Bf16Util, NarrowRoundsLikeHalfHAtEveryLevel) {
  const std::vector<float> src = rounding_cases();
  for (CpuIsa level : supported_levels()) {
    ScopedCpuIsa cap(level);
    std::vector<bf16> dst(src.size());
    f32_to_bf16(static_cast<int64_t>(src.size()), src.data(), dst.data());
    for (size_t i = 0; i < src.size(); ++i)
      ASSERT_EQ(dst[i].bits, float_to_bf16(src[i]).bits)
          << cpu_isa_name(level) << " f32 bits 0x" << std::hex << float_bits(src[i]);
  }
}

// Same sign and both NaN, or the same bits.
::testing::AssertionResult same_f16_value(uint16_t got, uint16_t want) {
  const bool got_nan = (got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) != 0;
  const bool want_nan = (want & 0x7c00u) == 0x7c00u && (want & 0x3ffu) != 0;
  if (want_nan ? got_nan && (got & 0x8000u) == (want & 0x8000u) : got == want)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::hex << "got 0x" << got << ", want 0x" << want;
}

TEST(F16Util, WidenIsExactForEveryPatternAtEveryLevel) {
  std::vector<f16> src(65536);
  for (uint32_t i = 0; i < 65536; ++i) src[i].bits = static_cast<uint16_t>(i);
  for (CpuIsa level : supported_levels()) {
    ScopedCpuIsa cap(level);
    std::vector<float> dst(src.size());
    f16_to_f32(static_cast<int64_t>(src.size()), src.data(), dst.data());
    for (uint32_t i = 0; i < 65536; ++i) {
      const float want = f16_to_float(src[i]);
      if (std::isnan(want))
        ASSERT_TRUE(std::isnan(dst[i]) && std::signbit(dst[i]) == std::signbit(want))
            << cpu_isa_name(level) << " pattern " << i;
      else
        ASSERT_EQ(float_bits(dst[i]), float_bits(want)) << cpu_isa_name(level) << " pattern " << i;
    }
  }
}

// f16's rounding points: ties and near-ties at the 13 dropped bits, the subnormal range (below
// 2^-14), the overflow edge (65504 and the tie at 65520), then rounding_cases()' random bits.
std::vector<float> f16_rounding_cases() {
  std::vector<float> v;
  for (uint32_t e : {103u, 104u, 110u, 112u, 113u, 127u, 142u})  // 2^-24 ... 2^15
    for (uint32_t lo : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu, 0x3000u})
      for (uint32_t m : {0u, 1u, 0x155u, 0x3ffu})
        for (uint32_t sign : {0u, 0x80000000u})
          v.push_back(bits_float(sign | e << 23 | m << 13 | lo));
  for (float x : {65504.0f, 65519.0f, 65520.0f, 65535.0f, 65536.0f, 1e30f, 5.96e-8f, 2.98e-8f,
                  2.99e-8f, 0.0f, -0.0f})
    v.push_back(x), v.push_back(-x);
  for (float x : rounding_cases()) v.push_back(x);
  return v;
}

TEST(F16Util, NarrowRoundsLikeHalfHAtEveryLevel) {
  const std::vector<float> src = f16_rounding_cases();
  for (CpuIsa level : supported_levels()) {
    ScopedCpuIsa cap(level);
    std::vector<f16> dst(src.size());
    f32_to_f16(static_cast<int64_t>(src.size()), src.data(), dst.data());
    for (size_t i = 0; i < src.size(); ++i)
      ASSERT_TRUE(same_f16_value(dst[i].bits, float_to_f16(src[i]).bits))
          << cpu_isa_name(level) << " f32 bits 0x" << std::hex << float_bits(src[i]);
  }
}

// The bulk conversions of one 16-bit format, with half.h's scalar ones as the reference.
struct Bf16Format {
  using H = bf16;
  static void narrow(int64_t n, const float* src, H* dst) { f32_to_bf16(n, src, dst); }
  static void widen(int64_t n, const H* src, float* dst) { bf16_to_f32(n, src, dst); }
  static uint16_t narrow_ref(float x) { return float_to_bf16(x).bits; }
  static float widen_ref(H h) { return bf16_to_float(h); }
  static constexpr bool kNanKeepsOnlyItsSign = false;  // widening is a shift, NaNs included
  static ::testing::AssertionResult same(uint16_t got, uint16_t want) {
    if (got == want) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << std::hex << "got 0x" << got << ", want 0x" << want;
  }
};
struct F16Format {
  using H = f16;
  static void narrow(int64_t n, const float* src, H* dst) { f32_to_f16(n, src, dst); }
  static void widen(int64_t n, const H* src, float* dst) { f16_to_f32(n, src, dst); }
  static uint16_t narrow_ref(float x) { return float_to_f16(x).bits; }
  static float widen_ref(H h) { return f16_to_float(h); }
  static constexpr bool kNanKeepsOnlyItsSign = true;  // F16C quiets a signalling NaN
  static ::testing::AssertionResult same(uint16_t got, uint16_t want) {
    return same_f16_value(got, want);
  }
};

// Every length 0..40 at every offset 0..3: tails are masked, nothing outside [0, n) is written,
// and what is inside narrows and widens as half.h does.
template <typename Format>
void check_tails_write_exactly_n(const std::vector<float>& src) {
  using H = typename Format::H;
  for (CpuIsa level : supported_levels()) {
    ScopedCpuIsa cap(level);
    for (int off = 0; off < 4; ++off)
      for (int n = 0; n <= 40; ++n) {
        std::vector<H> h(48, H{0xdead});
        std::vector<float> f(48, -7.0f);
        Format::narrow(n, src.data() + 100 + off, h.data() + off);
        Format::widen(n, h.data() + off, f.data() + off);
        for (int i = 0; i < 48; ++i) {
          const bool inside = i >= off && i < off + n;
          if (inside) {
            ASSERT_TRUE(Format::same(h[i].bits, Format::narrow_ref(src[100 + i])))
                << cpu_isa_name(level);
            const float want = Format::widen_ref(h[i]);
            ASSERT_TRUE(Format::kNanKeepsOnlyItsSign && std::isnan(want)
                            ? std::isnan(f[i]) && std::signbit(f[i]) == std::signbit(want)
                            : float_bits(f[i]) == float_bits(want))
                << cpu_isa_name(level) << " widened 0x" << std::hex << h[i].bits;
          } else {
            ASSERT_EQ(h[i].bits, 0xdead) << cpu_isa_name(level) << " n " << n << " at " << i;
            ASSERT_EQ(f[i], -7.0f) << cpu_isa_name(level) << " n " << n << " at " << i;
          }
        }
      }
  }
}

TEST(Bf16Util, TailsWriteExactlyNElements) {
  check_tails_write_exactly_n<Bf16Format>(rounding_cases());
}

TEST(F16Util, TailsWriteExactlyNElements) {
  check_tails_write_exactly_n<F16Format>(f16_rounding_cases());
}

TEST(Bf16Util, ComputeTypesAndRowHelpers) {
  static_assert(std::is_same_v<compute_t<bf16>, float>);
  static_assert(std::is_same_v<compute_t<f16>, float>);
  static_assert(std::is_same_v<compute_t<double>, double>);
  static_assert(is_half_v<bf16> && !is_half_v<float>);
  float buf[8];
  const float f[3] = {1.5f, -2.25f, 3.0f};
  EXPECT_EQ(widen(3, f, buf), f);  // f32 rows are read in place
  const f16 h[3] = {float_to_f16(1.5f), float_to_f16(-2.25f), float_to_f16(3.0f)};
  const float* w = widen(3, h, buf);
  EXPECT_EQ(w, buf);
  EXPECT_EQ(w[1], -2.25f);
  bf16 out[3];
  float* o = out_row(out, buf);
  for (int i = 0; i < 3; ++i) o[i] = f[i] * 2;
  narrow(3, o, out);
  EXPECT_EQ(to_compute(out[2]), 6.0f);
  EXPECT_EQ(from_compute<bf16>(1.00390625).bits, float_to_bf16(1.00390625f).bits);
}

}  // namespace
}  // namespace kiln::cpu
