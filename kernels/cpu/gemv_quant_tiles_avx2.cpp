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
//   Q8_0  |w| (u8, up to 128) times sign(x, w): pairs <= 32512, every chunk widened.
//
// One row of x (decode) takes q8_0_tile8_row / q4_k_tile8_row / q6_k_tile8_row: the same integer
// sums and fmas.
// The Q4_K one keeps its sums in registers and uses each chunk as it is unpacked (31% fewer
// instructions than the general tile at M = 1, callgrind, 1024 x 1024); the Q6_K one does not
// transpose at all (each row's codes against x's bytes as they lie, the rows' sums reduced once
// per super-block): 946 instructions per super-block against the general tile's 1,639. The Q8_0
// one does the same on 32-value blocks: 81 instructions per block of 8 rows against 141 for
// dot_q8_0_avx2 row by row (callgrind, 1024 x 1024).
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

// The 32 bytes at p + i * row_bytes of rows i = 0..7, half transposed: u[c] (c < 4) holds dword
// c of rows 0-3 in its low lane and dword c + 4 of rows 0-3 in its high lane, u[c + 4] the same
// of rows 4-7; chunk_pair finishes the transpose a pair of chunks at a time.
KILN_TARGET_AVX2 inline void load_rows_8x32_lanes(const std::uint8_t* p, std::int64_t row_bytes,
                                                  __m256i u[8]) {
  __m256i r[8], t[8];
  for (int i = 0; i < 8; ++i, p += row_bytes)
    r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    const __m256i* tt = t + 4 * h;
    u[4 * h + 0] = _mm256_unpacklo_epi64(tt[0], tt[2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(tt[0], tt[2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(tt[1], tt[3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(tt[1], tt[3]);
  }
}

// Chunks c and c + 4 (c < 4) of load_rows_8x32_lanes's u: lane j = bytes 4c..4c+3 (resp.
// 4c+16..4c+19) of row j.
KILN_TARGET_AVX2 inline void chunk_pair(const __m256i u[8], int c, __m256i* lo, __m256i* hi) {
  *lo = _mm256_permute2x128_si256(u[c], u[c + 4], 0x20);
  *hi = _mm256_permute2x128_si256(u[c], u[c + 4], 0x31);
}

// The 32 bytes at p + i * row_bytes of rows i = 0..7, transposed: out[c] lane j = bytes
// 4c..4c+3 of row j (the 8x8 dword transpose).
KILN_TARGET_AVX2 inline void load_rows_8x32(const std::uint8_t* p, std::int64_t row_bytes,
                                            __m256i out[8]) {
  __m256i u[8];
  load_rows_8x32_lanes(p, row_bytes, u);
  for (int c = 0; c < 4; ++c) chunk_pair(u, c, &out[c], &out[c + 4]);
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
// A Q4_K super-block's header for 8 rows (lane j = row j): d and dmin as f32; the eight 6-bit
// scales packed as bytes, sub-blocks 0-3 in sc_a and 4-7 in sc_b (as quant::q4_k_scale_min
// unpacks them); the mins as i16 pairs matching q4_k_x_pairs: (m0, m2), (m1, m3), (m4, m6),
// (m5, m7).
struct Q4kHead {
  __m256 dw, dmin;
  __m256i sc_a, sc_b, mp[4];
};
KILN_TARGET_AVX2 inline Q4kHead q4_k_head8(const std::uint8_t* blk, std::int64_t row_bytes) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low6 = _mm256_set1_epi8(0x3F);
  const __m256i bits45 = _mm256_set1_epi8(0x30), words = _mm256_set1_epi32(0x00FF00FF);
  __m256i head[4];  // d | dmin << 16, then the 12 scale bytes
  load_rows_8x16(blk, row_bytes, head);
  const __m256i v0 = head[0], s1 = head[1], s2 = head[2], s3 = head[3];
  Q4kHead h;
  h.dw = low_f16_to_f32(v0);
  h.dmin = low_f16_to_f32(_mm256_srli_epi32(v0, 16));
  h.sc_a = _mm256_and_si256(s1, low6);
  h.sc_b = _mm256_or_si256(_mm256_and_si256(s3, low4),
                           _mm256_and_si256(_mm256_srli_epi32(s1, 2), bits45));
  const __m256i m_a = _mm256_and_si256(s2, low6);
  const __m256i m_b = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s3, 4), low4),
                                      _mm256_and_si256(_mm256_srli_epi32(s2, 2), bits45));
  h.mp[0] = _mm256_and_si256(m_a, words);
  h.mp[1] = _mm256_and_si256(_mm256_srli_epi32(m_a, 8), words);
  h.mp[2] = _mm256_and_si256(m_b, words);
  h.mp[3] = _mm256_and_si256(_mm256_srli_epi32(m_b, 8), words);
  return h;
}

// Group g's (0..3) two scales, of sub-blocks 2g and 2g + 1: one 6-bit value per dword (row).
KILN_TARGET_AVX2 inline void q4_k_group_scales(const Q4kHead& hd, int g, __m256i* sc_lo,
                                               __m256i* sc_hi) {
  const __m256i byte = _mm256_set1_epi32(0xFF);
  const __m256i sc_packed = g < 2 ? hd.sc_a : hd.sc_b;
  const int shift = 16 * (g % 2);
  *sc_lo = _mm256_and_si256(_mm256_srli_epi32(sc_packed, shift), byte);
  *sc_hi = _mm256_and_si256(_mm256_srli_epi32(sc_packed, shift + 8), byte);
}

// summ = sum_s m_s xs_s per row, from the mins' i16 pairs and x's four pairs (q4_k_x_pairs).
KILN_TARGET_AVX2 inline __m256i q4_k_min_sum(const Q4kHead& hd, const std::int32_t* pairs) {
  __m256i summ = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k)
    summ = _mm256_add_epi32(summ, _mm256_madd_epi16(hd.mp[k], _mm256_set1_epi32(pairs[k])));
  return summ;
}

// Per output, per super-block: acc = fma(float(sumi), d_w d_x, acc); acc = fma(-float(summ),
// dmin_w d_x, acc), sumi and summ as gemv_quant_tiles.cpp states them.
KILN_TARGET_AVX2 void q4_k_tile8(const std::uint8_t* w, std::int64_t row_bytes,
                                 const std::uint8_t* x, std::int64_t xstride,
                                 const std::int32_t* x_pairs, std::int64_t nb, std::int64_t M,
                                 float* acc) {
  for (std::int64_t m = 0; m < M; ++m) _mm256_storeu_ps(acc + 8 * m, _mm256_setzero_ps());
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F);
  const std::uint8_t* ahead = w + 16 * row_bytes;
  alignas(32) std::int32_t sumi[32 * 8];
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 144;
    prefetch_share8(ahead + b * 8 * 144, 8 * 144);
    const Q4kHead hd = q4_k_head8(blk, row_bytes);
    for (std::int64_t m = 0; m < M; ++m)
      _mm256_store_si256(reinterpret_cast<__m256i*>(sumi + 8 * m), _mm256_setzero_si256());
    for (int g = 0; g < 4; ++g) {
      __m256i t[8], lo[8], hi[8];
      load_rows_8x32(blk + 16 + 32 * g, row_bytes, t);
      for (int c = 0; c < 8; ++c) {
        lo[c] = _mm256_and_si256(t[c], low4);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(t[c], 4), low4);
      }
      __m256i sc_lo, sc_hi;
      q4_k_group_scales(hd, g, &sc_lo, &sc_hi);
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
      const __m256i summ = q4_k_min_sum(hd, x_pairs + 4 * (m * nb + b));
      const __m256 dx = _mm256_set1_ps(xb->d);
      __m256 a = _mm256_loadu_ps(acc + 8 * m);
      a = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sumi + 8 * m))),
          _mm256_mul_ps(hd.dw, dx), a);
      a = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(hd.dmin, dx), a);
      _mm256_storeu_ps(acc + 8 * m, a);
    }
  }
}

// q4_k_tile8 for one row of x, decode's shape. The same integer sums and the same f32 fmas in
// the same order, so the same bits; what changes is where the work goes: the sums stay in
// registers, each chunk's nibbles are used as they are unpacked (the general tile keeps all 16
// unpacked chunks for its M rows, which AVX2's 16 registers cannot hold, so they go through the
// stack), and the scale multiply folds into vpmaddwd: a dword of sc16 holds the 6-bit scale in
// both i16 halves, so madd(a, sc16) = (a_lo + a_hi) * sc, the general tile's
// mullo(madd(a, ones), sc).
KILN_TARGET_AVX2 void q4_k_tile8_row(const std::uint8_t* w, std::int64_t row_bytes,
                                     const BlockQ8K* x, const std::int32_t* x_pairs,
                                     std::int64_t nb, float* acc) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const std::uint8_t* ahead = w + 16 * row_bytes;
  __m256 sum = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 144;
    prefetch_share8(ahead + b * 8 * 144, 8 * 144);
    const Q4kHead hd = q4_k_head8(blk, row_bytes);
    // The min term's integer sum first, so that fewer vectors live through the loop.
    const __m256i summ = q4_k_min_sum(hd, x_pairs + 4 * b);
    const std::int8_t* xq = x[b].q;
    __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      __m256i u[8];
      load_rows_8x32_lanes(blk + 16 + 32 * g, row_bytes, u);
      const std::int8_t* xg = xq + 64 * g;
      // Chunks in the order c, c + 4 as each pair is transposed (the i16 sums are exact in any
      // order: at most 8 x 3810).
      __m256i a = _mm256_setzero_si256(), h = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        __m256i t[2];
        chunk_pair(u, c, &t[0], &t[1]);
        for (int e = 0; e < 2; ++e) {
          const int k = 4 * c + 16 * e;  // chunk c + 4e's byte offset
          a = _mm256_add_epi16(a,
                               _mm256_maddubs_epi16(_mm256_and_si256(t[e], low4), bcast(xg + k)));
          h = _mm256_add_epi16(
              h, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(t[e], 4), low4),
                                      bcast(xg + 32 + k)));
        }
      }
      __m256i sc_lo, sc_hi;
      q4_k_group_scales(hd, g, &sc_lo, &sc_hi);
      const __m256i sc16_lo = _mm256_or_si256(sc_lo, _mm256_slli_epi32(sc_lo, 16));
      const __m256i sc16_hi = _mm256_or_si256(sc_hi, _mm256_slli_epi32(sc_hi, 16));
      sumi = _mm256_add_epi32(
          sumi, _mm256_add_epi32(_mm256_madd_epi16(a, sc16_lo), _mm256_madd_epi16(h, sc16_hi)));
    }
    const __m256 dx = _mm256_set1_ps(x[b].d);
    sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(hd.dw, dx), sum);
    sum = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(hd.dmin, dx), sum);
  }
  _mm256_storeu_ps(acc, sum);
}

// ---- Q6_K -----------------------------------------------------------------------------------
// The 16 signed scales (four per dword of scales[0..3], as load_rows_8x16 gives them) as i16
// pairs matching q6_k_x_pairs: sp[2j] = (sc[4j], sc[4j + 2]), sp[2j + 1] = (sc[4j + 1],
// sc[4j + 3]).
KILN_TARGET_AVX2 inline void q6_k_scale_pairs(const __m256i scales[4], __m256i sp[8]) {
  for (int j = 0; j < 4; ++j) {
    sp[2 * j] = _mm256_srai_epi16(_mm256_slli_epi16(scales[j], 8), 8);
    sp[2 * j + 1] = _mm256_srai_epi16(scales[j], 8);
  }
}

// sum_g sc_g bsums_g per row, from sp and x's eight pairs (q6_k_x_pairs).
KILN_TARGET_AVX2 inline __m256i q6_k_correction(const __m256i sp[8], const std::int32_t* pairs) {
  __m256i corr = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k)
    corr = _mm256_add_epi32(corr, _mm256_madd_epi16(sp[k], _mm256_set1_epi32(pairs[k])));
  return corr;
}

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
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 4; ++k)
        sc[4 * j + k] = _mm256_srai_epi32(_mm256_slli_epi32(scales[j], 24 - 8 * k), 24);
    q6_k_scale_pairs(scales, sp);
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
      const __m256i corr = q6_k_correction(sp, x_pairs + 8 * (m * nb + b));
      const __m256i total =
          _mm256_sub_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(sumi + 8 * m)),
                           _mm256_slli_epi32(corr, 5));
      _mm256_storeu_ps(acc + 8 * m, _mm256_fmadd_ps(_mm256_cvtepi32_ps(total),
                                                    _mm256_mul_ps(dw, _mm256_set1_ps(xb->d)),
                                                    _mm256_loadu_ps(acc + 8 * m)));
    }
  }
}

// One row of a Q6_K super-block against x, untransposed: the row's 256 codes as eight vectors of
// 32 in weight order, each times x's 32 (vpmaddubsw, x as the signed operand), times its two
// sub-blocks' scales (vpmaddwd with [sc_g x 8 | sc_g+1 x 8]), less 32 sum_g sc_g bsums_g; the
// integer total of the row is the horizontal sum of the returned lanes. Layout (llama.cpp's):
// ql[128], qh[64], scales[16], d; in half h, the 32-weight group r takes low nibbles of
// ql[64h + 32(r % 2) ...] for r < 2 and high ones for r >= 2, and bits 2r..2r+1 of qh[32h ...].
KILN_TARGET_AVX2 inline __m256i q6_k_row_sums(const std::uint8_t* blk, const std::int8_t* xq,
                                              __m256i bsums) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  // The 16 scales in both lanes; each group's `pick` puts scale g in every i16 of the low lane and
  // scale g + 1 in every i16 of the high lane (as the high byte: the shift sign-extends it).
  const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
  const __m256i sc8 = _mm256_broadcastsi128_si256(scales);
  __m256i acc = _mm256_sub_epi32(
      _mm256_setzero_si256(),
      _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), bsums), 5));
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
    const __m256i q[4] = {_mm256_or_si256(_mm256_and_si256(ql0, low4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
                          _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
                          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                          _mm256_and_si256(qh, bits45)),
                          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45))};
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const int g = 8 * h + 2 * r;
      const __m256i pick = _mm256_setr_epi8(-128, g, -128, g, -128, g, -128, g, -128, g, -128, g,
                                            -128, g, -128, g,  //
                                            -128, g + 1, -128, g + 1, -128, g + 1, -128, g + 1,
                                            -128, g + 1, -128, g + 1, -128, g + 1, -128, g + 1);
      const __m256i sc16 = _mm256_srai_epi16(_mm256_shuffle_epi8(sc8, pick), 8);
      const __m256i x32 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 128 * h + 32 * r));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], x32), sc16));
    }
  }
  return acc;
}

// Lane i of the result = the sum of the eight i32 lanes of a[i].
KILN_TARGET_AVX2 inline __m256i hsum_8x8(const __m256i a[8]) {
  const __m256i t0 = _mm256_hadd_epi32(a[0], a[1]), t1 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i t2 = _mm256_hadd_epi32(a[4], a[5]), t3 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  // u0: rows 0-3 over lanes 0-3 of each, then rows 0-3 over lanes 4-7; u1 the same for rows 4-7.
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

// The untransposed one-row tiles' frame (q6_k_tile8_row, q8_0_tile8_row): per block, row_sums
// gives each of the 8 rows' sum as 8 i32 lanes, hsum_8x8 reduces them (exact), and
// acc_j = fma(float(total_j), d_wj * d_x, acc_j) with d_w the f16 at d_offset of each row's block;
// the tile after next is prefetched into L2 meanwhile.
template <class XBlock, class RowSums>
KILN_TARGET_AVX2 inline void tile8_row(const std::uint8_t* w, std::int64_t row_bytes,
                                       std::int64_t nb, std::int64_t block_bytes,
                                       std::int64_t d_offset, const XBlock* x, float* acc,
                                       RowSums row_sums) {
  const std::uint8_t* ahead = w + 16 * row_bytes;
  __m256 sum = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * block_bytes;
    prefetch_share8(ahead + b * 8 * block_bytes, 8 * block_bytes);
    __m256i rows[8];
    row_sums(blk, b, rows);
    const __m256 d = _mm256_mul_ps(f16_rows8(blk + d_offset, row_bytes), _mm256_set1_ps(x[b].d));
    sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_8x8(rows)), d, sum);
  }
  _mm256_storeu_ps(acc, sum);
}

// q6_k_tile8 for one row of x, as q4_k_tile8_row is q4_k_tile8's: the same integer total per
// row and super-block, sum_g sc_g isum_g - 32 sum_g sc_g bsums_g (exact in i32, so in any order),
// and the same fma per super-block, so the same bits. Unlike the general tile it does not
// transpose: each row's codes meet x's 32 bytes as they lie (q6_k_row_sums), and the eight rows'
// sums are reduced once per super-block (hsum_8x8). The transposes and x broadcasts cost more than
// that on AVX2: callgrind, 946 instructions per tile and super-block (931 before tile8_row
// became its frame, shared with Q8_0) against 1,147 transposed;
// one thread in L2, 14-18 GB/s against 11-12 (docs/quantization.md).
KILN_TARGET_AVX2 void q6_k_tile8_row(const std::uint8_t* w, std::int64_t row_bytes,
                                     const BlockQ8K* x, std::int64_t nb, float* acc) {
  tile8_row(w, row_bytes, nb, 210, 208, x, acc,
            [=](const std::uint8_t* blk, std::int64_t b, __m256i rows[8]) KILN_TARGET_AVX2 {
              const __m256i bsums =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].bsums));
#pragma GCC unroll 8
              for (int i = 0; i < 8; ++i)
                rows[i] = q6_k_row_sums(blk + i * row_bytes, x[b].q, bsums);
            });
}

// ---- Q8_0 -----------------------------------------------------------------------------------
// Per block, the exact integer sum of each of the 8 rows against x, then one fma per row:
// acc_j = fma(float(sum_i w_ji q_i), d_wj * d_x, acc_j), the 16-row VNNI tile's formula. The
// codes are signed on both sides, so each product pair goes through |w| (u8) times sign(x, w)
// (s8): at most 2 * 128 * 127 per i16 pair, and vpmaddwd widens every chunk at once.
//
// With several x rows, each block's 8 W rows are transposed once (load_rows_8x32) and meet every
// row's broadcast x dwords: 4 vector instructions per 32 products (sign, vpmaddubsw, vpmaddwd,
// add) and one conversion and fma per row, block and 8 W rows. dot_q8_0_avx2 row by row runs
// 17.6 instructions per 32 products (callgrind; its own conversion, scale and fma per W row and
// block), and a 4 x 2 register tile of it (x rows by W rows, each pair its own accumulator) about
// 9 in its loop: one thread, 1024 x 1024 and 1024 x 3072 with 128 x rows, on the AVX2 EPYC,
// 35-41 GMAC/s for this tile against 20-27 for that one.
KILN_TARGET_AVX2 void q8_0_tile8(const std::uint8_t* w, std::int64_t row_bytes,
                                 const std::uint8_t* x, std::int64_t xstride, std::int64_t nb,
                                 std::int64_t M, float* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  const std::uint8_t* ahead = w + 16 * row_bytes;
  for (std::int64_t m = 0; m < M; ++m) _mm256_storeu_ps(acc + 8 * m, _mm256_setzero_ps());
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 34;
    prefetch_share8(ahead + b * 8 * 34, 8 * 34);
    __m256i wq[8], wabs[8];
    load_rows_8x32(blk + 2, row_bytes, wq);
    for (int c = 0; c < 8; ++c) wabs[c] = _mm256_sign_epi8(wq[c], wq[c]);
    const __m256 dw = f16_rows8(blk, row_bytes);
    const std::uint8_t* xb = x + b * static_cast<std::int64_t>(sizeof(BlockQ8));
    for (std::int64_t m = 0; m < M; ++m, xb += xstride) {
      const auto& xm = *reinterpret_cast<const BlockQ8*>(xb);
      __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m256i p16 =
            _mm256_maddubs_epi16(wabs[c], _mm256_sign_epi8(bcast(xm.q + 4 * c), wq[c]));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p16, ones));
      }
      const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xm.d));
      _mm256_storeu_ps(acc + 8 * m,
                       _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), d, _mm256_loadu_ps(acc + 8 * m)));
    }
  }
}

// q8_0_tile8 for one row of x (decode), without the transpose: each W row's 32 codes meet x's as
// they lie (as dot_q8_0_avx2 did), and the 8 rows' i32 lanes are summed once per block
// (hsum_8x8). The integer sums are exact, so they and the fma are the general tile's: the same
// bits.
KILN_TARGET_AVX2 void q8_0_tile8_row(const std::uint8_t* w, std::int64_t row_bytes,
                                     const BlockQ8* x, std::int64_t nb, float* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  tile8_row(w, row_bytes, nb, 34, 0, x, acc,
            [=](const std::uint8_t* blk, std::int64_t b, __m256i rows[8]) KILN_TARGET_AVX2 {
              const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
#pragma GCC unroll 8
              for (int i = 0; i < 8; ++i) {
                const __m256i wq =
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + i * row_bytes + 2));
                const __m256i p16 =
                    _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
                rows[i] = _mm256_madd_epi16(p16, ones);
              }
            });
}

}  // namespace

void gemv_tile8_avx2(quant::QuantType t, const std::uint8_t* w, std::int64_t row_bytes,
                     const std::uint8_t* x, std::int64_t xstride, const std::int32_t* x_extra,
                     std::int64_t nb, std::int64_t M, float* acc) {
  KILN_CHECK(M <= 32, "[gemv_quant] a tile takes at most 32 rows of x, got {}", M);
  switch (t) {
    case quant::QuantType::Q8_0:
      if (M == 1) return q8_0_tile8_row(w, row_bytes, reinterpret_cast<const BlockQ8*>(x), nb, acc);
      return q8_0_tile8(w, row_bytes, x, xstride, nb, M, acc);
    case quant::QuantType::Q4_K:
      if (M == 1)
        return q4_k_tile8_row(w, row_bytes, reinterpret_cast<const BlockQ8K*>(x), x_extra, nb, acc);
      return q4_k_tile8(w, row_bytes, x, xstride, x_extra, nb, M, acc);
    case quant::QuantType::Q6_K:
      break;
  }
  if (M == 1) return q6_k_tile8_row(w, row_bytes, reinterpret_cast<const BlockQ8K*>(x), nb, acc);
  q6_k_tile8(w, row_bytes, x, xstride, x_extra, nb, M, acc);
}
#else
void gemv_tile8_avx2(quant::QuantType, const std::uint8_t*, std::int64_t, const std::uint8_t*,
                     std::int64_t, const std::int32_t*, std::int64_t, std::int64_t, float*) {
  KILN_CHECK(false, "[gemv_quant] the AVX2 tiles need x86");
}
#endif

}  // namespace kiln::cpu::tiles
