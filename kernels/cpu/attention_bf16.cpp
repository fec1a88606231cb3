// Causal GQA attention on bf16 storage, forward (training, prefill, KV-cache decode) and
// backward; math, layouts and task split as the f32 kernel (attention.h, attention.cpp), with
// every product and statistic in f32. lse stays f32, as on CUDA.
//
// Training and prefill blocks (Tq > 1) run on AMX tiles where the level is Amx and D % 32 == 0
// (attention_amx.cpp: Q K^T and P V as bf16 tile products, f32 softmax, P rounded to bf16).
// Below that they widen their tiles to f32 in per-thread scratch (a query block of at most 64
// rows, the keys and values [0, kend) of its kv head) and run the f32 block steps
// (attention_blocks.h, BLAS); results are rounded once into bf16. Decode blocks (Tq == 1) with
// AVX-512 (D % 16 == 0) or AVX2 (D % 8 == 0) read the bf16 cache directly instead, so it is read
// once, at half the bytes of an f32 one, and nothing is widened into a tile: scores by vdpbf16ps on
// the bf16 q and cache rows (AVX512-BF16, D % 32 == 0) or by FMAs on rows widened in registers,
// then P V by FMAs on value rows widened in registers; AVX2 does the same on 8 lanes. On AVX2,
// before, every decode step widened its head's whole K and V into f32 tiles and multiplied them by
// sgemm, which read the cache three times (Qwen3-0.6B at 150 keys, 28 layers: ~85 MB per token
// beside 1.2 GB of weights). No whole-tensor f32 copy is made anywhere.
//
// Measured (bench/bench_cpu_attention_bf16.cpp; bench/results/cpu_attention_bf16_*.txt), one
// thread, caches flushed between runs, Sapphire Rapids:
//   - decode, vdpbf16ps vs FMAs on widened rows: 1.05-1.06x at 1024 keys, 1.15-1.17x at 4096;
//     the direct decode vs the f32 kernel: about 1.7x and 2x;
//   - training/prefill blocks with vdpbf16ps (keys packed per block into 16-key pair panels,
//     each query's pairs broadcast against them): 0.85-0.97x of widening + sgemm, so they
//     widen: vdpbf16ps has the f32 FMA's peak on this core and the packing costs what the
//     widening does;
//   - the same blocks on AMX tiles (Qwen3-0.6B prefill, B1 T512 Hq16 Hkv8 D128): 4.50 ms vs
//     14.99 ms for widening + sgemm with caches flushed (3.3x; 0.24 TFLOP/s), 2.9-3.4 ms vs
//     13.4-15.0 ms warm, as in a prefill (4.4-4.6x); a whole Qwen3-0.6B prefill of 512 tokens
//     (2 threads, loaded machine, alternated): 1043-1105 tok/s vs 799-838 before. Reading Q's
//     tiles in place (row stride Hq D, 4 KiB) instead of from a copy measured no better (L1
//     set conflicts), so the block's rows are copied.
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {
namespace {

using attn::kBlockQ;

// f32 scratch of one thread; k and v grow on first use (decode never widens them).
struct Tiles {
  std::vector<float> q, k, v, o, s;
};

void grow(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// ---- decode: one query position, K and V read once, in bf16, from the cache ------------------
// Every row of a decode block sees keys [0, kend). The scores and P V are computed straight from
// the bf16 cache rows (widened in registers), so the cache is read once at half the bytes of an
// f32 one and nothing is widened into a tile.
#if KILN_CPU_X86
// sums[i] = q . k_i for the n (1 or 4) cache rows k_i = kj + i * ldkv, D elements each: by FMAs
// on rows widened in registers (q in f32, D % 16 == 0), or by vdpbf16ps on bf16 pairs (q in
// bf16, D % 32 == 0). Four rows give four independent sums in flight.
template <int N, class E>
KILN_TARGET_AVX512 void dot_fma(const float* q, const E* kj, int64_t ldkv, int64_t D, float* sums) {
  __m512 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 16) {
    const __m512 qc = _mm512_loadu_ps(q + c);
    for (int i = 0; i < N; ++i)
      acc[i] = _mm512_fmadd_ps(load_f32x16(kj + i * ldkv + c), qc, acc[i]);
  }
  for (int i = 0; i < N; ++i) sums[i] = _mm512_reduce_add_ps(acc[i]);
}

// The same on 8 lanes (AVX2, D % 8 == 0).
template <int N, class E>
KILN_TARGET_AVX2 void dot_fma_avx2(const float* q, const E* kj, int64_t ldkv, int64_t D,
                                   float* sums) {
  __m256 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t c = 0; c < D; c += 8) {
    const __m256 qc = _mm256_loadu_ps(q + c);
    for (int i = 0; i < N; ++i) acc[i] = _mm256_fmadd_ps(load_f32x8(kj + i * ldkv + c), qc, acc[i]);
  }
  for (int i = 0; i < N; ++i) sums[i] = reduce_add_f32x8(acc[i]);
}

// 32 bf16 at p, as a vdpbf16ps operand.
KILN_TARGET_AVX512BF16 inline __m512bh bh(const bf16* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

template <int N>
KILN_TARGET_AVX512BF16 void dot_dpbf16(const bf16* q, const bf16* kj, int64_t ldkv, int64_t D,
                                       float* sums) {
  __m512 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 32) {
    const __m512bh qc = bh(q + c);
    for (int i = 0; i < N; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], qc, bh(kj + i * ldkv + c));
  }
  for (int i = 0; i < N; ++i) sums[i] = _mm512_reduce_add_ps(acc[i]);
}

// s[r * kend + j] = scale * q_r . k_j for rows q_r (row stride ldq), four keys at a time.
template <class Q, class E, void (*Dot4)(const Q*, const E*, int64_t, int64_t, float*),
          void (*Dot1)(const Q*, const E*, int64_t, int64_t, float*)>
void decode_scores(int64_t rows, int64_t kend, int64_t D, float scale, const Q* q, int64_t ldq,
                   const E* k, int64_t ldkv, float* s) {
  float sums[4];
  int64_t j = 0;
  for (; j + 4 <= kend; j += 4)
    for (int64_t r = 0; r < rows; ++r) {
      Dot4(q + r * ldq, k + j * ldkv, ldkv, D, sums);
      for (int i = 0; i < 4; ++i) s[r * kend + j + i] = scale * sums[i];
    }
  for (; j < kend; ++j)
    for (int64_t r = 0; r < rows; ++r) {
      Dot1(q + r * ldq, k + j * ldkv, ldkv, D, sums);
      s[r * kend + j] = scale * sums[0];
    }
}

// o rows [0, R) columns [c0, c0 + 16 C) = sum_j p[r * kend + j] v_j; o: row stride D.
template <int R, int C, class E>
KILN_TARGET_AVX512 inline void decode_values_tile(int64_t kend, int64_t D, int64_t c0,
                                                  const float* p, const E* v, int64_t ldkv,
                                                  float* o) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < kend; ++j) {
    __m512 vj[C];
    for (int c = 0; c < C; ++c) vj[c] = load_f32x16(v + j * ldkv + c0 + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * kend + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(pr, vj[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + r * D + c0 + 16 * c, acc[r][c]);
}

template <int R, class E>
KILN_TARGET_AVX512 void decode_values_rows(int64_t kend, int64_t D, const float* p, const E* v,
                                           int64_t ldkv, float* o) {
  int64_t c0 = 0;
  for (; c0 + 64 <= D; c0 += 64) decode_values_tile<R, 4>(kend, D, c0, p, v, ldkv, o);
  for (; c0 < D; c0 += 16) decode_values_tile<R, 1>(kend, D, c0, p, v, ldkv, o);
}

// The same on 8 lanes (AVX2, 16 registers): 4 rows x 2 column vectors of accumulators.
template <int R, int C, class E>
KILN_TARGET_AVX2 inline void decode_values_tile_avx2(int64_t kend, int64_t D, int64_t c0,
                                                     const float* p, const E* v, int64_t ldkv,
                                                     float* o) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < kend; ++j) {
    __m256 vj[C];
    for (int c = 0; c < C; ++c) vj[c] = load_f32x8(v + j * ldkv + c0 + 8 * c);
    for (int r = 0; r < R; ++r) {
      const __m256 pr = _mm256_set1_ps(p[r * kend + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(pr, vj[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(o + r * D + c0 + 8 * c, acc[r][c]);
}

template <int R, class E>
KILN_TARGET_AVX2 void decode_values_rows_avx2(int64_t kend, int64_t D, const float* p, const E* v,
                                              int64_t ldkv, float* o) {
  int64_t c0 = 0;
  for (; c0 + 16 <= D; c0 += 16) decode_values_tile_avx2<R, 2>(kend, D, c0, p, v, ldkv, o);
  for (; c0 < D; c0 += 8) decode_values_tile_avx2<R, 1>(kend, D, c0, p, v, ldkv, o);
}

template <bool Avx512, int R, class E>
void decode_values_rows_at(int64_t kend, int64_t D, const float* p, const E* v, int64_t ldkv,
                           float* o) {
  if constexpr (Avx512)
    decode_values_rows<R>(kend, D, p, v, ldkv, o);
  else
    decode_values_rows_avx2<R>(kend, D, p, v, ldkv, o);
}

// o (rows x D, f32) = P V for a decode block; D % 16 == 0 (Avx512) or D % 8 == 0. Rows go four
// at a time, so V is read once per four query heads.
template <bool Avx512, class E>
void decode_values(int64_t rows, int64_t kend, int64_t D, const float* p, const E* v, int64_t ldkv,
                   float* o) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    decode_values_rows_at<Avx512, 4, E>(kend, D, p + r * kend, v, ldkv, o + r * D);
  switch (rows - r) {
    case 3:
      decode_values_rows_at<Avx512, 3, E>(kend, D, p + r * kend, v, ldkv, o + r * D);
      break;
    case 2:
      decode_values_rows_at<Avx512, 2, E>(kend, D, p + r * kend, v, ldkv, o + r * D);
      break;
    case 1:
      decode_values_rows_at<Avx512, 1, E>(kend, D, p + r * kend, v, ldkv, o + r * D);
      break;
    default:
      break;
  }
}
#endif

// Whether a decode block's 16-lane (AVX-512) or 8-lane (AVX2) path reads the cache directly.
bool decode_direct_avx512(int64_t D) {
#if KILN_CPU_X86
  return D % 16 == 0 && cpu_has(CpuIsa::Avx512);
#else
  (void)D;
  return false;
#endif
}
bool decode_direct(int64_t D) {
#if KILN_CPU_X86
  return decode_direct_avx512(D) || (D % 8 == 0 && cpu_has(CpuIsa::Avx2));
#else
  (void)D;
  return false;
#endif
}

// A decode block: rows queries (row stride ldq) against keys [0, kend), all visible. E: bf16 or
// f16 storage (f16 rows widened by F16C; vdpbf16ps only for bf16).
template <class E>
void decode_block(Tiles& t, int64_t rows, int64_t kend, int64_t D, float scale, const E* q,
                  int64_t ldq, const E* k, const E* v, int64_t ldkv, E* out, float* lse_blk,
                  int64_t lse_stride) {
#if KILN_CPU_X86
  const bool avx512 = decode_direct_avx512(D);
  if (std::is_same_v<E, bf16> && D % 32 == 0 && cpu_has(CpuIsa::Avx512Bf16)) {
    if constexpr (std::is_same_v<E, bf16>)
      decode_scores<bf16, bf16, dot_dpbf16<4>, dot_dpbf16<1>>(rows, kend, D, scale, q, ldq, k, ldkv,
                                                              t.s.data());
  } else {
    for (int64_t r = 0; r < rows; ++r) to_compute_n(D, q + r * ldq, t.q.data() + r * D);
    if (avx512)
      decode_scores<float, E, dot_fma<4, E>, dot_fma<1, E>>(rows, kend, D, scale, t.q.data(), D, k,
                                                            ldkv, t.s.data());
    else
      decode_scores<float, E, dot_fma_avx2<4, E>, dot_fma_avx2<1, E>>(
          rows, kend, D, scale, t.q.data(), D, k, ldkv, t.s.data());
  }
  attn::softmax_rows(rows, kend, kend, int64_t(0), t.s.data(), lse_blk, lse_stride);
  if (avx512)
    decode_values<true>(rows, kend, D, t.s.data(), v, ldkv, t.o.data());
  else
    decode_values<false>(rows, kend, D, t.s.data(), v, ldkv, t.o.data());
  for (int64_t r = 0; r < rows; ++r) from_compute_n(D, t.o.data() + r * D, out + r * ldq);
#else
  (void)t, (void)rows, (void)kend, (void)D, (void)scale, (void)q, (void)ldq, (void)k, (void)v;
  (void)ldkv, (void)out, (void)lse_blk, (void)lse_stride;
#endif
}

// One forward block on 16-bit storage E: rows queries (row stride ldq) against keys [0, kend), row
// r seeing keys [0, min(kend, valid0 + r * valid_step)); out rows (stride ldq) =, lse_blk (stride
// lse_stride) =. Decode blocks (Tq == 1) read the cache directly where they can; the others
// widen their tiles and run the f32 block step (BLAS).
template <class E>
void forward_block(Tiles& t, bool decode, int64_t rows, int64_t kend, int64_t D, float scale,
                   const E* q, int64_t ldq, const E* k, const E* v, int64_t ldkv, int64_t valid0,
                   int64_t valid_step, E* out, float* lse_blk, int64_t lse_stride) {
  if (decode && decode_direct(D))
    return decode_block(t, rows, kend, D, scale, q, ldq, k, v, ldkv, out, lse_blk, lse_stride);
  grow(t.k, kend * D);
  grow(t.v, kend * D);
  for (int64_t r = 0; r < rows; ++r) to_compute_n(D, q + r * ldq, t.q.data() + r * D);
  for (int64_t j = 0; j < kend; ++j) {
    to_compute_n(D, k + j * ldkv, t.k.data() + j * D);
    to_compute_n(D, v + j * ldkv, t.v.data() + j * D);
  }
  attn::forward_block(rows, kend, D, scale, t.q.data(), D, t.k.data(), t.v.data(), D, valid0,
                      valid_step, t.o.data(), D, lse_blk, lse_stride, t.s.data());
  for (int64_t r = 0; r < rows; ++r) from_compute_n(D, t.o.data() + r * D, out + r * ldq);
}

// The forward on 16-bit storage E (bf16: AMX tiles for training and prefill where they apply).
template <class E>
void forward_16bit(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                   int64_t q_offset, double scale, const E* q, const E* k, const E* v,
                   int64_t kv_batch_stride, E* out, float* lse) {
  attn::check_attention("forward", B, Tq, Tk, Hq, Hkv, D, q_offset, kv_batch_stride);
  if (B == 0 || Tq == 0) return;
  if constexpr (std::is_same_v<E, bf16>)
    if (attn::amx_forward_supported(Tq, D))
      return attn::attention_forward_amx(B, Tq, Tk, Hq, Hkv, D, q_offset, float(scale), q, k, v,
                                         kv_batch_stride, out, lse);
  const attn::ForwardPlan plan(B, Tq, Tk, Hq, Hkv, D);
  const int64_t G = plan.G, ldq = plan.ldq, ldkv = plan.ldkv, max_rows = plan.max_rows;
  const float sc = float(scale);
  attn::BlasSingleThreaded blas_guard;

#pragma omp parallel if (plan.parallel)
  {
    Tiles t;
    t.q.resize(static_cast<size_t>(max_rows * D));
    t.o.resize(static_cast<size_t>(max_rows * D));
    t.s.resize(static_cast<size_t>(max_rows * Tk));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < plan.ntasks; ++task) {
      const int64_t qb = plan.block(task), hh = plan.head(task), b = plan.batch(task);
      if (plan.grouped) {
        const int64_t kvh = hh, kend = q_offset + 1;
        const E* kb = k + b * kv_batch_stride + kvh * D;
        const E* vb = v + b * kv_batch_stride + kvh * D;
        for (int64_t g0 = 0; g0 < G; g0 += kBlockQ) {
          const int64_t rows = std::min(kBlockQ, G - g0), h0 = kvh * G + g0;
          forward_block(t, true, rows, kend, D, sc, q + (b * Hq + h0) * D, D, kb, vb, ldkv, kend, 0,
                        out + (b * Hq + h0) * D, lse + b * Hq + h0, 1);
        }
      } else {
        const int64_t h = hh, kvh = h / G;
        const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, Tq - i0);
        const int64_t kend = std::min(Tk, q_offset + i0 + rows);
        const int64_t off = (b * Tq + i0) * ldq + h * D;
        forward_block(t, Tq == 1, rows, kend, D, sc, q + off, ldq,
                      k + b * kv_batch_stride + kvh * D, v + b * kv_batch_stride + kvh * D, ldkv,
                      q_offset + i0 + 1, 1, out + off, lse + (b * Hq + h) * Tq + i0, 1);
      }
    }
  }
}

}  // namespace

template <>
void attention_forward<bf16>(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t q_offset, double scale, const bf16* q, const bf16* k,
                             const bf16* v, int64_t kv_batch_stride, bf16* out, float* lse) {
  forward_16bit(B, Tq, Tk, Hq, Hkv, D, q_offset, scale, q, k, v, kv_batch_stride, out, lse);
}

template <>
void attention_forward<f16>(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                            int64_t q_offset, double scale, const f16* q, const f16* k,
                            const f16* v, int64_t kv_batch_stride, f16* out, float* lse) {
  forward_16bit(B, Tq, Tk, Hq, Hkv, D, q_offset, scale, q, k, v, kv_batch_stride, out, lse);
}

// One task per (b, kv head), as the f32 kernel: its keys, values and their gradients live as f32
// tiles (T x D) for the task; each query block of its G heads is widened, run through the f32
// block step, and its dq rounded; dk, dv are rounded once at the end of the task.
template <>
void attention_backward<bf16>(int64_t B, int64_t T_, int64_t Hq, int64_t Hkv, int64_t D,
                              double scale, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* out, const float* lse, const bf16* dout, bf16* dq,
                              bf16* dk, bf16* dv) {
  attn::check_attention("backward", B, T_, T_, Hq, Hkv, D, 0, T_ * Hkv * D);
  if (B == 0 || T_ == 0) return;
  const attn::BackwardPlan plan(B, T_, Hq, Hkv, D);
  const int64_t G = plan.G, ldq = plan.ldq, ldkv = plan.ldkv, nqb = plan.nqb, brows = plan.brows;
  const float sc = float(scale);
  attn::BlasSingleThreaded blas_guard;

#pragma omp parallel if (plan.parallel)
  {
    const auto n = [](int64_t e) { return static_cast<size_t>(e); };
    std::vector<float> kt(n(T_ * D)), vt(n(T_ * D)), dkt(n(T_ * D)), dvt(n(T_ * D));
    std::vector<float> qt(n(brows * D)), ot(n(brows * D)), dot(n(brows * D)), dqt(n(brows * D));
    std::vector<float> p(n(brows * T_)), dp(n(brows * T_)), di(n(brows));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < plan.ntasks; ++task) {
      const int64_t b = task / Hkv, kvh = task % Hkv;
      const int64_t kv_off = b * T_ * ldkv + kvh * D;
      for (int64_t t = 0; t < T_; ++t) {
        bf16_to_f32(D, k + kv_off + t * ldkv, kt.data() + t * D);
        bf16_to_f32(D, v + kv_off + t * ldkv, vt.data() + t * D);
      }
      std::fill(dkt.begin(), dkt.end(), 0.0f);
      std::fill(dvt.begin(), dvt.end(), 0.0f);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = kvh * G + g;
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, T_ - i0);
          const int64_t off = (b * T_ + i0) * ldq + h * D;
          for (int64_t r = 0; r < rows; ++r) {
            bf16_to_f32(D, q + off + r * ldq, qt.data() + r * D);
            bf16_to_f32(D, out + off + r * ldq, ot.data() + r * D);
            bf16_to_f32(D, dout + off + r * ldq, dot.data() + r * D);
          }
          attn::backward_block(rows, i0, D, sc, qt.data(), ot.data(), dot.data(),
                               lse + (b * Hq + h) * T_ + i0, D, kt.data(), vt.data(), D, dqt.data(),
                               dkt.data(), dvt.data(), p.data(), dp.data(), di.data());
          for (int64_t r = 0; r < rows; ++r) f32_to_bf16(D, dqt.data() + r * D, dq + off + r * ldq);
        }
      }
      for (int64_t t = 0; t < T_; ++t) {
        f32_to_bf16(D, dkt.data() + t * D, dk + kv_off + t * ldkv);
        f32_to_bf16(D, dvt.data() + t * D, dv + kv_off + t * ldkv);
      }
    }
  }
}

}  // namespace kiln::cpu
