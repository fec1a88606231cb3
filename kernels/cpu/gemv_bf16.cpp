// bf16 GEMV for decode (see gemv_bf16.h). One register block: MB rows of x times RB rows of w,
// summed over all of K into MB x RB f32 accumulators, then reduced and written with the bias.
// The ISA-specific part is only the block's K loop; the blocking, the threading and the stores
// are shared (run_gemv).
#include "kernels/cpu/gemv_bf16.h"

#include <algorithm>
#include <type_traits>

#include "kernels/common/error.h"
#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/isa.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

// Below this many weight elements one thread does it all (the fork costs more than it saves).
constexpr int64_t kParallelMinElems = int64_t{1} << 16;
// Each load of w row r at column k prefetches row r + prefetch_rows(RB) at column k: the same
// position at least 8 rows (16 KiB at K = 1024) ahead in the contiguous weight, one or two row
// blocks. Rows of decode's weights are short (2-6 KiB), so a prefetch a fixed number of columns
// ahead within the row mostly lands in rows already being read, and the hardware streamer
// restarts on every short row. Measured on Sapphire Rapids (Qwen3-0.6B's shapes, one thread,
// 4-row blocks): 8.6 GB/s with 1 KiB ahead in the row, 10.2 GB/s with 8 rows ahead.
constexpr int64_t prefetch_rows(int RB) { return RB >= 8 ? RB : 8; }

// ---- scalar ---------------------------------------------------------------------------------

template <int MB, int RB, typename X, typename W>
struct ScalarBlock {
  // sums[m * RB + r] = sum_k x[m, k] * w[r, k]
  static void run(int64_t K, const X* x, int64_t ldx, const W* w, int64_t ldw, float* sums) {
    float acc[MB][RB] = {};
    for (int64_t k = 0; k < K; ++k)
      for (int r = 0; r < RB; ++r) {
        const float wf = to_compute(w[r * ldw + k]);
        for (int m = 0; m < MB; ++m) acc[m][r] += wf * to_compute(x[m * ldx + k]);
      }
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < RB; ++r) sums[m * RB + r] = acc[m][r];
  }
};

#if KILN_CPU_X86

// ---- AVX512-BF16: vdpbf16ps -----------------------------------------------------------------

// Masks of the first n (< 32 or < 16) lanes.
inline __mmask32 first_lanes32(int64_t n) { return n >= 32 ? ~__mmask32{0} : (1u << n) - 1u; }
inline __mmask16 first_lanes16(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xffffu : n <= 0 ? 0u : (1u << n) - 1u);
}

// 32 bf16 values of x at p (the first n when masked; the rest zero).
KILN_TARGET_AVX512BF16 inline __m512bh load_pairs(const bf16* p) {
  return (__m512bh)_mm512_loadu_si512(p);
}
KILN_TARGET_AVX512BF16 inline __m512bh load_pairs(const float* p) {
  return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
}
KILN_TARGET_AVX512BF16 inline __m512bh load_pairs(const bf16* p, int64_t n) {
  return (__m512bh)_mm512_maskz_loadu_epi16(first_lanes32(n), p);
}
KILN_TARGET_AVX512BF16 inline __m512bh load_pairs(const float* p, int64_t n) {
  return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(first_lanes16(n - 16), p + 16),
                             _mm512_maskz_loadu_ps(first_lanes16(n), p));
}

template <int MB, int RB, typename X, typename W>
struct Avx512Bf16Block {
  static_assert(std::is_same_v<W, bf16>, "vdpbf16ps multiplies bf16 weights only");
  KILN_TARGET_AVX512BF16 static void run(int64_t K, const X* x, int64_t ldx, const bf16* w,
                                         int64_t ldw, float* sums) {
    __m512 acc[MB][RB];
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < RB; ++r) acc[m][r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      __m512bh xv[MB];
      for (int m = 0; m < MB; ++m) xv[m] = load_pairs(x + m * ldx + k);
      for (int r = 0; r < RB; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + prefetch_rows(RB)) * ldw + k),
                     _MM_HINT_T0);
        const __m512bh wv = load_pairs(w + r * ldw + k);
        for (int m = 0; m < MB; ++m) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], wv, xv[m]);
      }
    }
    if (k < K) {
      const int64_t n = K - k;
      __m512bh xv[MB];
      for (int m = 0; m < MB; ++m) xv[m] = load_pairs(x + m * ldx + k, n);
      for (int r = 0; r < RB; ++r) {
        const __m512bh wv = load_pairs(w + r * ldw + k, n);
        for (int m = 0; m < MB; ++m) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], wv, xv[m]);
      }
    }
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < RB; ++r) sums[m * RB + r] = _mm512_reduce_add_ps(acc[m][r]);
  }
};

// ---- AVX-512: widen bf16 to f32 by a shift, f32 FMAs -----------------------------------------

KILN_TARGET_AVX512 inline __m512 widen16(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
// The first n of 16 values at p as f32, the rest zero (whole vectors: load_f32x16).
KILN_TARGET_AVX512 inline __m512 load16(const bf16* p, int64_t n) {
  return widen16(_mm256_maskz_loadu_epi16(first_lanes16(n), p));
}
KILN_TARGET_AVX512 inline __m512 load16(const f16* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first_lanes16(n), p));
}
KILN_TARGET_AVX512 inline __m512 load16(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(first_lanes16(n), p);
}

template <int MB, int RB, typename X, typename W>
struct Avx512Block {
  KILN_TARGET_AVX512 static void run(int64_t K, const X* x, int64_t ldx, const W* w, int64_t ldw,
                                     float* sums) {
    __m512 acc[MB][RB];
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < RB; ++r) acc[m][r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      for (int r = 0; r < RB; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + prefetch_rows(RB)) * ldw + k),
                     _MM_HINT_T0);
      for (int h = 0; h < 32; h += 16) {
        __m512 xv[MB];
        for (int m = 0; m < MB; ++m) xv[m] = load_f32x16(x + m * ldx + k + h);
        for (int r = 0; r < RB; ++r) {
          const __m512 wv = load_f32x16(w + r * ldw + k + h);
          for (int m = 0; m < MB; ++m) acc[m][r] = _mm512_fmadd_ps(wv, xv[m], acc[m][r]);
        }
      }
    }
    for (; k < K; k += 16) {
      const int64_t n = K - k;
      __m512 xv[MB];
      for (int m = 0; m < MB; ++m) xv[m] = load16(x + m * ldx + k, n);
      for (int r = 0; r < RB; ++r) {
        const __m512 wv = load16(w + r * ldw + k, n);
        for (int m = 0; m < MB; ++m) acc[m][r] = _mm512_fmadd_ps(wv, xv[m], acc[m][r]);
      }
    }
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < RB; ++r) sums[m * RB + r] = _mm512_reduce_add_ps(acc[m][r]);
  }
};

// ---- AVX2: the same on 8 lanes, scalar K tail ------------------------------------------------

template <int MB, int RB, typename X, typename W>
struct Avx2Block {
  KILN_TARGET_AVX2 static void run(int64_t K, const X* x, int64_t ldx, const W* w, int64_t ldw,
                                   float* sums) {
    __m256 acc[MB][RB];
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < RB; ++r) acc[m][r] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      for (int r = 0; r < RB; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + prefetch_rows(RB)) * ldw + k),
                     _MM_HINT_T0);
      for (int h = 0; h < 16; h += 8) {
        __m256 xv[MB];
        for (int m = 0; m < MB; ++m) xv[m] = load_f32x8(x + m * ldx + k + h);
        for (int r = 0; r < RB; ++r) {
          const __m256 wv = load_f32x8(w + r * ldw + k + h);
          for (int m = 0; m < MB; ++m) acc[m][r] = _mm256_fmadd_ps(wv, xv[m], acc[m][r]);
        }
      }
    }
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < RB; ++r) {
        float s = reduce_add_f32x8(acc[m][r]);
        for (int64_t j = k; j < K; ++j)
          s += to_compute(w[r * ldw + j]) * to_compute(x[m * ldx + j]);
        sums[m * RB + r] = s;
      }
  }
};

#endif  // KILN_CPU_X86

// ---- shared driver ----------------------------------------------------------------------------

template <typename X, typename W>
using BlockFn = void (*)(int64_t K, const X* x, int64_t ldx, const W* w, int64_t ldw, float* sums);

// The block function for mb rows of x (1..MB) and rb rows of w (1, or RB when mb * RB fits the
// kAccs accumulator registers).
template <template <int, int, class, class> class Block, int kAccs, typename X, typename W, int MB,
          int RB>
BlockFn<X, W> pick_block(int mb, int rb) {
  if constexpr (MB > 1)
    if (mb < MB) return pick_block<Block, kAccs, X, W, MB - 1, RB>(mb, rb);
  if constexpr (MB * RB <= kAccs)
    if (rb == RB) return &Block<MB, RB, X, W>::run;
  KILN_CHECK(rb == 1, "[gemv] no register block for {} x {} rows", mb, rb);
  return &Block<MB, 1, X, W>::run;
}

// y[m, r] = sums[m * rb + r] + bias[r] for the block's mb x rb outputs.
template <typename Y>
inline void store_block(int mb, int rb, const float* sums, const Y* bias, Y* y, int64_t ldy) {
  for (int m = 0; m < mb; ++m)
    for (int r = 0; r < rb; ++r)
      y[m * ldy + r] = from_compute<Y>(sums[m * rb + r] + (bias ? to_compute(bias[r]) : 0.0f));
}

// One pass over w in blocks of RB rows, each used for all M rows of x, kMaxMB at a time.
template <template <int, int, class, class> class Block, int kAccs, int kMaxMB, int RB, typename X,
          typename W, typename Y>
void run_blocks(int64_t M, int64_t N, int64_t K, const X* x, int64_t ldx, const W* w, int64_t ldw,
                const Y* bias, Y* y, int64_t ldy) {
  const int64_t nblocks = (N + RB - 1) / RB;
  const bool parallel = N * K >= kParallelMinElems && nblocks > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t n0 = b * RB, rows = std::min<int64_t>(RB, N - n0);
    float sums[kAccs];
    for (int64_t m0 = 0; m0 < M; m0 += kMaxMB) {
      const int mb = static_cast<int>(std::min<int64_t>(kMaxMB, M - m0));
      const X* xm = x + m0 * ldx;
      Y* ym = y + m0 * ldy + n0;
      if (rows == RB) {
        pick_block<Block, kAccs, X, W, kMaxMB, RB>(mb, RB)(K, xm, ldx, w + n0 * ldw, ldw, sums);
        store_block(mb, RB, sums, bias ? bias + n0 : nullptr, ym, ldy);
        continue;
      }
      const BlockFn<X, W> one_row = pick_block<Block, kAccs, X, W, kMaxMB, RB>(mb, 1);
      for (int64_t r = 0; r < rows; ++r) {
        one_row(K, xm, ldx, w + (n0 + r) * ldw, ldw, sums);
        store_block(mb, 1, sums, bias ? bias + n0 + r : nullptr, ym + r, ldy);
      }
    }
  }
}

// Row blocks as tall as the kAccs accumulators allow for min(M, kMaxMB) rows of x: more rows of
// w in flight keep more memory streams busy (one thread, Qwen3-0.6B's shapes, M = 1: 11.7 GB/s
// with 4-row blocks, 13.5 with 8, 14.4 with 16, as fast as OpenBLAS's f32 sgemv in the same run).
template <template <int, int, class, class> class Block, int kAccs, int kMaxMB, typename X,
          typename W, typename Y>
void run_gemv(int64_t M, int64_t N, int64_t K, const X* x, int64_t ldx, const W* w, int64_t ldw,
              const Y* bias, Y* y, int64_t ldy) {
  const int64_t rb = kAccs / std::min<int64_t>(M, kMaxMB);
  if (rb >= 16 && kAccs >= 16)
    return run_blocks<Block, kAccs, kMaxMB, 16>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
  if (rb >= 8 && kAccs >= 8)
    return run_blocks<Block, kAccs, kMaxMB, 8>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
  run_blocks<Block, kAccs, kMaxMB, kGemvRowBlock>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
}

void check_gemv(const char* who, int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldw,
                int64_t ldy) {
  KILN_CHECK(M >= 0 && N >= 0 && K >= 0, "[{}] negative size M={} N={} K={}", who, M, N, K);
  KILN_CHECK(ldx >= K && ldw >= K && ldy >= N, "[{}] ldx {} / ldw {} < K {} or ldy {} < N {}", who,
             ldx, ldw, K, ldy, N);
}

}  // namespace

template <typename X, typename Y>
void gemv_bf16(int64_t M, int64_t N, int64_t K, const X* x, int64_t ldx, const bf16* w, int64_t ldw,
               const Y* bias, Y* y, int64_t ldy) {
  check_gemv("gemv_bf16", M, N, K, ldx, ldw, ldy);
  if (M == 0 || N == 0) return;
#if KILN_CPU_X86
  switch (cpu_isa()) {
    case CpuIsa::Amx:
    case CpuIsa::Avx512Bf16:
      return run_gemv<Avx512Bf16Block, 16, 4>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
    case CpuIsa::Avx512:
      return run_gemv<Avx512Block, 16, 4>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
    case CpuIsa::Avx2:
      return run_gemv<Avx2Block, 8, 2>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
    case CpuIsa::Scalar:
      break;
  }
#endif
  run_gemv<ScalarBlock, 16, 4>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
}

template <typename X, typename Y>
void gemv_f16(int64_t M, int64_t N, int64_t K, const X* x, int64_t ldx, const f16* w, int64_t ldw,
              const Y* bias, Y* y, int64_t ldy) {
  check_gemv("gemv_f16", M, N, K, ldx, ldw, ldy);
  if (M == 0 || N == 0) return;
#if KILN_CPU_X86
  if (cpu_has(CpuIsa::Avx512))
    return run_gemv<Avx512Block, 16, 4>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
  if (cpu_has(CpuIsa::Avx2))
    return run_gemv<Avx2Block, 8, 2>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
#endif
  run_gemv<ScalarBlock, 16, 4>(M, N, K, x, ldx, w, ldw, bias, y, ldy);
}

template void gemv_bf16<bf16, bf16>(int64_t, int64_t, int64_t, const bf16*, int64_t, const bf16*,
                                    int64_t, const bf16*, bf16*, int64_t);
template void gemv_bf16<bf16, float>(int64_t, int64_t, int64_t, const bf16*, int64_t, const bf16*,
                                     int64_t, const float*, float*, int64_t);
template void gemv_bf16<float, bf16>(int64_t, int64_t, int64_t, const float*, int64_t, const bf16*,
                                     int64_t, const bf16*, bf16*, int64_t);
template void gemv_bf16<float, float>(int64_t, int64_t, int64_t, const float*, int64_t, const bf16*,
                                      int64_t, const float*, float*, int64_t);
template void gemv_f16<f16, f16>(int64_t, int64_t, int64_t, const f16*, int64_t, const f16*,
                                 int64_t, const f16*, f16*, int64_t);
template void gemv_f16<float, float>(int64_t, int64_t, int64_t, const float*, int64_t, const f16*,
                                     int64_t, const float*, float*, int64_t);

}  // namespace kiln::cpu
