// The f32 attention's per-block products on AVX2 + FMA (attention_blocks.h: block_sgemm).
//
// The attention runs seven small products per query block (rows <= 64 queries, kend keys, head
// dim D): S = scale Q K^T, O = P V, and in the backward dV += P^T dO, dP = dO V^T,
// dQ = scale dS K, dK += scale dS^T Q. At training sizes (T 128-1024, D 32-128) each is a few
// MFLOP, and OpenBLAS spends most of such a call copying its operands into panels: on a
// shakespeare-char f32 step (B 16, T 128, 4 heads of 48) the attention ran at 34 GFLOP/s
// forward and 41 backward on 2 AVX2 cores, against 100-140 for the model's linear layers
// (bench/results/cpu_attention_f32_20261129.md).
//
// Here one register tile does all of them:
//   C[i, j] = alpha * sum_k A(i, k) B(k, j) (+ C[i, j] when accumulating)
//   A(i, k) = a[i * rs_a + k * cs_a]: any strides, so op(A) = A^T costs nothing (rs_a = 1);
//             read one element at a time and broadcast;
//   B(k, j) = b[k * ldb + j]: rows contiguous in j, read 8 at a time. op(B) = B^T (the K^T of
//             S and the V^T of dP) is copied once per call into that layout, in panels of
//             kPanel columns, so the copy stays in L1/L2 and costs 1/rows of the products.
// The tile is 6 rows x 16 columns: 12 accumulators, 2 loads of B and 6 broadcasts per 12 FMAs,
// as BLIS's Haswell kernel. Every output is a dot product over k in order, in nb = ceil(k/256)
// blocks, each block's sum times alpha added to C, so its error is a plain dot product's:
// |C - C_exact| <= gamma_{k+2nb} (|alpha| sum_k |A(i,k) B(k,j)| + |C0|), gamma_n = n u / (1 - n u),
// u = 2^-24 (tests/kernels/test_attention_sgemm.cpp checks that bound), and the result does not
// depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "kernels/common/env_choice.h"
#include "kernels/common/error.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/isa.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

namespace kiln::cpu::attn {

// The head dims block_sgemm takes. Whole attention passes against OpenBLAS on a Zen 3, 2
// threads (bench/results/cpu_attention_f32_20261129.md): head dim 48 1.05-1.18x, 64 0.94-1.12x;
// 128 (Qwen3's) 1.06-1.14x at T 256 but 0.84-0.99x at T 512-1024, so 128 stays on OpenBLAS.
constexpr int64_t kMaxHeadDim = 64;

#if KILN_CPU_X86
namespace {

constexpr int kMr = 6;           // tile rows
constexpr int64_t kNr = 16;      // tile columns (two 8-float vectors)
constexpr int64_t kPanel = 256;  // columns of op(B) = B^T copied at a time
constexpr int64_t kKc = 256;     // k per pass over C
// Row strides (floats) at which a column of rows lands in a few L1 sets (2 KiB and up: 32 KiB
// 8-way L1s repeat every 4 KiB): such operands are copied to padded rows first.
constexpr int64_t kAliasing = 512;

// Lanes [0, n) of 8 set, for the last vector of a row (1 <= n <= 8).
KILN_TARGET_AVX2 inline __m256i lane_mask(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx);
}

// One tile: MR rows (1..6) x nc columns (1..16) of C. Full tiles (nc == 16) take plain loads
// and stores; a partial one masks the vector that crosses nc and skips the one past it. The
// accumulators are named registers, not an array: GCC kept an array of them on the stack and
// stored all twelve every iteration (2x slower than OpenBLAS).
template <int MR, bool Full>
KILN_TARGET_AVX2 void tile(int64_t k, int64_t nc, float alpha, const float* a, int64_t rs_a,
                           int64_t cs_a, const float* b, int64_t ldb, bool accumulate, float* c,
                           int64_t ldc) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  // Masks of the two vectors; with Full both are all lanes and unused.
  const __m256i m0 = Full ? _mm256_set1_epi32(-1) : lane_mask(std::min<int64_t>(nc, 8));
  const __m256i m1 = Full ? _mm256_set1_epi32(-1) : lane_mask(std::max<int64_t>(nc - 8, 1));
  const bool two = Full || nc > 8;
  const float* a0 = a;
  const float* a1 = a + rs_a;
  const float* a2 = a + 2 * rs_a;
  const float* a3 = a + 3 * rs_a;
  const float* a4 = a + 4 * rs_a;
  const float* a5 = a + 5 * rs_a;
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    __m256 b0, b1 = _mm256_setzero_ps();
    if constexpr (Full) {
      b0 = _mm256_loadu_ps(bp);
      b1 = _mm256_loadu_ps(bp + 8);
    } else {
      b0 = _mm256_maskload_ps(bp, m0);
      if (two) b1 = _mm256_maskload_ps(bp + 8, m1);
    }
    // One row of the tile: its A element broadcast, times both vectors of B.
    const int64_t o = p * cs_a;
    auto row = [&](const float* ar, __m256& x0, __m256& x1) KILN_TARGET_AVX2 {
      const __m256 ai = _mm256_broadcast_ss(ar + o);
      x0 = _mm256_fmadd_ps(ai, b0, x0);
      x1 = _mm256_fmadd_ps(ai, b1, x1);
    };
    row(a0, c00, c01);
    if constexpr (MR > 1) row(a1, c10, c11);
    if constexpr (MR > 2) row(a2, c20, c21);
    if constexpr (MR > 3) row(a3, c30, c31);
    if constexpr (MR > 4) row(a4, c40, c41);
    if constexpr (MR > 5) row(a5, c50, c51);
  }
  const __m256 va = _mm256_set1_ps(alpha);
  auto store = [&](float* ci, __m256 r0, __m256 r1) KILN_TARGET_AVX2 {
    r0 = _mm256_mul_ps(va, r0);
    r1 = _mm256_mul_ps(va, r1);
    if constexpr (Full) {
      if (accumulate) {
        r0 = _mm256_add_ps(_mm256_loadu_ps(ci), r0);
        r1 = _mm256_add_ps(_mm256_loadu_ps(ci + 8), r1);
      }
      _mm256_storeu_ps(ci, r0);
      _mm256_storeu_ps(ci + 8, r1);
    } else {
      if (accumulate) r0 = _mm256_add_ps(_mm256_maskload_ps(ci, m0), r0);
      _mm256_maskstore_ps(ci, m0, r0);
      if (two) {
        if (accumulate) r1 = _mm256_add_ps(_mm256_maskload_ps(ci + 8, m1), r1);
        _mm256_maskstore_ps(ci + 8, m1, r1);
      }
    }
  };
  store(c, c00, c01);
  if constexpr (MR > 1) store(c + ldc, c10, c11);
  if constexpr (MR > 2) store(c + 2 * ldc, c20, c21);
  if constexpr (MR > 3) store(c + 3 * ldc, c30, c31);
  if constexpr (MR > 4) store(c + 4 * ldc, c40, c41);
  if constexpr (MR > 5) store(c + 5 * ldc, c50, c51);
}

template <bool Full>
KILN_TARGET_AVX2 void tile_rows(int mr, int64_t k, int64_t nc, float alpha, const float* a,
                                int64_t rs_a, int64_t cs_a, const float* b, int64_t ldb,
                                bool accumulate, float* c, int64_t ldc) {
  switch (mr) {
    case 6:
      return tile<6, Full>(k, nc, alpha, a, rs_a, cs_a, b, ldb, accumulate, c, ldc);
    case 5:
      return tile<5, Full>(k, nc, alpha, a, rs_a, cs_a, b, ldb, accumulate, c, ldc);
    case 4:
      return tile<4, Full>(k, nc, alpha, a, rs_a, cs_a, b, ldb, accumulate, c, ldc);
    case 3:
      return tile<3, Full>(k, nc, alpha, a, rs_a, cs_a, b, ldb, accumulate, c, ldc);
    case 2:
      return tile<2, Full>(k, nc, alpha, a, rs_a, cs_a, b, ldb, accumulate, c, ldc);
    default:
      return tile<1, Full>(k, nc, alpha, a, rs_a, cs_a, b, ldb, accumulate, c, ldc);
  }
}

// C[0:m, 0:n] (+)= alpha A B over B rows contiguous in j (row stride ldb). Column strips of 16
// outside, row tiles of 6 inside, so a strip of B (k x 16) is reused from L1 by every row tile.
KILN_TARGET_AVX2 void strips_of_tiles(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                                      int64_t rs_a, int64_t cs_a, const float* b, int64_t ldb,
                                      bool accumulate, float* c, int64_t ldc) {
  for (int64_t j = 0; j < n; j += kNr) {
    const int64_t nc = std::min(kNr, n - j);
    for (int64_t i = 0; i < m; i += kMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kMr, m - i));
      if (nc == kNr)
        tile_rows<true>(mr, k, nc, alpha, a + i * rs_a, rs_a, cs_a, b + j, ldb, accumulate,
                        c + i * ldc + j, ldc);
      else
        tile_rows<false>(mr, k, nc, alpha, a + i * rs_a, rs_a, cs_a, b + j, ldb, accumulate,
                         c + i * ldc + j, ldc);
    }
  }
}

// The row stride of a copy of w floats: a multiple of 8, and not of 64 (256 B), so that
// successive rows do not all fall in the same few L1 sets.
inline int64_t padded_ld(int64_t w) {
  const int64_t r = (w + 7) / 8 * 8;
  return r % 64 == 0 ? r + 8 : r;
}

// dst (rows x cols, row stride dld) = src (row stride ld).
KILN_TARGET_AVX2 void copy_rows(int64_t rows, int64_t cols, const float* src, int64_t ld,
                                float* dst, int64_t dld) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    float* d = dst + r * dld;
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) _mm256_storeu_ps(d + j, _mm256_loadu_ps(s + j));
    for (; j < cols; ++j) d[j] = s[j];
  }
}

// panel (k x nc, row-major) = the transpose of src's rows [0, nc) x columns [0, k) (row stride
// ld): 8 x 8 blocks through registers, so the copy costs well under a cycle per element. (A
// scalar copy, one strided store each, took as long as the products it fed at rows = 64.)
KILN_TARGET_AVX2 void pack_transposed(int64_t nc, int64_t k, const float* src, int64_t ld,
                                      float* panel, int64_t pld) {
  int64_t j = 0;
  for (; j + 8 <= nc; j += 8) {
    int64_t p = 0;
    for (; p + 8 <= k; p += 8) {
      const float* s0 = src + j * ld + p;
      __m256 r0 = _mm256_loadu_ps(s0), r1 = _mm256_loadu_ps(s0 + ld),
             r2 = _mm256_loadu_ps(s0 + 2 * ld), r3 = _mm256_loadu_ps(s0 + 3 * ld),
             r4 = _mm256_loadu_ps(s0 + 4 * ld), r5 = _mm256_loadu_ps(s0 + 5 * ld),
             r6 = _mm256_loadu_ps(s0 + 6 * ld), r7 = _mm256_loadu_ps(s0 + 7 * ld);
      const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                   t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                   t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                   u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                   u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                   u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      r0 = _mm256_permute2f128_ps(u0, u4, 0x20);
      r1 = _mm256_permute2f128_ps(u1, u5, 0x20);
      r2 = _mm256_permute2f128_ps(u2, u6, 0x20);
      r3 = _mm256_permute2f128_ps(u3, u7, 0x20);
      r4 = _mm256_permute2f128_ps(u0, u4, 0x31);
      r5 = _mm256_permute2f128_ps(u1, u5, 0x31);
      r6 = _mm256_permute2f128_ps(u2, u6, 0x31);
      r7 = _mm256_permute2f128_ps(u3, u7, 0x31);
      float* d = panel + p * pld + j;
      _mm256_storeu_ps(d, r0);
      _mm256_storeu_ps(d + pld, r1);
      _mm256_storeu_ps(d + 2 * pld, r2);
      _mm256_storeu_ps(d + 3 * pld, r3);
      _mm256_storeu_ps(d + 4 * pld, r4);
      _mm256_storeu_ps(d + 5 * pld, r5);
      _mm256_storeu_ps(d + 6 * pld, r6);
      _mm256_storeu_ps(d + 7 * pld, r7);
    }
    for (; p < k; ++p)
      for (int64_t jj = j; jj < j + 8; ++jj) panel[p * pld + jj] = src[jj * ld + p];
  }
  for (; j < nc; ++j)
    for (int64_t p = 0; p < k; ++p) panel[p * pld + j] = src[j * ld + p];
}

}  // namespace

KILN_TARGET_AVX2 static void block_sgemm_avx2(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                              int64_t k, float alpha, const float* a, int64_t lda,
                                              const float* b, int64_t ldb, bool accumulate,
                                              float* c, int64_t ldc) {
  thread_local std::vector<float> abuf, bbuf;
  auto room = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return v.data();
  };
  // Blocks of kKc of k keep a strip of B (kKc x 16, 16 KiB) in L1 for all the row tiles; each
  // block after the first adds its alpha-scaled sum to C.
  for (int64_t k0 = 0; k0 < std::max<int64_t>(k, 1); k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0);
    const bool acc = accumulate || k0 > 0;
    const float* ak = trans_a ? a + k0 * lda : a + k0;
    int64_t rs_a = trans_a ? 1 : lda, cs_a = trans_a ? lda : 1;
    // Rows p of A^T that alias in L1 are copied apart when at most kPanel wide, so each of the
    // thread's two copy buffers (kept between calls, as OpenBLAS keeps its packing buffers)
    // stays within kKc x 264 floats (264 KiB) whatever the sizes.
    if (trans_a && lda % kAliasing == 0 && m <= kPanel) {
      const int64_t ald = padded_ld(m);
      float* buf = room(abuf, kc * ald);
      copy_rows(kc, m, ak, lda, buf, ald);
      ak = buf;
      cs_a = ald;
    }
    for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
      const int64_t nc = std::min(kPanel, n - j0);
      const float* bk = b + k0 * ldb + j0;
      int64_t bld = ldb;
      if (trans_b) {  // op(B)(p, j) = b[j * ldb + p]: transpose the panel into (kc, nc)
        bld = padded_ld(nc);
        float* buf = room(bbuf, kc * bld);
        pack_transposed(nc, kc, b + j0 * ldb + k0, ldb, buf, bld);
        bk = buf;
      } else if (ldb % kAliasing == 0) {  // B's rows alias in L1: copy them apart
        bld = padded_ld(nc);
        float* buf = room(bbuf, kc * bld);
        copy_rows(kc, nc, bk, ldb, buf, bld);
        bk = buf;
      }
      strips_of_tiles(m, nc, kc, alpha, ak, rs_a, cs_a, bk, bld, acc, c + j0, ldc);
    }
  }
}
#endif  // KILN_CPU_X86

bool block_sgemm_available() {
#if KILN_CPU_X86
  return cpu_has(CpuIsa::Avx2);
#else
  return false;
#endif
}

namespace {
// -1: no override (KILN_ATTENTION_GEMM decides, else the rule); 0: the rule; 1: OpenBLAS.
std::atomic<int> g_openblas_override{-1};

bool env_openblas() {
  static const bool on = env_choice("KILN_ATTENTION_GEMM", {"openblas"}, "attention") == 0;
  return on;
}
}  // namespace

void set_attention_gemm_openblas(const bool* on) {
  g_openblas_override.store(on ? int(*on) : -1, std::memory_order_relaxed);
}

bool block_sgemm_takes(int64_t head_dim) {
  const int o = g_openblas_override.load(std::memory_order_relaxed);
  if (o > 0 || (o < 0 && env_openblas())) return false;
  return head_dim <= kMaxHeadDim && block_sgemm_available();
}

void block_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate,
                 float* c, int64_t ldc) {
  KILN_CHECK(block_sgemm_available(), "[attention] block_sgemm needs AVX2 + FMA (level {})",
             cpu_isa_name(cpu_isa()));
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0, "[attention] block_sgemm: bad sizes m={} n={} k={}", m, n,
             k);
  if (m == 0 || n == 0) return;
#if KILN_CPU_X86
  block_sgemm_avx2(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
#endif
}

}  // namespace kiln::cpu::attn
