// Causal GQA attention on bf16 storage, forward (training, prefill, KV-cache decode) and
// backward; math, layouts and task split as the f32 kernel (attention.h, attention.cpp), with
// every product and statistic in f32. lse stays f32, as on CUDA.
//
// Each block's tiles are widened to f32 in per-thread scratch (a query block of at most 64 rows,
// the keys and values [0, kend) of its kv head) and run through the f32 block steps
// (attention_blocks.h); results are rounded once into bf16. No whole-tensor f32 copy is made.
//
// With AVX512-BF16 the forward's scores S = scale * Q K^T are computed from the bf16 tiles
// directly with vdpbf16ps (products of bf16 pairs summed in f32) instead of widening Q and K and
// calling sgemm: the keys are packed once per block into 16-key panels of bf16 pairs, and each
// query row's pairs are broadcast against them. The values are still widened (P stays f32, so
// P V keeps f32 accuracy). bench/bench_attention_bf16 measures both ways.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {
namespace {

using attn::kBlockQ;

// f32 scratch of one thread.
struct Tiles {
  std::vector<float> q, k, v, o, s;
  std::vector<std::uint32_t> kp;  // packed key panels (vdpbf16ps path)
};

#if KILN_CPU_X86
// acc[i] (16 keys of one panel) += sum over pairs p of q_i[2p..2p+1] . panel[p] for R query rows.
//   q: R rows of bf16 (row stride ldq), panel: P x 16 key pairs, out: R rows (stride lds).
template <int R>
KILN_TARGET_AVX512BF16 inline void scores_panel(int64_t P, float scale, const bf16* q, int64_t ldq,
                                                const std::uint32_t* panel, float* out, int64_t lds,
                                                int count) {
  __m512 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    const __m512bh kv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(panel + p * 16));
    for (int i = 0; i < R; ++i) {
      std::uint32_t pair;
      std::memcpy(&pair, q + i * ldq + 2 * p, sizeof(pair));
      acc[i] =
          _mm512_dpbf16_ps(acc[i], reinterpret_cast<__m512bh>(_mm512_set1_epi32(int(pair))), kv);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  const __mmask16 m = static_cast<__mmask16>((1u << count) - 1u);
  for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(out + i * lds, m, _mm512_mul_ps(acc[i], sc));
}

// s (rows x kend, row stride kend) = scale * Q K^T from bf16 q (rows x D, row stride ldq) and k
// (kend x D, row stride ldkv); D even. kp: scratch of ceil(kend / 16) * 16 * D / 2 words.
KILN_TARGET_AVX512BF16 void scores_dpbf16(int64_t rows, int64_t kend, int64_t D, float scale,
                                          const bf16* q, int64_t ldq, const bf16* k, int64_t ldkv,
                                          std::uint32_t* kp, float* s) {
  const int64_t P = D / 2, npanel = (kend + 15) / 16;
  // kp[(panel * P + p) * 16 + j] = pair p of key panel * 16 + j (0 past kend).
  for (int64_t panel = 0; panel < npanel; ++panel) {
    std::uint32_t* dst = kp + panel * P * 16;
    for (int64_t j = 0; j < 16; ++j) {
      const int64_t key = panel * 16 + j;
      if (key < kend) {
        const bf16* kr = k + key * ldkv;
        for (int64_t p = 0; p < P; ++p) std::memcpy(dst + p * 16 + j, kr + 2 * p, 4);
      } else {
        for (int64_t p = 0; p < P; ++p) dst[p * 16 + j] = 0;
      }
    }
  }
  for (int64_t panel = 0; panel < npanel; ++panel) {
    const int count = static_cast<int>(std::min<int64_t>(16, kend - panel * 16));
    const std::uint32_t* pp = kp + panel * P * 16;
    float* out = s + panel * 16;
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8)
      scores_panel<8>(P, scale, q + r * ldq, ldq, pp, out + r * kend, kend, count);
    for (; r + 4 <= rows; r += 4)
      scores_panel<4>(P, scale, q + r * ldq, ldq, pp, out + r * kend, kend, count);
    for (; r < rows; ++r)
      scores_panel<1>(P, scale, q + r * ldq, ldq, pp, out + r * kend, kend, count);
  }
}
#endif

bool use_dpbf16(int64_t D) {
#if KILN_CPU_X86
  return D % 2 == 0 && cpu_has(CpuIsa::Avx512Bf16);
#else
  (void)D;
  return false;
#endif
}

// One forward block on bf16 storage: rows queries (row stride ldq) against keys [0, kend)
// (row stride ldkv); out rows (stride ldq) =, lse_blk (stride lse_stride) =.
void forward_block_bf16(Tiles& t, int64_t rows, int64_t kend, int64_t D, float scale, const bf16* q,
                        int64_t ldq, const bf16* k, const bf16* v, int64_t ldkv, int64_t valid0,
                        int64_t valid_step, bf16* out, float* lse_blk, int64_t lse_stride) {
  for (int64_t j = 0; j < kend; ++j) bf16_to_f32(D, v + j * ldkv, t.v.data() + j * D);
#if KILN_CPU_X86
  if (use_dpbf16(D)) {
    scores_dpbf16(rows, kend, D, scale, q, ldq, k, ldkv, t.kp.data(), t.s.data());
    attn::forward_from_scores(rows, kend, D, t.v.data(), D, valid0, valid_step, t.o.data(), D,
                              lse_blk, lse_stride, t.s.data());
  } else
#endif
  {
    for (int64_t r = 0; r < rows; ++r) bf16_to_f32(D, q + r * ldq, t.q.data() + r * D);
    for (int64_t j = 0; j < kend; ++j) bf16_to_f32(D, k + j * ldkv, t.k.data() + j * D);
    attn::forward_block(rows, kend, D, scale, t.q.data(), D, t.k.data(), t.v.data(), D, valid0,
                        valid_step, t.o.data(), D, lse_blk, lse_stride, t.s.data());
  }
  for (int64_t r = 0; r < rows; ++r) f32_to_bf16(D, t.o.data() + r * D, out + r * ldq);
}

}  // namespace

template <>
void attention_forward<bf16>(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t q_offset, double scale, const bf16* q, const bf16* k,
                             const bf16* v, int64_t kv_batch_stride, bf16* out, float* lse) {
  attn::check_attention("forward", B, Tq, Tk, Hq, Hkv, D, q_offset, kv_batch_stride);
  if (B == 0 || Tq == 0) return;
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
    t.v.resize(static_cast<size_t>(Tk * D));
    if (use_dpbf16(D))
      t.kp.resize(static_cast<size_t>((Tk + 15) / 16 * 16 * (D / 2)));
    else
      t.k.resize(static_cast<size_t>(Tk * D));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < plan.ntasks; ++task) {
      const int64_t qb = plan.block(task), hh = plan.head(task), b = plan.batch(task);
      if (plan.grouped) {
        const int64_t kvh = hh, kend = q_offset + 1;
        const bf16* kb = k + b * kv_batch_stride + kvh * D;
        const bf16* vb = v + b * kv_batch_stride + kvh * D;
        for (int64_t g0 = 0; g0 < G; g0 += kBlockQ) {
          const int64_t rows = std::min(kBlockQ, G - g0), h0 = kvh * G + g0;
          forward_block_bf16(t, rows, kend, D, sc, q + (b * Hq + h0) * D, D, kb, vb, ldkv, kend, 0,
                             out + (b * Hq + h0) * D, lse + b * Hq + h0, 1);
        }
      } else {
        const int64_t h = hh, kvh = h / G;
        const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, Tq - i0);
        const int64_t kend = std::min(Tk, q_offset + i0 + rows);
        const int64_t off = (b * Tq + i0) * ldq + h * D;
        forward_block_bf16(t, rows, kend, D, sc, q + off, ldq, k + b * kv_batch_stride + kvh * D,
                           v + b * kv_batch_stride + kvh * D, ldkv, q_offset + i0 + 1, 1, out + off,
                           lse + (b * Hq + h) * Tq + i0, 1);
      }
    }
  }
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
