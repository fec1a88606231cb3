// Storage vs compute types for the CPU kernels, and the bf16 <-> f32 conversions they use.
//
// A CPU kernel is templated on its storage type T (float, double, bf16, f16) and computes in
// compute_t<T>: float for the 16-bit floats, T itself otherwise. Values are widened when read
// and rounded once when written, so a bf16 kernel needs no whole-tensor f32 copy: either
// element by element (to_compute / from_compute), or a row or chunk at a time through a small
// stack buffer (widen / out_row + narrow) that stays in L1.
//
// Rounding is the one of kernels/common/half.h at every ISA level: round to nearest even, NaN
// stays NaN (sign and top payload kept, quiet bit set), f32 subnormals round like any other
// value. The bulk conversions dispatch at run time (kernels/cpu/isa.h):
//   scalar      half.h per element
//   avx2        bf16 -> f32: zero-extend and shift 16; f32 -> bf16: the integer rounding of
//               half.h on 8 lanes
//   avx512      the same on 16 lanes, masked tails
//   avx512bf16  f32 -> bf16 with vcvtneps2bf16, which flushes f32 subnormal inputs to zero;
//               lanes holding a subnormal take the integer rounding instead, so results match
// f16 <-> f32 use F16C's vcvtph2ps / vcvtps2ph at AVX2 and above (same values as half.h; a NaN
// stays NaN), half.h per element below.
//
// Header-only (functions carry per-function target attributes), so it needs only isa.h's
// cpu_isa() from kiln_kernels; nothing here is compiled with -march flags.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/common/half.h"
#include "kernels/cpu/isa.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

namespace kiln::cpu {

// ---- types --------------------------------------------------------------------------------------
template <class T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<bf16> {
  using type = float;
};
template <>
struct ComputeType<f16> {
  using type = float;
};
// The type a kernel on storage T does its arithmetic (and accumulates) in.
template <class T>
using compute_t = typename ComputeType<T>::type;

// True for the 16-bit float storage types (bf16, f16).
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// Rows up to this many elements fit one stack buffer of compute_t<T> (16 KiB of floats); longer
// rows are processed in chunks of this size.
inline constexpr int64_t kComputeChunk = 4096;

// ---- one element --------------------------------------------------------------------------------
template <class T>
inline compute_t<T> to_compute(T x) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16_to_float(x);
  else if constexpr (std::is_same_v<T, f16>)
    return f16_to_float(x);
  else
    return x;
}

// Rounds a compute value (or any arithmetic value, through compute_t<T>) to storage T.
template <class T, class V>
inline T from_compute(V x) {
  if constexpr (std::is_same_v<T, bf16>)
    return float_to_bf16(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, f16>)
    return float_to_f16(static_cast<float>(x));
  else
    return static_cast<T>(x);
}

// ---- 16 lanes (AVX-512), for kernels written with intrinsics ------------------------------------
#if KILN_CPU_X86
// 16 bf16 at p -> 16 floats (exact).
KILN_TARGET_AVX512 inline __m512 load_bf16x16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// 16 values at p as floats, for kernels templated on their input's type (f32, bf16 or f16; f16
// by F16C's vcvtph2ps, exact).
KILN_TARGET_AVX512 inline __m512 load_f32x16(const float* p) { return _mm512_loadu_ps(p); }
KILN_TARGET_AVX512 inline __m512 load_f32x16(const bf16* p) { return load_bf16x16(p); }
KILN_TARGET_AVX512 inline __m512 load_f32x16(const f16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// The same on 8 lanes (AVX2).
KILN_TARGET_AVX2 inline __m256 load_f32x8(const float* p) { return _mm256_loadu_ps(p); }
KILN_TARGET_AVX2 inline __m256 load_f32x8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
KILN_TARGET_AVX2 inline __m256 load_f32x8(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// The sum of 8 f32 lanes.
KILN_TARGET_AVX2 inline float reduce_add_f32x8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// The first `count` (0..16) bf16 at p; the other lanes are 0. Reads only those elements.
KILN_TARGET_AVX512 inline __m512 load_bf16x16_partial(const bf16* p, int count) {
  const __mmask16 m = static_cast<__mmask16>((1u << count) - 1u);
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 floats -> 16 bf16 bit patterns, rounded as half.h does (integer form, AVX-512F).
KILN_TARGET_AVX512 inline __m256i round_bf16x16_avx512(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

// The same with vcvtneps2bf16. The instruction treats f32 subnormal inputs as zero; those lanes
// (rare) take the integer rounding, so the result is bit-identical to round_bf16x16_avx512.
KILN_TARGET_AVX512BF16 inline __m256i round_bf16x16_avx512bf16(__m512 x) {
  const __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 zero_exp = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
  const __mmask16 subnormal = _mm512_mask_test_epi32_mask(zero_exp, u, _mm512_set1_epi32(0x7fffff));
  if (__builtin_expect(subnormal == 0, 1)) return r;
  return _mm256_mask_mov_epi16(r, subnormal, round_bf16x16_avx512(x));
}

// Stores 16 floats at p as bf16 (the best rounding the current level has; same bits either way).
KILN_TARGET_AVX512BF16 inline void store_bf16x16_bf16isa(bf16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_bf16x16_avx512bf16(x));
}
KILN_TARGET_AVX512 inline void store_bf16x16(bf16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_bf16x16_avx512(x));
}
// The first `count` (0..16) lanes only.
KILN_TARGET_AVX512 inline void store_bf16x16_partial(bf16* p, __m512 x, int count) {
  const __mmask16 m = static_cast<__mmask16>((1u << count) - 1u);
  _mm256_mask_storeu_epi16(p, m, round_bf16x16_avx512(x));
}
#endif  // KILN_CPU_X86

// ---- bulk conversions ---------------------------------------------------------------------------
namespace bf16_detail {

inline void bf16_to_f32_scalar(int64_t n, const bf16* src, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}
inline void f32_to_bf16_scalar(int64_t n, const float* src, bf16* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

#if KILN_CPU_X86
KILN_TARGET_AVX2 inline void bf16_to_f32_avx2(int64_t n, const bf16* src, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// 8 floats -> 8 bf16 bit patterns in 32-bit lanes, rounded as half.h does.
KILN_TARGET_AVX2 inline __m256i round_bf16x8_avx2(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  // |u| > 0x7f800000 as signed compare is safe: both sides are below 2^31.
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

KILN_TARGET_AVX2 inline void f32_to_bf16_avx2(int64_t n, const float* src, bf16* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = round_bf16x8_avx2(_mm256_loadu_ps(src + i));
    const __m256i b = round_bf16x8_avx2(_mm256_loadu_ps(src + i + 8));
    // packus works per 128-bit lane (values are <= 0xffff, so no saturation): a0 b0 a1 b1.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

KILN_TARGET_AVX512 inline void bf16_to_f32_avx512(int64_t n, const bf16* src, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16x16(src + i));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    _mm512_mask_storeu_ps(dst + i, static_cast<__mmask16>((1u << r) - 1u),
                          load_bf16x16_partial(src + i, r));
  }
}

KILN_TARGET_AVX512 inline void f32_to_bf16_avx512(int64_t n, const float* src, bf16* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store_bf16x16(dst + i, _mm512_loadu_ps(src + i));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    const __mmask16 m = static_cast<__mmask16>((1u << r) - 1u);
    store_bf16x16_partial(dst + i, _mm512_maskz_loadu_ps(m, src + i), r);
  }
}

KILN_TARGET_AVX512BF16 inline void f32_to_bf16_avx512bf16(int64_t n, const float* src, bf16* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store_bf16x16_bf16isa(dst + i, _mm512_loadu_ps(src + i));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    const __mmask16 m = static_cast<__mmask16>((1u << r) - 1u);
    _mm256_mask_storeu_epi16(dst + i, m,
                             round_bf16x16_avx512bf16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

// f16 <-> f32 with F16C (part of the AVX2 level): vcvtph2ps is exact; vcvtps2ph rounds to
// nearest even, as half.h's float_to_f16, subnormals included. NaNs stay NaN (F16C sets the
// quiet bit). Tails go through half.h.
KILN_TARGET_AVX2 inline void f16_to_f32_f16c(int64_t n, const f16* src, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f32x8(src + i));
  for (; i < n; ++i) dst[i] = f16_to_float(src[i]);
}
KILN_TARGET_AVX2 inline void f32_to_f16_f16c(int64_t n, const float* src, f16* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = float_to_f16(src[i]);
}
#endif  // KILN_CPU_X86

}  // namespace bf16_detail

// dst[i] = float(src[i]) for i < n (exact): F16C at AVX2 and above, else half.h.
inline void f16_to_f32(int64_t n, const f16* src, float* dst) {
#if KILN_CPU_X86
  if (cpu_has(CpuIsa::Avx2)) return bf16_detail::f16_to_f32_f16c(n, src, dst);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(src[i]);
}

// dst[i] = f16(src[i]) for i < n, rounded to nearest even as half.h's float_to_f16.
inline void f32_to_f16(int64_t n, const float* src, f16* dst) {
#if KILN_CPU_X86
  if (cpu_has(CpuIsa::Avx2)) return bf16_detail::f32_to_f16_f16c(n, src, dst);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_f16(src[i]);
}

// dst[i] = float(src[i]) for i < n (exact).
inline void bf16_to_f32(int64_t n, const bf16* src, float* dst) {
#if KILN_CPU_X86
  const CpuIsa level = cpu_isa();
  if (level >= CpuIsa::Avx512) return bf16_detail::bf16_to_f32_avx512(n, src, dst);
  if (level >= CpuIsa::Avx2) return bf16_detail::bf16_to_f32_avx2(n, src, dst);
#endif
  bf16_detail::bf16_to_f32_scalar(n, src, dst);
}

// dst[i] = bf16(src[i]) for i < n, rounded as half.h's float_to_bf16.
inline void f32_to_bf16(int64_t n, const float* src, bf16* dst) {
#if KILN_CPU_X86
  const CpuIsa level = cpu_isa();
  if (level >= CpuIsa::Avx512Bf16) return bf16_detail::f32_to_bf16_avx512bf16(n, src, dst);
  if (level >= CpuIsa::Avx512) return bf16_detail::f32_to_bf16_avx512(n, src, dst);
  if (level >= CpuIsa::Avx2) return bf16_detail::f32_to_bf16_avx2(n, src, dst);
#endif
  bf16_detail::f32_to_bf16_scalar(n, src, dst);
}

// dst[i] = compute(src[i]) for any storage T (a copy when T is its own compute type).
template <class T>
inline void to_compute_n(int64_t n, const T* src, compute_t<T>* dst) {
  if constexpr (std::is_same_v<T, bf16>) {
    bf16_to_f32(n, src, dst);
  } else if constexpr (std::is_same_v<T, f16>) {
    f16_to_f32(n, src, dst);
  } else {
    if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(T));
  }
}

// dst[i] = T(src[i]) for any storage T (rounded once; a copy, or nothing when src == dst, when T
// is its own compute type).
template <class T>
inline void from_compute_n(int64_t n, const compute_t<T>* src, T* dst) {
  if constexpr (std::is_same_v<T, bf16>) {
    f32_to_bf16(n, src, dst);
  } else if constexpr (std::is_same_v<T, f16>) {
    f32_to_f16(n, src, dst);
  } else {
    if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(T));
  }
}

// ---- rows through a compute buffer --------------------------------------------------------------
// Reading n (<= the buffer's size) elements of src in compute type: src itself when T is its own
// compute type, else `buf` filled with the widened values.
template <class T>
inline const compute_t<T>* widen(int64_t n, const T* src, compute_t<T>* buf) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    (void)n, (void)buf;
    return src;
  } else {
    to_compute_n(n, src, buf);
    return buf;
  }
}

// Where a kernel writes n compute values destined for dst: dst itself when T is its own compute
// type, else `buf`. Follow with narrow(n, that pointer, dst).
template <class T>
inline compute_t<T>* out_row(T* dst, compute_t<T>* buf) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    (void)buf;
    return dst;
  } else {
    return buf;
  }
}

// Rounds what a kernel wrote at out_row(dst, buf) into dst (nothing when they are the same).
template <class T>
inline void narrow(int64_t n, const compute_t<T>* src, T* dst) {
  from_compute_n(n, src, dst);
}

}  // namespace kiln::cpu
