// The 16-row tiles of the quantized GEMV on AVX512-VNNI (see gemv_quant_tiles.h).
#include "kernels/cpu/gemv_quant_tiles.h"

#include <cstring>

#include "kernels/common/error.h"
#include "kernels/cpu/isa.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

namespace kiln::cpu::tiles {

namespace {
// lo and hi (each in i16 range) as the low and high i16 of a dword, for vpmaddwd.
std::int32_t i16_pair(int lo, int hi) {
  return static_cast<std::int32_t>(
      static_cast<std::uint16_t>(lo) |
      (static_cast<std::uint32_t>(static_cast<std::uint16_t>(hi)) << 16));
}
}  // namespace

void q8_0_x_corr(const BlockQ8* x, std::int64_t n, std::int32_t* x_corr) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::int32_t sum = 0;
    for (int j = 0; j < 32; ++j) sum += x[i].q[j];
    x_corr[i] = -128 * sum;
  }
}

void q4_k_x_pairs(const BlockQ8K* x, std::int64_t n, std::int32_t* x_pairs) {
  for (std::int64_t i = 0; i < n; ++i) {
    int xs[8];  // |xs| <= 32 * 127: fits an i16
    for (int s = 0; s < 8; ++s) xs[s] = x[i].bsums[2 * s] + x[i].bsums[2 * s + 1];
    x_pairs[4 * i + 0] = i16_pair(xs[0], xs[2]);
    x_pairs[4 * i + 1] = i16_pair(xs[1], xs[3]);
    x_pairs[4 * i + 2] = i16_pair(xs[4], xs[6]);
    x_pairs[4 * i + 3] = i16_pair(xs[5], xs[7]);
  }
}

void q6_k_x_pairs(const BlockQ8K* x, std::int64_t n, std::int32_t* x_pairs) {
  for (std::int64_t i = 0; i < n; ++i)
    for (int j = 0; j < 4; ++j) {
      const std::int16_t* bs = x[i].bsums + 4 * j;
      x_pairs[8 * i + 2 * j] = i16_pair(bs[0], bs[2]);
      x_pairs[8 * i + 2 * j + 1] = i16_pair(bs[1], bs[3]);
    }
}

#if KILN_CPU_X86
namespace {

// Rows 0-7 in the low halves and 8-15 in the high halves of r[0..7] (32 bytes each) become
// vectors whose dword lane j is dword c of row j: the 8x8 dword transpose of each half.
KILN_TARGET_AVX512VNNI inline void transpose_rows_16x8(const __m512i r[8], __m512i out[8]) {
  __m512i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // Per 128-bit lane, u[c] (c < 4) holds dword c (low lane of the half) or c + 4 (high lane) of
  // rows 0-3 (from t[0..3]); u[c + 4] of rows 4-7.
  for (int h = 0; h < 2; ++h) {
    const __m512i* tt = t + 4 * h;
    u[4 * h + 0] = _mm512_unpacklo_epi64(tt[0], tt[2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(tt[0], tt[2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(tt[1], tt[3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(tt[1], tt[3]);
  }
  // out[c] = rows 0-3 | rows 4-7 | rows 8-11 | rows 12-15 of dword c: the low (c < 4) or high
  // 128-bit lane of each half, from u[c % 4] (rows 0-3, 8-11) and u[c % 4 + 4] (rows 4-7, 12-15).
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int c = 0; c < 4; ++c) {
    out[c] = _mm512_permutex2var_epi64(u[c], lo, u[c + 4]);
    out[c + 4] = _mm512_permutex2var_epi64(u[c], hi, u[c + 4]);
  }
}

// The 32 bytes at p + i * row_bytes of rows i = 0..15, transposed: out[c] lane j = bytes
// 4c..4c+3 of row j.
KILN_TARGET_AVX512VNNI inline void load_rows_16x32(const std::uint8_t* p, std::int64_t row_bytes,
                                                   __m512i out[8]) {
  __m512i r[8];
  const std::int64_t half = 8 * row_bytes;
  for (int i = 0; i < 8; ++i, p += row_bytes) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + half));
    r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  transpose_rows_16x8(r, out);
}

// The 16 bytes at p + i * row_bytes of rows i = 0..15, transposed: out[c] lane i = dword c (bytes
// 4c..4c+3) of row i. Four 128-bit loads per vector (rows k, k + 4, k + 8, k + 12 in vector k)
// and a 4x4 dword transpose within each 128-bit lane, instead of four vpgatherdd (microcoded on
// AMD Zen 4): a Q4_K tile with its weights in L2 ran 13-19% faster on one thread; Q6_K, which
// still gathers d, moved within the noise.
KILN_TARGET_AVX512VNNI inline void load_rows_16x16(const std::uint8_t* p, std::int64_t row_bytes,
                                                   __m512i out[4]) {
  __m512i r[4];
  for (int k = 0; k < 4; ++k) {
    const auto row = [&](int i) { return reinterpret_cast<const __m128i*>(p + i * row_bytes); };
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(row(k)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128(row(k + 4)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128(row(k + 8)), 2);
    r[k] = _mm512_inserti32x4(v, _mm_loadu_si128(row(k + 12)), 3);
  }
  // Per 128-bit lane L (rows 4L..4L+3 in r[0..3]): t01 = (r0.d0, r1.d0, r0.d1, r1.d1), ...
  const __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

// Row offsets 0, row_bytes, ..., 15 row_bytes, for gathering one dword per row.
KILN_TARGET_AVX512VNNI inline __m512i row_offsets(std::int64_t row_bytes) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(row_bytes)));
}

// 16 rows at once are 16 read streams, which the hardware prefetchers follow badly (decode ran
// at half its bandwidth). The tile after next is 16 * row_bytes contiguous bytes, so it is
// fetched into L2 in address order, one 16 * block_bytes share per block: one stream.
KILN_TARGET_AVX512VNNI inline void prefetch_share(const std::uint8_t* ahead, std::int64_t bytes) {
  for (std::int64_t i = 0; i < bytes; i += 64)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + i), _MM_HINT_T1);
}

}  // namespace

// ---- Q8_0 -----------------------------------------------------------------------------------
//
// vpdpbusd multiplies u8 by s8 and AVX-512 has no byte sign instruction, so the weights are
// biased to u8 in registers (w + 128, one xor per vector) and each x row's block sum starts at
// -128 * sum_j q_j (x_corr, computed once per x row and block). Every product and sum is an
// exact integer (|sum| < 2^21), so the result per row and block is sum_j w_j q_j exactly.
//
// Per output, in block order:  acc = fma(float(isum_b), dw_b * dx_b, acc),  acc = 0 at first.
// That is the whole arithmetic, the same for any M and any thread count (a test evaluates it in
// scalar code and compares bits).

namespace {
KILN_TARGET_AVX512VNNI void gemv_q8_0_tile16_impl(const std::uint8_t* w, std::int64_t row_bytes,
                                                  const std::uint8_t* x, std::int64_t xstride,
                                                  const std::int32_t* x_corr, std::int64_t nb,
                                                  std::int64_t M, float* acc) {
  for (std::int64_t m = 0; m < M; ++m) _mm512_storeu_ps(acc + 16 * m, _mm512_setzero_ps());
  const __m512i rows = row_offsets(row_bytes);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const std::uint8_t* ahead = w + 32 * row_bytes;
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 34;
    prefetch_share(ahead + b * 16 * 34, 16 * 34);
    __m512i wv[8];
    load_rows_16x32(blk + 2, row_bytes, wv);
    for (int c = 0; c < 8; ++c) wv[c] = _mm512_xor_si512(wv[c], flip);
    // The 16 scales: a dword gathered at each row's block start, whose low half is d (f16).
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(rows, blk, 1)));
    for (std::int64_t m = 0; m < M; ++m) {
      const auto* xb = reinterpret_cast<const BlockQ8*>(x + m * xstride) + b;
      // Two chains of 4 (integer sums: exact in any order), each x dword broadcast from memory.
      __m512i s0 = _mm512_set1_epi32(x_corr[m * nb + b]), s1 = _mm512_setzero_si512();
      for (int c = 0; c < 8; c += 2) {
        s0 = _mm512_dpbusd_epi32(s0, wv[c], _mm512_set1_epi32(load_i32(xb->q + 4 * c)));
        s1 = _mm512_dpbusd_epi32(s1, wv[c + 1], _mm512_set1_epi32(load_i32(xb->q + 4 * c + 4)));
      }
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(xb->d));
      _mm512_storeu_ps(acc + 16 * m, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                                     scale, _mm512_loadu_ps(acc + 16 * m)));
    }
  }
}
}  // namespace

void gemv_q8_0_tile16(const std::uint8_t* w, std::int64_t row_bytes, const std::uint8_t* x,
                      std::int64_t xstride, const std::int32_t* x_corr, std::int64_t nb,
                      std::int64_t M, float* acc) {
  gemv_q8_0_tile16_impl(w, row_bytes, x, xstride, x_corr, nb, M, acc);
}

// ---- Q4_K -----------------------------------------------------------------------------------
//
// Per super-block of 256 (kernels/common/quant.h): group g = 0..3 is 32 bytes of each row, whose
// low nibbles are sub-block 2g and high nibbles 2g + 1. The nibbles are already u8 (0..15), so
// vpdpbusd takes them as they are: isum_s = sum_j q_j x_j over sub-block s, exact. Then, in int32
// (exact: |sumi| < 2^25, |summ| < 2^20):
//   sumi = sum_s sc_s isum_s   (vpmulld by each lane's 6-bit scale)
//   summ = sum_s m_s xs_s      (vpmaddwd of each lane's 6-bit mins, as i16 pairs, with x's
//                               sub-block sums, q4_k_x_pairs)
// and per output, super-blocks in order, from acc = 0:
//   acc = fma(float(sumi), d_w * d_x, acc);  acc = fma(-float(summ), dmin_w * d_x, acc).
// The 16 rows' d, dmin and packed scales (the first 16 bytes of each block) are loaded as four
// dwords per row (load_rows_16x16) and unpacked in registers as quant::q4_k_scale_min does.

namespace {
KILN_TARGET_AVX512VNNI void gemv_q4_k_tile16_impl(const std::uint8_t* w, std::int64_t row_bytes,
                                                  const std::uint8_t* x, std::int64_t xstride,
                                                  const std::int32_t* x_pairs, std::int64_t nb,
                                                  std::int64_t M, float* acc) {
  KILN_CHECK(M <= 32, "[gemv_quant] a Q4_K tile takes at most 32 rows of x, got {}", M);
  for (std::int64_t m = 0; m < M; ++m) _mm512_storeu_ps(acc + 16 * m, _mm512_setzero_ps());
  const __m512i low4 = _mm512_set1_epi8(0x0F), byte = _mm512_set1_epi32(0xFF);
  const __m512i low6 = _mm512_set1_epi8(0x3F), bits45 = _mm512_set1_epi8(0x30);
  const __m512i words = _mm512_set1_epi32(0x00FF00FF);
  const std::uint8_t* ahead = w + 32 * row_bytes;
  alignas(64) std::int32_t sumi[32 * 16];
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 144;
    prefetch_share(ahead + b * 16 * 144, 16 * 144);
    __m512i head[4];  // each row's first 16 bytes: d | dmin << 16, then the packed scales
    load_rows_16x16(blk, row_bytes, head);
    const __m512i v0 = head[0], s1 = head[1], s2 = head[2], s3 = head[3];
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v0));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v0, 16)));
    // Bytes of each lane: scales 0-3, 4-7 and mins 0-3, 4-7 (6 bits each). A dword shift moves
    // bits across bytes, but each mask keeps only bits that came from their own byte.
    const __m512i sc_a = _mm512_and_si512(s1, low6), m_a = _mm512_and_si512(s2, low6);
    const __m512i sc_b = _mm512_or_si512(_mm512_and_si512(s3, low4),
                                         _mm512_and_si512(_mm512_srli_epi32(s1, 2), bits45));
    const __m512i m_b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s3, 4), low4),
                                        _mm512_and_si512(_mm512_srli_epi32(s2, 2), bits45));
    // The mins as i16 pairs matching q4_k_x_pairs: (m0, m2), (m1, m3), (m4, m6), (m5, m7).
    const __m512i mp[4] = {
        _mm512_and_si512(m_a, words), _mm512_and_si512(_mm512_srli_epi32(m_a, 8), words),
        _mm512_and_si512(m_b, words), _mm512_and_si512(_mm512_srli_epi32(m_b, 8), words)};
    for (std::int64_t m = 0; m < M; ++m) _mm512_store_si512(sumi + 16 * m, _mm512_setzero_si512());
    for (int g = 0; g < 4; ++g) {
      __m512i t[8], lo[8], hi[8];
      load_rows_16x32(blk + 16 + 32 * g, row_bytes, t);
      for (int c = 0; c < 8; ++c) {
        lo[c] = _mm512_and_si512(t[c], low4);
        hi[c] = _mm512_and_si512(_mm512_srli_epi16(t[c], 4), low4);
      }
      const __m512i sc_packed = g < 2 ? sc_a : sc_b;
      const int shift = 16 * (g % 2);  // sub-blocks 2g, 2g + 1: bytes 2(g % 2), 2(g % 2) + 1
      const __m512i sc_lo = _mm512_and_si512(_mm512_srli_epi32(sc_packed, shift), byte);
      const __m512i sc_hi = _mm512_and_si512(_mm512_srli_epi32(sc_packed, shift + 8), byte);
      for (std::int64_t m = 0; m < M; ++m) {
        const std::int8_t* xq = reinterpret_cast<const BlockQ8K*>(x + m * xstride)[b].q + 64 * g;
        __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
        __m512i h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
        for (int c = 0; c < 8; c += 2) {
          a0 = _mm512_dpbusd_epi32(a0, lo[c], _mm512_set1_epi32(load_i32(xq + 4 * c)));
          a1 = _mm512_dpbusd_epi32(a1, lo[c + 1], _mm512_set1_epi32(load_i32(xq + 4 * c + 4)));
          h0 = _mm512_dpbusd_epi32(h0, hi[c], _mm512_set1_epi32(load_i32(xq + 32 + 4 * c)));
          h1 = _mm512_dpbusd_epi32(h1, hi[c + 1], _mm512_set1_epi32(load_i32(xq + 32 + 4 * c + 4)));
        }
        const __m512i part = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_add_epi32(a0, a1), sc_lo),
                                              _mm512_mullo_epi32(_mm512_add_epi32(h0, h1), sc_hi));
        _mm512_store_si512(sumi + 16 * m, _mm512_add_epi32(_mm512_load_si512(sumi + 16 * m), part));
      }
    }
    for (std::int64_t m = 0; m < M; ++m) {
      const auto* xb = reinterpret_cast<const BlockQ8K*>(x + m * xstride) + b;
      const std::int32_t* pairs = x_pairs + 4 * (m * nb + b);
      __m512i summ = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k)
        summ = _mm512_add_epi32(summ, _mm512_madd_epi16(mp[k], _mm512_set1_epi32(pairs[k])));
      const __m512 dx = _mm512_set1_ps(xb->d);
      __m512 a = _mm512_loadu_ps(acc + 16 * m);
      a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sumi + 16 * m)),
                          _mm512_mul_ps(dw, dx), a);
      a = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dmin, dx), a);
      _mm512_storeu_ps(acc + 16 * m, a);
    }
  }
}
}  // namespace

void gemv_q4_k_tile16(const std::uint8_t* w, std::int64_t row_bytes, const std::uint8_t* x,
                      std::int64_t xstride, const std::int32_t* x_pairs, std::int64_t nb,
                      std::int64_t M, float* acc) {
  gemv_q4_k_tile16_impl(w, row_bytes, x, xstride, x_pairs, nb, M, acc);
}
// ---- Q6_K -----------------------------------------------------------------------------------
//
// Per super-block of 256 (kernels/common/quant.h): half h = 0, 1 has 64 bytes of low nibbles
// (ql) and 32 bytes of high 2-bit pairs (qh); quarter r = 0..3 of the half takes the low (r < 2)
// or high (r >= 2) nibbles of ql[64 h + 32 (r & 1) + l] and bits 2r, 2r + 1 of qh[32 h + l], so
// q = nibble | bits << 4 is a u8 in 0..63 and the weight is d * sc_g * (q - 32), g = i / 16 the
// 16-value sub-block and sc_g a signed byte. With isum_g = sum_j q_j x_j (vpdpbusd, exact) and
// x's bsums (the sums of each 16 x values), in int32 (exact: |total| < 2^29):
//   total = sum_g sc_g isum_g - 32 sum_g sc_g bsums_g
// (vpmulld by each lane's scale; the second sum by vpmaddwd of the scales as i16 pairs with
// x's bsums, q6_k_x_pairs), and per output, super-blocks in order, from acc = 0:
//   acc = fma(float(total), d_w * d_x, acc).
// The 16 rows' scales (16 bytes at 192) are loaded as four dwords a row (load_rows_16x16), and d
// (at 208) is gathered.

namespace {
KILN_TARGET_AVX512VNNI void gemv_q6_k_tile16_impl(const std::uint8_t* w, std::int64_t row_bytes,
                                                  const std::uint8_t* x, std::int64_t xstride,
                                                  const std::int32_t* x_pairs, std::int64_t nb,
                                                  std::int64_t M, float* acc) {
  KILN_CHECK(M <= 32, "[gemv_quant] a Q6_K tile takes at most 32 rows of x, got {}", M);
  for (std::int64_t m = 0; m < M; ++m) _mm512_storeu_ps(acc + 16 * m, _mm512_setzero_ps());
  const __m512i rows = row_offsets(row_bytes);
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const std::uint8_t* ahead = w + 32 * row_bytes;
  alignas(64) std::int32_t sumi[32 * 16];
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 210;
    prefetch_share(ahead + b * 16 * 210, 16 * 210);
    // sc[g]: each lane's scale g, sign-extended to a dword; sp: the scales as i16 pairs,
    // sp[2j] = (sc_4j, sc_4j+2) and sp[2j+1] = (sc_4j+1, sc_4j+3), as q6_k_x_pairs pairs x's
    // bsums.
    __m512i sc[16], sp[8], packed[4];
    load_rows_16x16(blk + 192, row_bytes, packed);
    for (int j = 0; j < 4; ++j) {
      const __m512i v = packed[j];
      for (int k = 0; k < 4; ++k)
        sc[4 * j + k] = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * k), 24);
      sp[2 * j] = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8);
      sp[2 * j + 1] = _mm512_srai_epi16(v, 8);
    }
    // d: the high half of the dword at 206 (one at 208 would read past the block).
    const __m512 dw = _mm512_cvtph_ps(
        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_i32gather_epi32(rows, blk + 206, 1), 16)));
    for (std::int64_t m = 0; m < M; ++m) _mm512_store_si512(sumi + 16 * m, _mm512_setzero_si512());
    for (int h = 0; h < 2; ++h) {
      __m512i qh[8];
      load_rows_16x32(blk + 128 + 32 * h, row_bytes, qh);
      for (int half_ql = 0; half_ql < 2; ++half_ql) {  // ql bytes 64h + 32 half_ql: r = half_ql, +2
        __m512i ql[8];
        load_rows_16x32(blk + 64 * h + 32 * half_ql, row_bytes, ql);
        for (int r = half_ql; r < 4; r += 2) {
          // q = nibble | bits 2r, 2r + 1 of qh at bits 4, 5: qh's pair is moved there by one
          // 16-bit shift (a shift moves bits across the byte boundary, but the 0x30 mask keeps
          // only bits from their own byte), and one vpternlogd takes the low 4 bits of the
          // (shifted) ql and ors the pair in: (a & 0x0F) | b.
          __m512i q[8];
          for (int c = 0; c < 8; ++c) {
            const __m512i pair = _mm512_and_si512(r == 0   ? _mm512_slli_epi16(qh[c], 4)
                                                  : r == 1 ? _mm512_slli_epi16(qh[c], 2)
                                                  : r == 2 ? qh[c]
                                                           : _mm512_srli_epi16(qh[c], 2),
                                                  bits45);
            const __m512i nib_src = r >= 2 ? _mm512_srli_epi16(ql[c], 4) : ql[c];
            q[c] = _mm512_ternarylogic_epi32(nib_src, pair, low4, 0xEC);  // (a & c) | b
          }
          const int g = 8 * h + 2 * r;  // sub-blocks g (l < 16: c < 4) and g + 1
          for (std::int64_t m = 0; m < M; ++m) {
            const std::int8_t* xq =
                reinterpret_cast<const BlockQ8K*>(x + m * xstride)[b].q + 128 * h + 32 * r;
            __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
            __m512i b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
            for (int c = 0; c < 4; c += 2) {
              a0 = _mm512_dpbusd_epi32(a0, q[c], _mm512_set1_epi32(load_i32(xq + 4 * c)));
              a1 = _mm512_dpbusd_epi32(a1, q[c + 1], _mm512_set1_epi32(load_i32(xq + 4 * c + 4)));
              b0 = _mm512_dpbusd_epi32(b0, q[c + 4], _mm512_set1_epi32(load_i32(xq + 16 + 4 * c)));
              b1 = _mm512_dpbusd_epi32(b1, q[c + 5],
                                       _mm512_set1_epi32(load_i32(xq + 16 + 4 * c + 4)));
            }
            const __m512i part =
                _mm512_add_epi32(_mm512_mullo_epi32(_mm512_add_epi32(a0, a1), sc[g]),
                                 _mm512_mullo_epi32(_mm512_add_epi32(b0, b1), sc[g + 1]));
            _mm512_store_si512(sumi + 16 * m,
                               _mm512_add_epi32(_mm512_load_si512(sumi + 16 * m), part));
          }
        }
      }
    }
    for (std::int64_t m = 0; m < M; ++m) {
      const auto* xb = reinterpret_cast<const BlockQ8K*>(x + m * xstride) + b;
      const std::int32_t* pairs = x_pairs + 8 * (m * nb + b);
      __m512i corr = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k)
        corr = _mm512_add_epi32(corr, _mm512_madd_epi16(sp[k], _mm512_set1_epi32(pairs[k])));
      const __m512i total =
          _mm512_sub_epi32(_mm512_load_si512(sumi + 16 * m), _mm512_slli_epi32(corr, 5));
      _mm512_storeu_ps(acc + 16 * m, _mm512_fmadd_ps(_mm512_cvtepi32_ps(total),
                                                     _mm512_mul_ps(dw, _mm512_set1_ps(xb->d)),
                                                     _mm512_loadu_ps(acc + 16 * m)));
    }
  }
}
}  // namespace

void gemv_q6_k_tile16(const std::uint8_t* w, std::int64_t row_bytes, const std::uint8_t* x,
                      std::int64_t xstride, const std::int32_t* x_pairs, std::int64_t nb,
                      std::int64_t M, float* acc) {
  gemv_q6_k_tile16_impl(w, row_bytes, x, xstride, x_pairs, nb, M, acc);
}
#else
void gemv_q8_0_tile16(const std::uint8_t*, std::int64_t, const std::uint8_t*, std::int64_t,
                      const std::int32_t*, std::int64_t, std::int64_t, float*) {
  KILN_CHECK(false, "[gemv_quant] the 16-row tiles need x86 AVX512-VNNI");
}
void gemv_q4_k_tile16(const std::uint8_t*, std::int64_t, const std::uint8_t*, std::int64_t,
                      const std::int32_t*, std::int64_t, std::int64_t, float*) {
  KILN_CHECK(false, "[gemv_quant] the 16-row tiles need x86 AVX512-VNNI");
}
void gemv_q6_k_tile16(const std::uint8_t*, std::int64_t, const std::uint8_t*, std::int64_t,
                      const std::int32_t*, std::int64_t, std::int64_t, float*) {
  KILN_CHECK(false, "[gemv_quant] the 16-row tiles need x86 AVX512-VNNI");
}
#endif

}  // namespace kiln::cpu::tiles
