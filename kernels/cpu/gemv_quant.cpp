// Quantized-weight GEMV for decode (see gemv_quant.h). Per W row, a dot product with each
// quantized x row: exact int32 sums per block, scaled once per block in f32.
#include "kernels/cpu/gemv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/common/error.h"
#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/gemv_quant_tiles.h"
#include "kernels/cpu/isa.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

using quant::f16_at;
using quant::QuantType;

// x rows per pass of gemv_q8_0_tile16 over a tile of W (its accumulators, 64 bytes a row, on
// the stack); more rows take more passes, each row's arithmetic unchanged.
constexpr std::int64_t kTileRows = 32;

// Below this many weight bytes one thread does it all (the fork costs more than it saves).
constexpr std::int64_t kParallelMinBytes = std::int64_t{1} << 15;

// The block's scale and values: d = amax / 127, q = nearest(x * 127 / amax). A block holding a
// NaN or an infinity gets d = NaN and q = 0, so every output it reaches is NaN, as the float
// product would be (and no NaN is ever converted to an integer).
template <typename X>
float quantize_block(const X* x, int n, std::int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int j = 0; j < n; ++j) {
    const float v = std::fabs(to_compute(x[j]));
    finite = finite && v <= std::numeric_limits<float>::max();  // false for inf and NaN
    amax = std::max(amax, v);
  }
  if (!finite) {
    std::memset(q, 0, static_cast<std::size_t>(n));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float d = amax / 127.0f;
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < n; ++j)
    q[j] = static_cast<std::int8_t>(
        std::clamp(std::nearbyint(to_compute(x[j]) * id), -127.0f, 127.0f));
  return d;
}

// Q4_K's eight 6-bit scales and mins.
inline void q4_k_scales(const std::uint8_t* block, int* sc, int* m) {
  for (int s = 0; s < 8; ++s) quant::q4_k_scale_min(block, s, sc[s], m[s]);
}

// ---- scalar ---------------------------------------------------------------------------------

float dot_q8_0_scalar(const std::uint8_t* w, const BlockQ8* x, std::int64_t nb) {
  float acc = 0.0f;
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 34;
    std::int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += static_cast<std::int8_t>(blk[2 + j]) * x[b].q[j];
    acc += f16_at(blk) * x[b].d * static_cast<float>(s);
  }
  return acc;
}

float dot_q4_k_scalar(const std::uint8_t* w, const BlockQ8K* x, std::int64_t nb) {
  float acc = 0.0f;
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 144;
    const std::uint8_t* q = blk + 16;
    int sc[8], m[8];
    q4_k_scales(blk, sc, m);
    std::int32_t sumi = 0, summ = 0;
    for (int s = 0; s < 8; ++s) {
      const std::uint8_t* qs = q + 32 * (s / 2);
      const std::int8_t* xs = x[b].q + 32 * s;
      std::int32_t dot = 0;
      for (int l = 0; l < 32; ++l) dot += ((s & 1) ? qs[l] >> 4 : qs[l] & 0xF) * xs[l];
      sumi += sc[s] * dot;
      summ += m[s] * (x[b].bsums[2 * s] + x[b].bsums[2 * s + 1]);
    }
    acc += x[b].d *
           (f16_at(blk) * static_cast<float>(sumi) - f16_at(blk + 2) * static_cast<float>(summ));
  }
  return acc;
}

float dot_q6_k_scalar(const std::uint8_t* w, const BlockQ8K* x, std::int64_t nb) {
  float acc = 0.0f;
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 210;
    const std::uint8_t* ql = blk;
    const std::uint8_t* qh = blk + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(blk + 192);
    std::int32_t sumi = 0, corr = 0;
    for (int i = 0; i < 256; ++i) {
      const int h = i / 128, r = (i % 128) / 32, l = i % 32;
      const std::uint8_t low = ql[64 * h + l + 32 * (r & 1)];
      const int q = (r >= 2 ? low >> 4 : low & 0xF) | (((qh[32 * h + l] >> (2 * r)) & 3) << 4);
      sumi += sc[i / 16] * q * x[b].q[i];
    }
    for (int g = 0; g < 16; ++g) corr += sc[g] * x[b].bsums[g];
    acc += x[b].d * f16_at(blk + 208) * static_cast<float>(sumi - 32 * corr);
  }
  return acc;
}

// ---- AVX2 (also the Avx512 level's) ---------------------------------------------------------

#if KILN_CPU_X86
KILN_TARGET_AVX2 float dot_q8_0_avx2(const std::uint8_t* w, const BlockQ8* x, std::int64_t nb) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 34;
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
    // |w| * (x * sign(w)) = w * x; pairs sum to at most 2 * 128 * 127 (no i16 saturation).
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
    const __m256i p32 = _mm256_madd_epi16(p16, ones);
    const float d = _cvtsh_ss(static_cast<unsigned short>(blk[0] | (blk[1] << 8))) * x[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(d), acc);
  }
  return reduce_add_f32x8(acc);
}

KILN_TARGET_AVX2 float dot_q4_k_avx2(const std::uint8_t* w, const BlockQ8K* x, std::int64_t nb) {
  const __m256i low4 = _mm256_set1_epi8(0xF);
  __m256 acc = _mm256_setzero_ps();
  float acc_min = 0.0f;
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 144;
    const std::uint8_t* q = blk + 16;
    int sc[8], m[8];
    q4_k_scales(blk, sc, m);
    std::int32_t summ = 0;
    for (int s = 0; s < 8; ++s) summ += m[s] * (x[b].bsums[2 * s] + x[b].bsums[2 * s + 1]);
    __m256i sumi = _mm256_setzero_si256();
    for (int g = 0; g < 4; ++g) {
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * g));
      const __m256i lo = _mm256_and_si256(qv, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), low4);
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q + 64 * g));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q + 64 * g + 32));
      // 4-bit u8 times i8: pairs at most 2 * 15 * 127; times a 6-bit scale in vpmaddwd.
      const __m256i p0 =
          _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_set1_epi16(sc[2 * g]));
      const __m256i p1 =
          _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), _mm256_set1_epi16(sc[2 * g + 1]));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    const float d = f16_at(blk) * x[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    acc_min += f16_at(blk + 2) * x[b].d * static_cast<float>(summ);
  }
  return reduce_add_f32x8(acc) - acc_min;
}

KILN_TARGET_AVX2 float dot_q6_k_avx2(const std::uint8_t* w, const BlockQ8K* x, std::int64_t nb) {
  const __m256i low4 = _mm256_set1_epi8(0xF), two = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float acc_corr = 0.0f;
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 210;
    const auto* sc = reinterpret_cast<const std::int8_t*>(blk + 192);
    std::int32_t corr = 0;
    for (int g = 0; g < 16; ++g) corr += sc[g] * x[b].bsums[g];
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      for (int r = 0; r < 4; ++r) {
        const __m256i low = (r & 1) ? ql1 : ql0;
        const __m256i nib = r >= 2 ? _mm256_and_si256(_mm256_srli_epi16(low, 4), low4)
                                   : _mm256_and_si256(low, low4);
        // 16-bit shifts move bits across bytes, but the masks keep only each byte's own.
        const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * r)), two);
        const __m256i qv = _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));  // 0..63
        const __m256i xv =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q + 128 * h + 32 * r));
        // i16 lanes 0-7 hold values 0-15 of the 32 (scale 8h + 2r), lanes 8-15 values 16-31.
        const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[8 * h + 2 * r + 1]),
                                             _mm_set1_epi16(sc[8 * h + 2 * r]));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(qv, xv), scv));
      }
    }
    const float d = f16_at(blk + 208) * x[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    acc_corr += d * static_cast<float>(32 * corr);
  }
  return reduce_add_f32x8(acc) - acc_corr;
}

// ---- AVX512-VNNI ----------------------------------------------------------------------------

KILN_TARGET_AVX512VNNI float dot_q8_0_vnni(const std::uint8_t* w, const BlockQ8* x,
                                           std::int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 34;
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
    const __m256i p32 =
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq), _mm256_sign_epi8(xq, wq));
    const float d = _cvtsh_ss(static_cast<unsigned short>(blk[0] | (blk[1] << 8))) * x[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(d), acc);
  }
  return reduce_add_f32x8(acc);
}

// R rows of x (R <= 4, at x + r * xstride bytes) against one weight row: each row's sum is
// dot_q8_0_vnni's, instruction for instruction (one accumulator, blocks in order), so a row's
// result does not depend on how many rows share the call; the weight block's load, abs and scale
// are shared, and the R independent chains overlap (one row alone waits on each fmadd).
KILN_TARGET_AVX512VNNI void dot_q8_0_vnni_rows(const std::uint8_t* w, const std::uint8_t* x,
                                               std::int64_t xstride, std::int64_t nb, int R,
                                               float* out) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  const BlockQ8* xr[4];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const BlockQ8*>(x + r * xstride);
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 34;
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i wabs = _mm256_abs_epi8(wq);
    const float dw = _cvtsh_ss(static_cast<unsigned short>(blk[0] | (blk[1] << 8)));
    for (int r = 0; r < R; ++r) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[r][b].q));
      const __m256i p32 =
          _mm256_dpbusd_epi32(_mm256_setzero_si256(), wabs, _mm256_sign_epi8(xq, wq));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(dw * xr[r][b].d), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = reduce_add_f32x8(acc[r]);
}

#endif

bool use_vnni() { return cpu_has(CpuIsa::Avx512Bf16) && avx512_vnni_detected(); }

// The ints per x block the tiles take (gemv_quant_tiles.h): Q8_0's correction, Q4_K's four and
// Q6_K's eight i16 pairs.
std::int64_t tile_x_ints(QuantType t) {
  return t == QuantType::Q8_0 ? 1 : t == QuantType::Q4_K ? 4 : 8;
}

// The W rows per tile (gemv_quant_tiles.h) of type t at the current level: 16 with
// AVX512-VNNI; 8 with AVX2; else 0 (one W row at a time). On AVX2 the K-quant tiles took q4_k_m
// decode from 27-30 to 35 tok/s and prefill of 128 from 78-85 to 173-188 (KILN_CPU_ISA=avx2 on an
// AMD EPYC, 2 threads, 2026-11-27). Q8_0's (2026-11-29, an AVX2-only EPYC, 2 threads, Qwen3-0.6B's
// layer shapes): 128 x rows 55-56 ms against 126-128 for dot_q8_0_avx2 row by row, 4 rows 11.6-12.0
// against 18.6-24.0, 1 row (decode, with its prefetch) 30.4-31.2 against 31.1-33.3.
std::int64_t tile_width(QuantType t) {
  if (use_vnni()) return 16;
  return cpu_has(CpuIsa::Avx2) ? 8 : 0;
}

std::int64_t x_block_bytes(QuantType t) {
  return t == QuantType::Q8_0 ? static_cast<std::int64_t>(sizeof(BlockQ8))
                              : static_cast<std::int64_t>(sizeof(BlockQ8K));
}
std::int64_t x_block_size(QuantType t) { return t == QuantType::Q8_0 ? 32 : 256; }

// Each level's dot product behind one signature (x's blocks as void*), so gemv_quant picks the
// function once per call instead of testing the level and the type for every row.
using DotFn = float (*)(const std::uint8_t*, const void*, std::int64_t);
template <class B, float (*F)(const std::uint8_t*, const B*, std::int64_t)>
float erased(const std::uint8_t* w, const void* x, std::int64_t nb) {
  return F(w, static_cast<const B*>(x), nb);
}

// The dot product of type t at the current ISA level.
DotFn pick_dot(QuantType t) {
  switch (t) {
    case QuantType::Q8_0:
#if KILN_CPU_X86
      if (use_vnni()) return erased<BlockQ8, dot_q8_0_vnni>;
      if (cpu_has(CpuIsa::Avx2)) return erased<BlockQ8, dot_q8_0_avx2>;
#endif
      return erased<BlockQ8, dot_q8_0_scalar>;
    case QuantType::Q4_K:
#if KILN_CPU_X86
      if (cpu_has(CpuIsa::Avx2)) return erased<BlockQ8K, dot_q4_k_avx2>;
#endif
      return erased<BlockQ8K, dot_q4_k_scalar>;
    case QuantType::Q6_K:
      break;
  }
#if KILN_CPU_X86
  if (cpu_has(CpuIsa::Avx2)) return erased<BlockQ8K, dot_q6_k_avx2>;
#endif
  return erased<BlockQ8K, dot_q6_k_scalar>;
}

}  // namespace

bool gemv_quant_uses_vnni() { return use_vnni(); }

std::int64_t gemv_quant_tile_width(QuantType t) { return tile_width(t); }

std::int64_t quant_gemv_max_rows(QuantType t) {
  return tile_width(t) > 0 && !cpu_has(CpuIsa::Amx) ? kQuantGemvTileMaxRows : kQuantGemvMaxRows;
}

float dot_q8_0(const std::uint8_t* w, const BlockQ8* x, std::int64_t nb) {
  return pick_dot(QuantType::Q8_0)(w, x, nb);
}
float dot_q4_k(const std::uint8_t* w, const BlockQ8K* x, std::int64_t nb) {
  return pick_dot(QuantType::Q4_K)(w, x, nb);
}
float dot_q6_k(const std::uint8_t* w, const BlockQ8K* x, std::int64_t nb) {
  return pick_dot(QuantType::Q6_K)(w, x, nb);
}

std::int64_t gemv_quant_scratch_bytes(QuantType t, std::int64_t M, std::int64_t K) {
  const std::int64_t blocks = M * (K / x_block_size(t));
  // The 16-row tiles' ints per x block (gemv_quant_tiles.h), whether they run or not.
  return blocks * (x_block_bytes(t) + 4 * tile_x_ints(t));
}

#if KILN_CPU_X86

// Lanes of a (absolute values) that are an infinity or a NaN: not below +inf, unordered true.
KILN_TARGET_AVX512 inline __mmask16 not_finite(__m512 a) {
  return _mm512_cmp_ps_mask(a, _mm512_set1_ps(std::numeric_limits<float>::infinity()), _CMP_NLT_UQ);
}

// quantize_block's arithmetic on 32 values, 16 lanes at a time: the same max, the same two
// divisions, the same products rounded to nearest-even and clamped, so the same bytes.
template <typename X>
KILN_TARGET_AVX512 void quantize_row_q8_avx512(const X* x, std::int64_t K, BlockQ8* out) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (std::int64_t b = 0; b < K / 32; ++b) {
    const __m512 v0 = load_f32x16(x + 32 * b), v1 = load_f32x16(x + 32 * b + 16);
    const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
    if (not_finite(a0) | not_finite(a1)) {
      out[b].d = std::numeric_limits<float>::quiet_NaN();
      std::memset(out[b].q, 0, 32);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
    out[b].d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    for (int h = 0; h < 2; ++h) {
      __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(h ? v1 : v0, id),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].q + 16 * h),
                       _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
    }
  }
}

// ---- the x quantizers on AVX2: quantize_block's arithmetic, 8 lanes at a time --------------

// The largest |x| of n values (a multiple of 8); false where one of them is an infinity or a
// NaN (not below +inf, unordered true).
template <typename X>
KILN_TARGET_AVX2 inline bool amax_finite_avx2(const X* x, int n, float* amax) {
  const __m256 sign = _mm256_set1_ps(-0.0f),
               inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 m = _mm256_setzero_ps();
  int bad = 0;
  for (int j = 0; j < n; j += 8) {
    const __m256 a = _mm256_andnot_ps(sign, load_f32x8(x + j));
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
    m = _mm256_max_ps(m, a);
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  *amax = _mm_cvtss_f32(h);
  return bad == 0;
}

// 32 values times id, rounded to nearest-even (as nearbyint) and clamped to [-127, 127], stored
// as bytes at q; the codes' sums over each 16 in sums[0..1] when sums is not null.
template <typename X>
KILN_TARGET_AVX2 inline void quantize_32_avx2(const X* x, __m256 id, std::int8_t* q,
                                              std::int16_t* sums) {
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i v[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(load_f32x8(x + 8 * k), id),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
  }
  if (sums != nullptr) {
    for (int h = 0; h < 2; ++h) {
      const __m256i s8 = _mm256_add_epi32(v[2 * h], v[2 * h + 1]);
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
      sums[h] = static_cast<std::int16_t>(_mm_cvtsi128_si32(s));
    }
  }
  // The packs work within 128-bit lanes: dword k of the result holds 4 codes of v[k % 4],
  // lane k / 4; the permutation puts them back in order. No value saturates (|code| <= 127).
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// One block of n values (32 or 256): quantize_block's bytes and scale, and Q8_K's block sums
// when sums is not null.
template <typename X>
KILN_TARGET_AVX2 float quantize_block_avx2(const X* x, int n, std::int8_t* q, std::int16_t* sums) {
  float amax = 0.0f;
  if (!amax_finite_avx2(x, n, &amax)) {
    std::memset(q, 0, static_cast<std::size_t>(n));
    if (sums != nullptr)
      std::memset(sums, 0, sizeof(std::int16_t) * static_cast<std::size_t>(n / 16));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  for (int j = 0; j < n; j += 32)
    quantize_32_avx2(x + j, id, q + j, sums != nullptr ? sums + j / 16 : nullptr);
  return amax / 127.0f;
}
#endif

template <typename X>
void quantize_row_q8(const X* x, std::int64_t K, BlockQ8* out) {
#if KILN_CPU_X86
  if (cpu_has(CpuIsa::Avx512)) return quantize_row_q8_avx512(x, K, out);
  if (cpu_has(CpuIsa::Avx2)) {
    for (std::int64_t b = 0; b < K / 32; ++b)
      out[b].d = quantize_block_avx2(x + 32 * b, 32, out[b].q, nullptr);
    return;
  }
#endif
  for (std::int64_t b = 0; b < K / 32; ++b) out[b].d = quantize_block(x + 32 * b, 32, out[b].q);
}

#if KILN_CPU_X86
// quantize_row_q8_k's arithmetic, 16 lanes at a time (each vector is one of the 16 sums).
template <typename X>
KILN_TARGET_AVX512 void quantize_row_q8_k_avx512(const X* x, std::int64_t K, BlockQ8K* out) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (std::int64_t b = 0; b < K / 256; ++b) {
    const X* xb = x + 256 * b;
    __m512 m = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int g = 0; g < 16; ++g) {
      const __m512 a = _mm512_abs_ps(load_f32x16(xb + 16 * g));
      bad |= not_finite(a);
      m = _mm512_max_ps(m, a);
    }
    if (bad) {
      out[b].d = std::numeric_limits<float>::quiet_NaN();
      std::memset(out[b].q, 0, sizeof out[b].q);
      std::memset(out[b].bsums, 0, sizeof out[b].bsums);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(m);
    out[b].d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    for (int g = 0; g < 16; ++g) {
      __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(load_f32x16(xb + 16 * g), id),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].q + 16 * g), _mm512_cvtepi32_epi8(q));
      out[b].bsums[g] = static_cast<std::int16_t>(_mm512_reduce_add_epi32(q));
    }
  }
}
#endif

template <typename X>
void quantize_row_q8_k(const X* x, std::int64_t K, BlockQ8K* out) {
#if KILN_CPU_X86
  if (cpu_has(CpuIsa::Avx512)) return quantize_row_q8_k_avx512(x, K, out);
  if (cpu_has(CpuIsa::Avx2)) {
    for (std::int64_t b = 0; b < K / 256; ++b)
      out[b].d = quantize_block_avx2(x + 256 * b, 256, out[b].q, out[b].bsums);
    return;
  }
#endif
  for (std::int64_t b = 0; b < K / 256; ++b) {
    out[b].d = quantize_block(x + 256 * b, 256, out[b].q);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += out[b].q[16 * g + j];
      out[b].bsums[g] = static_cast<std::int16_t>(s);
    }
  }
}

template <typename X, typename Y>
void gemv_quant(QuantType t, std::int64_t M, std::int64_t N, std::int64_t K, const X* x,
                std::int64_t ldx, const std::uint8_t* w, const Y* bias, Y* y, std::int64_t ldy,
                void* scratch) {
  const quant::QuantInfo& info = quant::quant_info(t);
  KILN_CHECK(K % info.block_size == 0, "[gemv_quant] K {} is not whole {} blocks", K, info.name);
  if (M <= 0 || N <= 0) return;
  const std::int64_t nb = K / info.block_size, row_bytes = nb * info.block_bytes;
  const std::int64_t xstride = nb * x_block_bytes(t);  // bytes per quantized x row
  auto* xq = static_cast<std::uint8_t*>(scratch);
  for (std::int64_t m = 0; m < M; ++m) {
    if (t == QuantType::Q8_0)
      quantize_row_q8(x + m * ldx, K, reinterpret_cast<BlockQ8*>(xq + m * xstride));
    else
      quantize_row_q8_k(x + m * ldx, K, reinterpret_cast<BlockQ8K*>(xq + m * xstride));
  }
  const DotFn dot = pick_dot(t);
  const bool parallel = N * row_bytes >= kParallelMinBytes;
#if KILN_CPU_X86
  const std::int64_t width = tile_width(t);
  if (width > 0 && row_bytes <= (std::int64_t{1} << 26)) {  // tile row offsets are int32
    // Columns below N16 in tiles of `width` (gemv_quant_tiles.h); the last N % width one at a
    // time (for Q8_0 on VNNI up to 4 x rows per pass over a weight row, dot_q8_0_vnni_rows,
    // bit-identical to one at a time). Which kernel a column takes depends only on N and the
    // level, so a row's result does not depend on M.
    const std::int64_t N16 = N / width * width;
    for (std::int64_t n = N16; n < N; ++n) {
      const std::uint8_t* wr = w + n * row_bytes;
      const float b = bias != nullptr ? to_compute(bias[n]) : 0.0f;
      if (t != QuantType::Q8_0 || width != 16) {
        for (std::int64_t m = 0; m < M; ++m)
          y[m * ldy + n] = from_compute<Y>(dot(wr, xq + m * xstride, nb) + b);
        continue;
      }
      float d[4];
      for (std::int64_t m0 = 0; m0 < M; m0 += 4) {
        const int R = static_cast<int>(std::min<std::int64_t>(4, M - m0));
        dot_q8_0_vnni_rows(wr, xq + m0 * xstride, xstride, nb, R, d);
        for (int r = 0; r < R; ++r) y[(m0 + r) * ldy + n] = from_compute<Y>(d[r] + b);
      }
    }
    if (N16 == 0) return;
    // Per x block, the tiles' extra ints (gemv_quant_tiles.h), after x's blocks in the scratch.
    auto* x_extra = reinterpret_cast<std::int32_t*>(xq + M * xstride);
    const std::int64_t extra = tile_x_ints(t);
    const auto* xk = reinterpret_cast<const BlockQ8K*>(xq);
    auto tile = tiles::gemv_q8_0_tile16;
    switch (t) {
      case QuantType::Q8_0:  // the correction is the VNNI tile's (x biased to u8)
        if (width == 16) tiles::q8_0_x_corr(reinterpret_cast<const BlockQ8*>(xq), M * nb, x_extra);
        break;
      case QuantType::Q4_K:
        tiles::q4_k_x_pairs(xk, M * nb, x_extra);
        tile = tiles::gemv_q4_k_tile16;
        break;
      case QuantType::Q6_K:
        tiles::q6_k_x_pairs(xk, M * nb, x_extra);
        tile = tiles::gemv_q6_k_tile16;
        break;
    }
    const bool tiles_parallel = N16 * row_bytes >= kParallelMinBytes;
#pragma omp parallel for schedule(static) if (tiles_parallel)
    for (std::int64_t g = 0; g < N16 / width; ++g) {
      const std::int64_t n0 = width * g;
      alignas(64) float acc[16 * kTileRows];
      for (std::int64_t m0 = 0; m0 < M; m0 += kTileRows) {
        const std::int64_t rows = std::min(kTileRows, M - m0);
        const std::uint8_t* wt = w + n0 * row_bytes;
        const std::uint8_t* xt = xq + m0 * xstride;
        const std::int32_t* et = x_extra + m0 * nb * extra;
        if (width == 16)
          tile(wt, row_bytes, xt, xstride, et, nb, rows, acc);
        else
          tiles::gemv_tile8_avx2(t, wt, row_bytes, xt, xstride, et, nb, rows, acc);
        for (std::int64_t m = 0; m < rows; ++m)
          for (std::int64_t j = 0; j < width; ++j) {
            const float b = bias != nullptr ? to_compute(bias[n0 + j]) : 0.0f;
            y[(m0 + m) * ldy + n0 + j] = from_compute<Y>(acc[width * m + j] + b);
          }
      }
    }
    return;
  }
#endif
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t n = 0; n < N; ++n) {
    const std::uint8_t* wr = w + n * row_bytes;
    const float b = bias != nullptr ? to_compute(bias[n]) : 0.0f;
    for (std::int64_t m = 0; m < M; ++m)
      y[m * ldy + n] = from_compute<Y>(dot(wr, xq + m * xstride, nb) + b);
  }
}

template void quantize_row_q8<float>(const float*, std::int64_t, BlockQ8*);
template void quantize_row_q8<bf16>(const bf16*, std::int64_t, BlockQ8*);
template void quantize_row_q8_k<float>(const float*, std::int64_t, BlockQ8K*);
template void quantize_row_q8_k<bf16>(const bf16*, std::int64_t, BlockQ8K*);
template void gemv_quant<float, float>(QuantType, std::int64_t, std::int64_t, std::int64_t,
                                       const float*, std::int64_t, const std::uint8_t*,
                                       const float*, float*, std::int64_t, void*);
template void gemv_quant<bf16, bf16>(QuantType, std::int64_t, std::int64_t, std::int64_t,
                                     const bf16*, std::int64_t, const std::uint8_t*, const bf16*,
                                     bf16*, std::int64_t, void*);

}  // namespace kiln::cpu
