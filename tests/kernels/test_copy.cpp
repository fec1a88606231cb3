// Tests for kernels/common/half.h (exhaustive over 16-bit patterns) and kernels/cpu/copy.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/half.h"
#include "kernels/cpu/copy.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

KILN_OP_TESTED(Op::Copy);
KILN_OP_TESTED(Op::Fill);

// ---- plain references
// ----------------------------------------------------------------------------
double ref_bf16_value(uint16_t b) {  // decode sign/exponent/mantissa fields by hand
  const int sign = b >> 15, exp = (b >> 7) & 0xff, mant = b & 0x7f;
  double v;
  if (exp == 0xff)
    v = mant ? NAN : INFINITY;
  else if (exp == 0)
    v = std::ldexp(mant, -126 - 7);
  else
    v = std::ldexp(128 + mant, exp - 127 - 7);
  return sign ? -v : v;
}

double ref_f16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0x1f)
    v = mant ? NAN : INFINITY;
  else if (exp == 0)
    v = std::ldexp(mant, -24);
  else
    v = std::ldexp(1024 + mant, exp - 15 - 10);
  return sign ? -v : v;
}

// Round |x| to the nearest candidate among lo/hi (values), ties to the even bit pattern.
uint32_t pick_nearest(double ax, uint32_t lo_bits, double lo, uint32_t hi_bits, double hi) {
  const double dl = ax - lo, dh = hi - ax;
  if (dl < dh) return lo_bits;
  if (dh < dl) return hi_bits;
  return (lo_bits & 1u) ? hi_bits : lo_bits;
}

uint16_t ref_float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  const uint32_t lo = mag >> 16, hi = lo + 1;  // truncated and next bf16 magnitude
  const double hv = hi == 0x7f80 ? std::ldexp(1.0, 128) : ref_bf16_value(uint16_t(hi));
  const uint32_t r = pick_nearest(std::fabs(double(f)), lo, ref_bf16_value(uint16_t(lo)), hi, hv);
  return uint16_t((sign >> 16) | r);
}

uint16_t ref_float_to_f16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double ax = std::fabs(double(f));
  if (ax >= 65536.0) return sign | 0x7c00;
  // Largest h in [0, 0x7bff] with value(h) <= ax (positive halves increase with their bits).
  uint32_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (ref_f16_value(uint16_t(mid)) <= ax)
      lo = mid;
    else
      hi = mid - 1;
  }
  const uint32_t up = lo + 1;
  const double uv = up == 0x7c00 ? 65536.0 : ref_f16_value(uint16_t(up));
  return sign | uint16_t(pick_nearest(ax, lo, ref_f16_value(uint16_t(lo)), up, uv));
}

// ---- half.h
// --------------------------------------------------------------------------------------
TEST(Half, Bf16AllPatternsDecodeAndRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_float(bf16{uint16_t(b)});
    const double ref = ref_bf16_value(uint16_t(b));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << b;
      const uint16_t back = float_to_bf16(f).bits;
      EXPECT_EQ(back, uint16_t(b | 0x40)) << "NaN payload/sign kept, quiet bit set: " << b;
    } else {
      ASSERT_EQ(double(f), ref) << b;
      ASSERT_EQ(float_to_bf16(f).bits, b) << b;
    }
  }
}

TEST(Half, F16AllPatternsDecodeAndRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_float(f16{uint16_t(h)});
    const double ref = ref_f16_value(uint16_t(h));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      EXPECT_EQ(float_to_f16(f).bits, uint16_t(h | 0x200)) << h;
    } else {
      ASSERT_EQ(double(f), ref) << h;
      ASSERT_EQ(std::signbit(f), bool(h & 0x8000)) << h;
      ASSERT_EQ(float_to_f16(f).bits, h) << h;
    }
  }
}

TEST(Half, Bf16RoundingMatchesReference) {
  std::mt19937 gen(1);
  std::vector<uint32_t> pats;
  for (int i = 0; i < 400000; ++i) pats.push_back(gen());
  // Exact ties and neighbours, around the top of the range and zero.
  for (uint32_t b : {0x00000000u, 0x3f800000u, 0x3f810000u, 0x7f7f0000u, 0x00010000u})
    for (uint32_t d : {0x7fffu, 0x8000u, 0x8001u, 0x18000u, 0xffffu})
      pats.push_back(b + d), pats.push_back((b + d) | 0x80000000u);
  for (uint32_t u : pats) {
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f).bits, ref_float_to_bf16(f)) << std::hex << u;
  }
  EXPECT_EQ(float_to_bf16(3.4e38f).bits, 0x7f80) << "rounds to inf past the largest bf16";
}

TEST(Half, F16RoundingMatchesReference) {
  std::vector<float> xs;
  // Every midpoint between consecutive positive halves (exactly representable in float), and
  // the floats just below and above it: ties go to even, neighbours to the nearer half.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double a = ref_f16_value(uint16_t(h));
    const double b = h + 1 == 0x7c00 ? 65536.0 : ref_f16_value(uint16_t(h + 1));
    const float mid = float((a + b) / 2);
    xs.push_back(mid);
    xs.push_back(std::nextafter(mid, 0.0f));
    xs.push_back(std::nextafter(mid, INFINITY));
    xs.push_back(float(a));
  }
  std::mt19937 gen(2);
  std::uniform_int_distribution<uint32_t> exp_dist(90, 150);  // underflow .. overflow
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = (exp_dist(gen) << 23) | (gen() & 0x7fffffu);
    float f;
    std::memcpy(&f, &u, 4);
    xs.push_back(f);
  }
  xs.push_back(1e-30f);
  xs.push_back(7e4f);
  xs.push_back(INFINITY);
  for (float x : xs)
    for (float f : {x, -x}) ASSERT_EQ(float_to_f16(f).bits, ref_float_to_f16(f)) << f;
}

// ---- copy
// ----------------------------------------------------------------------------------------
// Reference: walk the output in row-major order and read src at sum(idx * stride).
template <typename Src, typename Dst>
std::vector<Dst> ref_copy(const std::vector<int64_t>& shape, const Src* src,
                          const std::vector<int64_t>& strides) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<Dst> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      off += (rem % shape[d]) * strides[d];
      rem /= shape[d];
    }
    out[i] = cpu::convert_scalar<Dst>(src[off]);
  }
  return out;
}

template <typename T>
uint64_t bits_of(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

template <typename Src, typename Dst>
void check_copy(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                int64_t src_len, uint64_t seed) {
  std::vector<Src> src(static_cast<size_t>(src_len));
  auto vals = test::random_uniform_vec<float>(src_len, seed, -50, 50);
  for (int64_t i = 0; i < src_len; ++i) src[i] = cpu::convert_scalar<Src>(vals[i]);
  const auto ref = ref_copy<Src, Dst>(shape, src.data(), strides);
  std::vector<Dst> out(ref.size());
  cpu::copy_strided<Src, Dst>(int(shape.size()), shape.data(), src.data(), strides.data(),
                              out.data());
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_EQ(bits_of(out[i]), bits_of(ref[i])) << "element " << i;
}

struct Layout {
  std::vector<int64_t> shape, strides;
  int64_t src_len;
};

std::vector<Layout> layouts() {
  return {
      {{}, {}, 1},                           // scalar
      {{129}, {1}, 129},                     // contiguous
      {{7, 33}, {33, 1}, 7 * 33},            // contiguous 2-D
      {{33, 7}, {1, 33}, 7 * 33},            // transpose (tiled path)
      {{129, 65}, {1, 129}, 129 * 65},       // larger transpose, odd edges
      {{5, 1, 7}, {7, 0, 1}, 35},            // size-1 dim
      {{4, 7, 3}, {0, 3, 1}, 21},            // broadcast outer
      {{7, 5}, {1, 0}, 7},                   // broadcast inner
      {{3, 4, 5, 6}, {120, 6, 24, 1}, 360},  // (B,H,T,D) <- (B,T,H,D) permute
      {{6, 9}, {20, 2}, 120},                // sliced, strided inner
      {{1}, {1}, 1},
      {{2, 3, 0}, {0, 0, 1}, 1},                    // empty
      {{40000}, {3}, 120000},                       // long strided run (parallel)
      {{300, 200}, {200, 1}, 60000},                // contiguous, parallel
      {{16, 4, 64, 16}, {4096, 16, 64, 1}, 65536},  // permute, parallel blocks
      {{9, 5, 7, 300}, {2100, 300, 0, 1}, 18900},   // broadcast middle dim, parallel
  };
}

TEST(Copy, FloatLayouts) {
  uint64_t seed = 10;
  for (const auto& l : layouts()) {
    SCOPED_TRACE(::testing::Message() << "ndim " << l.shape.size() << " len " << l.src_len);
    check_copy<float, float>(l.shape, l.strides, l.src_len, ++seed);
    check_copy<double, double>(l.shape, l.strides, l.src_len, ++seed);
  }
}

TEST(Copy, AllDtypePairs) {
  const std::vector<int64_t> shape = {5, 7}, strides = {1, 5};      // transpose
  const std::vector<int64_t> shape2 = {3, 33}, strides2 = {40, 1};  // rows with a gap
  auto both = [&]<typename S, typename D>() {
    check_copy<S, D>(shape, strides, 35, 3);
    check_copy<S, D>(shape2, strides2, 120, 4);
  };
  auto from = [&]<typename S>() {
    both.template operator()<S, float>();
    both.template operator()<S, double>();
    both.template operator()<S, bf16>();
    both.template operator()<S, f16>();
    both.template operator()<S, int32_t>();
    both.template operator()<S, int64_t>();
    both.template operator()<S, uint8_t>();
  };
  from.template operator()<float>();
  from.template operator()<double>();
  from.template operator()<bf16>();
  from.template operator()<f16>();
  from.template operator()<int32_t>();
  from.template operator()<int64_t>();
  from.template operator()<uint8_t>();
}

TEST(Copy, ConversionRules) {
  const std::vector<float> src = {2.7f, -2.7f, 0.0f, 0.5f, -0.0f, 1e6f};
  const int64_t shape[] = {6}, strides[] = {1};
  std::vector<int32_t> i32(6);
  cpu::copy_strided(1, shape, src.data(), strides, i32.data());
  EXPECT_EQ(i32, (std::vector<int32_t>{2, -2, 0, 0, 0, 1000000}));  // truncation toward zero
  std::vector<uint8_t> b(6);
  cpu::copy_strided(1, shape, src.data(), strides, b.data());
  EXPECT_EQ(b, (std::vector<uint8_t>{1, 1, 0, 1, 0, 1}));  // bool: x != 0
  const std::vector<uint8_t> bytes = {0, 1, 7, 255};
  std::vector<uint8_t> bytes_out(4);
  const int64_t s4[] = {4};
  cpu::copy_strided(1, s4, bytes.data(), strides, bytes_out.data());
  EXPECT_EQ(bytes_out, bytes);
  std::vector<bf16> h(6);
  cpu::copy_strided(1, shape, src.data(), strides, h.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(h[i].bits, ref_float_to_bf16(src[i]));
  const int64_t big = (int64_t(1) << 40) + 3;
  double d = 0;
  cpu::copy_strided(0, nullptr, &big, nullptr, &d);
  EXPECT_EQ(d, double(big));
}

TEST(Copy, RejectsBadArguments) {
  const float x = 1;
  float y = 0;
  const int64_t neg_shape[] = {-1}, ok_stride[] = {1}, shape[] = {1}, neg_stride[] = {-1};
  EXPECT_THROW(cpu::copy_strided(1, neg_shape, &x, ok_stride, &y), Error);
  EXPECT_THROW(cpu::copy_strided(1, shape, &x, neg_stride, &y), Error);
  EXPECT_THROW(cpu::copy_strided(17, shape, &x, ok_stride, &y), Error);
}

TEST(Fill, AllSizesAndTypes) {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(33), int64_t(300001)}) {
    std::vector<float> f(n + 1, -1.f);
    cpu::fill<float>(n, 2.5f, f.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f[i], 2.5f);
    EXPECT_EQ(f[n], -1.f) << "no write past n";
    std::vector<int64_t> l(n);
    cpu::fill<int64_t>(n, int64_t(1) << 50, l.data());
    for (auto v : l) ASSERT_EQ(v, int64_t(1) << 50);
    std::vector<bf16> h(n);
    cpu::fill(n, float_to_bf16(1.5f), h.data());
    for (auto v : h) ASSERT_EQ(v.bits, float_to_bf16(1.5f).bits);
  }
}

}  // namespace
}  // namespace kiln
