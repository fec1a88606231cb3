// The quantized GEMV's tiles on AVX2: 8 W rows, one 32-bit lane of a 256-bit vector per row
// (see gemv_quant_tiles.h). The same loads, transpose and scale unpacking as the AVX512-VNNI
// tiles, on half the rows; the integer products go through vpmaddubsw (u8 x s8 -> i16 pairs) and
// vpmaddwd with ones (-> i32) instead of vpdpbusd. Each integer sum is the same exact value as
// the VNNI tile's, and each output's f32 arithmetic is the same fmas in the same order, so an
// output's bits are the VNNI tile's (the tests compare both with one scalar formula).
//
// vpmaddubsw saturates a pair sum past 32767, so each code range decides how many products may
// share an i16 before vpmaddwd widens them:
//   Q4_K  nibbles 0..15 times x, |x| <= 127:  pairs <= 3810, 8 chunks per widening.
//   Q6_K  codes 0..63 times x:                pairs <= 16002, 2 chunks per widening.
// Q8_0 has none: its signed codes need sign(x, w) per row and chunk, and that tile decoded more
// slowly than the one-row kernel (gemv_quant.cpp: tile_width).
#include <cstring>

#include "kernels/common/error.h"
#include "kernels/cpu/gemv_quant_tiles.h"
#include "kernels/cpu/isa.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

namespace kiln::cpu::tiles {

#if KILN_CPU_X86
namespace {

// The 32 bytes at p + i * row_bytes of rows i = 0..7, transposed: out[c] lane j = bytes
// 4c..4c+3 of row j (the 8x8 dword transpose).
KILN_TARGET_AVX2 inline void load_rows_8x32(const std::uint8_t* p, std::int64_t row_bytes,
                                            __m256i out[8]) {
  __m256i r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i, p += row_bytes)
    r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // u[4h + c]: dword c (low lane) and c + 4 (high) of rows 4h..
    const __m256i* tt = t + 4 * h;
    u[4 * h + 0] = _mm256_unpacklo_epi64(tt[0], tt[2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(tt[0], tt[2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(tt[1], tt[3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(tt[1], tt[3]);
  }
  for (int c = 0; c < 4; ++c) {
    out[c] = _mm256_permute2x128_si256(u[c], u[c + 4], 0x20);
    out[c + 4] = _mm256_permute2x128_si256(u[c], u[c + 4], 0x31);
  }
}

// The 16 bytes at p + i * row_bytes of rows i = 0..7, transposed: out[k] lane i = dword k of row
// i (the 8x4 dword transpose), for the super-block headers (scales, d): the 8-row twin of
// gemv_quant_tiles.cpp's load_rows_16x16 (the widths need their own vector types). Four
// vpgatherdd did this before; AMD microcodes them (about 20 cycles each on Zen 2). On an AVX2-only
// EPYC, Q4_K_M Qwen3-0.6B decode in 4 alternated pairs: 28.3-35.3 tok/s against 25.1-32.3.
KILN_TARGET_AVX2 inline void load_rows_8x16(const std::uint8_t* p, std::int64_t row_bytes,
                                            __m256i out[4]) {
  __m256i a[4];  // a[i]: row i in the low lane, row i + 4 in the high lane
  for (int i = 0; i < 4; ++i)
    a[i] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p + (i + 4) * row_bytes),
                               reinterpret_cast<const __m128i*>(p + i * row_bytes));
  const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
}

// The f16 at p + i * row_bytes of rows i = 0..7, as f32.
KILN_TARGET_AVX2 inline __m256 f16_rows8(const std::uint8_t* p, std::int64_t row_bytes) {
  alignas(16) std::uint16_t h[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&h[i], p + i * row_bytes, 2);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

// The low halves of 8 dwords, as f16, to f32.
KILN_TARGET_AVX2 inline __m256 low_f16_to_f32(__m256i v) {
  const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
  return _mm256_cvtph_ps(packed);
}

// As prefetch_share in gemv_quant_tiles.cpp: the tile after next, into L2, in address order.
KILN_TARGET_AVX2 inline void prefetch_share8(const std::uint8_t* ahead, std::int64_t bytes) {
  for (std::int64_t i = 0; i < bytes; i += 64)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + i), _MM_HINT_T1);
}

KILN_TARGET_AVX2 inline __m256i bcast(const std::int8_t* p) {
  return _mm256_set1_epi32(load_i32(p));
}

// ---- Q4_K -----------------------------------------------------------------------------------
// Per output, per super-block: acc = fma(float(sumi), d_w d_x, acc); acc = fma(-float(summ),
// dmin_w d_x, acc), sumi and summ as gemv_quant_tiles.cpp states them.
KILN_TARGET_AVX2 void q4_k_tile8(const std::uint8_t* w, std::int64_t row_bytes,
                                 const std::uint8_t* x, std::int64_t xstride,
                                 const std::int32_t* x_pairs, std::int64_t nb, std::int64_t M,
                                 float* acc) {
  for (std::int64_t m = 0; m < M; ++m) _mm256_storeu_ps(acc + 8 * m, _mm256_setzero_ps());
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0F), byte = _mm256_set1_epi32(0xFF);
  const __m256i low6 = _mm256_set1_epi8(0x3F), bits45 = _mm256_set1_epi8(0x30);
  const __m256i words = _mm256_set1_epi32(0x00FF00FF);
  const std::uint8_t* ahead = w + 16 * row_bytes;
  alignas(32) std::int32_t sumi[32 * 8];
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 144;
    prefetch_share8(ahead + b * 8 * 144, 8 * 144);
    __m256i head[4];  // d | dmin << 16, then the 12 scale bytes
    load_rows_8x16(blk, row_bytes, head);
    const __m256i v0 = head[0], s1 = head[1], s2 = head[2], s3 = head[3];
    const __m256 dw = low_f16_to_f32(v0);
    const __m256 dmin = low_f16_to_f32(_mm256_srli_epi32(v0, 16));
    const __m256i sc_a = _mm256_and_si256(s1, low6), m_a = _mm256_and_si256(s2, low6);
    const __m256i sc_b = _mm256_or_si256(_mm256_and_si256(s3, low4),
                                         _mm256_and_si256(_mm256_srli_epi32(s1, 2), bits45));
    const __m256i m_b = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s3, 4), low4),
                                        _mm256_and_si256(_mm256_srli_epi32(s2, 2), bits45));
    const __m256i mp[4] = {
        _mm256_and_si256(m_a, words), _mm256_and_si256(_mm256_srli_epi32(m_a, 8), words),
        _mm256_and_si256(m_b, words), _mm256_and_si256(_mm256_srli_epi32(m_b, 8), words)};
    for (std::int64_t m = 0; m < M; ++m)
      _mm256_store_si256(reinterpret_cast<__m256i*>(sumi + 8 * m), _mm256_setzero_si256());
    for (int g = 0; g < 4; ++g) {
      __m256i t[8], lo[8], hi[8];
      load_rows_8x32(blk + 16 + 32 * g, row_bytes, t);
      for (int c = 0; c < 8; ++c) {
        lo[c] = _mm256_and_si256(t[c], low4);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(t[c], 4), low4);
      }
      const __m256i sc_packed = g < 2 ? sc_a : sc_b;
      const int shift = 16 * (g % 2);
      const __m256i sc_lo = _mm256_and_si256(_mm256_srli_epi32(sc_packed, shift), byte);
      const __m256i sc_hi = _mm256_and_si256(_mm256_srli_epi32(sc_packed, shift + 8), byte);
      for (std::int64_t m = 0; m < M; ++m) {
        const std::int8_t* xq = reinterpret_cast<const BlockQ8K*>(x + m * xstride)[b].q + 64 * g;
        __m256i a = _mm256_setzero_si256(), h = _mm256_setzero_si256();  // i16: 8 x 3810 fits
        for (int c = 0; c < 8; ++c) {
          a = _mm256_add_epi16(a, _mm256_maddubs_epi16(lo[c], bcast(xq + 4 * c)));
          h = _mm256_add_epi16(h, _mm256_maddubs_epi16(hi[c], bcast(xq + 32 + 4 * c)));
        }
        const __m256i part =
            _mm256_add_epi32(_mm256_mullo_epi32(_mm256_madd_epi16(a, ones), sc_lo),
                             _mm256_mullo_epi32(_mm256_madd_epi16(h, ones), sc_hi));
        auto* sp = reinterpret_cast<__m256i*>(sumi + 8 * m);
        _mm256_store_si256(sp, _mm256_add_epi32(_mm256_load_si256(sp), part));
      }
    }
    for (std::int64_t m = 0; m < M; ++m) {
      const auto* xb = reinterpret_cast<const BlockQ8K*>(x + m * xstride) + b;
      const std::int32_t* pairs = x_pairs + 4 * (m * nb + b);
      __m256i summ = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k)
        summ = _mm256_add_epi32(summ, _mm256_madd_epi16(mp[k], _mm256_set1_epi32(pairs[k])));
      const __m256 dx = _mm256_set1_ps(xb->d);
      __m256 a = _mm256_loadu_ps(acc + 8 * m);
      a = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sumi + 8 * m))),
          _mm256_mul_ps(dw, dx), a);
      a = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmin, dx), a);
      _mm256_storeu_ps(acc + 8 * m, a);
    }
  }
}

// ---- Q6_K -----------------------------------------------------------------------------------
// Per output, per super-block: acc = fma(float(sum_g sc_g isum_g - 32 sum_g sc_g bsums_g),
// d_w d_x, acc) (gemv_quant_tiles.cpp).
KILN_TARGET_AVX2 void q6_k_tile8(const std::uint8_t* w, std::int64_t row_bytes,
                                 const std::uint8_t* x, std::int64_t xstride,
                                 const std::int32_t* x_pairs, std::int64_t nb, std::int64_t M,
                                 float* acc) {
  for (std::int64_t m = 0; m < M; ++m) _mm256_storeu_ps(acc + 8 * m, _mm256_setzero_ps());
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
  const std::uint8_t* ahead = w + 16 * row_bytes;
  alignas(32) std::int32_t sumi[32 * 8];
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 210;
    prefetch_share8(ahead + b * 8 * 210, 8 * 210);
    __m256i sc[16], sp[8], scales[4];
    load_rows_8x16(blk + 192, row_bytes, scales);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = scales[j];
      for (int k = 0; k < 4; ++k)
        sc[4 * j + k] = _mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * k), 24);
      sp[2 * j] = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
      sp[2 * j + 1] = _mm256_srai_epi16(v, 8);
    }
    const __m256 dw = f16_rows8(blk + 208, row_bytes);
    for (std::int64_t m = 0; m < M; ++m)
      _mm256_store_si256(reinterpret_cast<__m256i*>(sumi + 8 * m), _mm256_setzero_si256());
    for (int h = 0; h < 2; ++h) {
      __m256i qh[8];
      load_rows_8x32(blk + 128 + 32 * h, row_bytes, qh);
      for (int half_ql = 0; half_ql < 2; ++half_ql) {
        __m256i ql[8];
        load_rows_8x32(blk + 64 * h + 32 * half_ql, row_bytes, ql);
        for (int r = half_ql; r < 4; r += 2) {
          __m256i q[8];
          for (int c = 0; c < 8; ++c) {
            const __m256i nib = r >= 2 ? _mm256_and_si256(_mm256_srli_epi16(ql[c], 4), low4)
                                       : _mm256_and_si256(ql[c], low4);
            const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh[c], 2 * r), two);
            q[c] = _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));
          }
          const int g = 8 * h + 2 * r;
          for (std::int64_t m = 0; m < M; ++m) {
            const std::int8_t* xq =
                reinterpret_cast<const BlockQ8K*>(x + m * xstride)[b].q + 128 * h + 32 * r;
            __m256i isum[2];
            for (int k = 0; k < 2; ++k) {  // sub-block g + k: chunks 4k..4k+3, two per i16 sum
              const int c = 4 * k;
              const __m256i p01 =
                  _mm256_add_epi16(_mm256_maddubs_epi16(q[c], bcast(xq + 4 * c)),
                                   _mm256_maddubs_epi16(q[c + 1], bcast(xq + 4 * c + 4)));
              const __m256i p23 =
                  _mm256_add_epi16(_mm256_maddubs_epi16(q[c + 2], bcast(xq + 4 * c + 8)),
                                   _mm256_maddubs_epi16(q[c + 3], bcast(xq + 4 * c + 12)));
              isum[k] =
                  _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones));
            }
            const __m256i part = _mm256_add_epi32(_mm256_mullo_epi32(isum[0], sc[g]),
                                                  _mm256_mullo_epi32(isum[1], sc[g + 1]));
            auto* spm = reinterpret_cast<__m256i*>(sumi + 8 * m);
            _mm256_store_si256(spm, _mm256_add_epi32(_mm256_load_si256(spm), part));
          }
        }
      }
    }
    for (std::int64_t m = 0; m < M; ++m) {
      const auto* xb = reinterpret_cast<const BlockQ8K*>(x + m * xstride) + b;
      const std::int32_t* pairs = x_pairs + 8 * (m * nb + b);
      __m256i corr = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k)
        corr = _mm256_add_epi32(corr, _mm256_madd_epi16(sp[k], _mm256_set1_epi32(pairs[k])));
      const __m256i total =
          _mm256_sub_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(sumi + 8 * m)),
                           _mm256_slli_epi32(corr, 5));
      _mm256_storeu_ps(acc + 8 * m, _mm256_fmadd_ps(_mm256_cvtepi32_ps(total),
                                                    _mm256_mul_ps(dw, _mm256_set1_ps(xb->d)),
                                                    _mm256_loadu_ps(acc + 8 * m)));
    }
  }
}

}  // namespace

void gemv_tile8_avx2(quant::QuantType t, const std::uint8_t* w, std::int64_t row_bytes,
                     const std::uint8_t* x, std::int64_t xstride, const std::int32_t* x_extra,
                     std::int64_t nb, std::int64_t M, float* acc) {
  KILN_CHECK(M <= 32, "[gemv_quant] a tile takes at most 32 rows of x, got {}", M);
  switch (t) {
    case quant::QuantType::Q8_0:
      fail("[gemv_quant] Q8_0 has no AVX2 tile (its one-row kernel decodes faster)");
    case quant::QuantType::Q4_K:
      return q4_k_tile8(w, row_bytes, x, xstride, x_extra, nb, M, acc);
    case quant::QuantType::Q6_K:
      break;
  }
  q6_k_tile8(w, row_bytes, x, xstride, x_extra, nb, M, acc);
}
#else
void gemv_tile8_avx2(quant::QuantType, const std::uint8_t*, std::int64_t, const std::uint8_t*,
                     std::int64_t, const std::int32_t*, std::int64_t, std::int64_t, float*) {
  KILN_CHECK(false, "[gemv_quant] the AVX2 tiles need x86");
}
#endif

}  // namespace kiln::cpu::tiles
