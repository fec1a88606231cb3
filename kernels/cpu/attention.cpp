// Causal GQA attention, forward and backward (math and layouts in attention.h).
//
// A "block" is up to kBlockQ query rows that share one kv head: either consecutive queries of
// one head (row stride Hq*D) or, when Tq == 1, the Hq/Hkv heads of one group (row stride D).
// Per block: S = scale * Qblk K[0:kend]^T (BLAS), row softmax in place (exp_fast), then
// Oblk = P V[0:kend] (BLAS). kend is the last key any row of the block can see, so causal
// blocks skip the keys after the diagonal; the few masked entries left of it are zeroed.
#include "kernels/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention_blocks.h"

namespace kiln::cpu {
namespace {

// ---- BLAS wrappers (row-major) ------------------------------------------------------------------
// Row-major C = alpha op(A) op(B) + beta C. own: the f32 blocks take attn::block_sgemm (the
// attention's head dim passed attn::block_sgemm_takes; beta is 0 or 1 in every block step).
inline void gemm(bool own, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (own && (beta == 0.0f || beta == 1.0f)) {
    attn::block_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta == 1.0f, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
inline void gemm(bool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                 int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
// y = alpha * op(A) x + beta * y, A: (m, n) row-major.
inline void gemv(bool ta, int64_t m, int64_t n, float alpha, const float* a, int64_t lda,
                 const float* x, float beta, float* y) {
  cblas_sgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, int(m), int(n), alpha, a, int(lda), x,
              1, beta, y, 1);
}
inline void gemv(bool ta, int64_t m, int64_t n, double alpha, const double* a, int64_t lda,
                 const double* x, double beta, double* y) {
  cblas_dgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, int(m), int(n), alpha, a, int(lda), x,
              1, beta, y, 1);
}

}  // namespace

namespace attn {

template <typename T>
KILN_SIMD_CLONES void softmax_rows(int64_t rows, int64_t kend, int64_t valid0, int64_t valid_step,
                                   T* s, T* lse_blk, int64_t lse_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    T* sr = s + r * kend;
    const int64_t valid = std::min(kend, valid0 + r * valid_step);
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < valid; ++j) mx = sr[j] > mx ? sr[j] : mx;
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; ++j) {
      const T e = detail::exp_fast(T(sr[j] - mx));
      sr[j] = e;
      sum += double(e);
    }
    const T inv = T(1.0 / sum);
#pragma omp simd
    for (int64_t j = 0; j < valid; ++j) sr[j] *= inv;
    for (int64_t j = valid; j < kend; ++j) sr[j] = T(0);
    lse_blk[r * lse_stride] = T(double(mx) + std::log(sum));
  }
}

namespace {

// Backward, per block: p holds scale * Q K^T (rows, kend); turn it into P = exp(S - lse) with
// zeros right of the diagonal (row r sees i0 + r + 1 keys), and set di[r] = dout_r . out_r.
template <typename T>
KILN_SIMD_CLONES void backward_probs(int64_t rows, int64_t kend, int64_t i0, int64_t D,
                                     const T* lse_blk, const T* oblk, const T* doblk, int64_t ldo,
                                     T* p, T* di) {
  for (int64_t r = 0; r < rows; ++r) {
    T* pr = p + r * kend;
    const int64_t valid = i0 + r + 1;
    const T l = lse_blk[r];
#pragma omp simd
    for (int64_t j = 0; j < valid; ++j) pr[j] = detail::exp_fast(T(pr[j] - l));
    for (int64_t j = valid; j < kend; ++j) pr[j] = T(0);
    double acc = 0;
    const T* dor = doblk + r * ldo;
    const T* orow = oblk + r * ldo;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < D; ++d) acc += double(dor[d]) * double(orow[d]);
    di[r] = T(acc);
  }
}

// dS = P * (dP - Di), in place in dp: (rows, kend).
template <typename T>
KILN_SIMD_CLONES void backward_ds(int64_t rows, int64_t kend, const T* p, const T* di, T* dp) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = p + r * kend;
    T* dr = dp + r * kend;
    const T d = di[r];
#pragma omp simd
    for (int64_t j = 0; j < kend; ++j) dr[j] = pr[j] * (dr[j] - d);
  }
}

}  // namespace

template <typename T>
void forward_block(int64_t rows, int64_t kend, int64_t D, T scale, const T* q_blk, int64_t ldq,
                   const T* k_blk, const T* v_blk, int64_t ldkv, int64_t valid0, int64_t valid_step,
                   T* o_blk, int64_t ldo, T* lse_blk, int64_t lse_stride, T* s) {
  const bool own = std::is_same_v<T, float> && attn::block_sgemm_takes(D);
  if (rows == 1)
    gemv(false, kend, D, scale, k_blk, ldkv, q_blk, T(0), s);
  else
    gemm(own, false, true, rows, kend, D, scale, q_blk, ldq, k_blk, ldkv, T(0), s, kend);
  softmax_rows(rows, kend, valid0, valid_step, s, lse_blk, lse_stride);
  if (rows == 1)
    gemv(true, kend, D, T(1), v_blk, ldkv, s, T(0), o_blk);
  else
    gemm(own, false, false, rows, D, kend, T(1), s, kend, v_blk, ldkv, T(0), o_blk, ldo);
}

void check_attention(const char* what, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv,
                     int64_t D, int64_t q_offset, int64_t kv_batch_stride) {
  KILN_CHECK(B >= 0 && Tq >= 0 && Tk >= 0 && Hq > 0 && Hkv > 0 && D > 0,
             "[attention] {}: bad sizes B={} Tq={} Tk={} Hq={} Hkv={} D={}", what, B, Tq, Tk, Hq,
             Hkv, D);
  KILN_CHECK(Hq % Hkv == 0, "[attention] {}: Hq={} is not a multiple of Hkv={}", what, Hq, Hkv);
  KILN_CHECK(q_offset >= 0 && q_offset <= Tk - Tq,
             "[attention] {}: q_offset={} with Tq={} needs keys up to {}, have Tk={}", what,
             q_offset, Tq, q_offset + Tq, Tk);
  KILN_CHECK(B <= 1 || kv_batch_stride >= Tk * Hkv * D,
             "[attention] {}: kv_batch_stride={} < Tk*Hkv*D={}", what, kv_batch_stride,
             Tk * Hkv * D);
  // BLAS takes int sizes and leading dimensions.
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  KILN_CHECK(Tk <= kIntMax && Hq * D <= kIntMax && kBlockQ * Tk <= kIntMax,
             "[attention] {}: sizes too large for BLAS (Tk={}, Hq*D={})", what, Tk, Hq * D);
}

template <typename T>
void backward_block(int64_t rows, int64_t i0, int64_t D, T scale, const T* q_blk, const T* o_blk,
                    const T* do_blk, const T* lse_blk, int64_t ldq, const T* k_blk, const T* v_blk,
                    int64_t ldkv, T* dq_blk, T* dk_blk, T* dv_blk, T* p, T* dp, T* di) {
  const int64_t kend = i0 + rows;  // causal: no row of the block sees keys >= kend
  const bool own = std::is_same_v<T, float> && attn::block_sgemm_takes(D);
  // P = exp(scale * Q K^T - lse), zero right of the diagonal.
  gemm(own, false, true, rows, kend, D, scale, q_blk, ldq, k_blk, ldkv, T(0), p, kend);
  backward_probs(rows, kend, i0, D, lse_blk, o_blk, do_blk, ldq, p, di);
  // dV[0:kend] += P^T dO
  gemm(own, true, false, kend, D, rows, T(1), p, kend, do_blk, ldq, T(1), dv_blk, ldkv);
  // dP = dO V^T, then dS = P * (dP - Di) in place (zero where P is zero).
  gemm(own, false, true, rows, kend, D, T(1), do_blk, ldq, v_blk, ldkv, T(0), dp, kend);
  backward_ds(rows, kend, p, di, dp);
  // dQ = scale * dS K[0:kend] (each query row belongs to exactly one block: =)
  gemm(own, false, false, rows, D, kend, scale, dp, kend, k_blk, ldkv, T(0), dq_blk, ldq);
  // dK[0:kend] += scale * dS^T Q
  gemm(own, true, false, kend, D, rows, scale, dp, kend, q_blk, ldq, T(1), dk_blk, ldkv);
}

#define KILN_INSTANTIATE_BLOCKS(T)                                                                \
  template void softmax_rows<T>(int64_t, int64_t, int64_t, int64_t, T*, T*, int64_t);             \
  template void forward_block<T>(int64_t, int64_t, int64_t, T, const T*, int64_t, const T*,       \
                                 const T*, int64_t, int64_t, int64_t, T*, int64_t, T*, int64_t,   \
                                 T*);                                                             \
  template void backward_block<T>(int64_t, int64_t, int64_t, T, const T*, const T*, const T*,     \
                                  const T*, int64_t, const T*, const T*, int64_t, T*, T*, T*, T*, \
                                  T*, T*);
KILN_INSTANTIATE_BLOCKS(float)
KILN_INSTANTIATE_BLOCKS(double)
#undef KILN_INSTANTIATE_BLOCKS

}  // namespace attn

using attn::kBlockQ;

template <typename T>
void attention_forward(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                       int64_t q_offset, double scale, const T* q, const T* k, const T* v,
                       int64_t kv_batch_stride, T* out, compute_t<T>* lse) {
  attn::check_attention("forward", B, Tq, Tk, Hq, Hkv, D, q_offset, kv_batch_stride);
  if (B == 0 || Tq == 0) return;
  const attn::ForwardPlan plan(B, Tq, Tk, Hq, Hkv, D);
  const int64_t G = plan.G, ldq = plan.ldq, ldkv = plan.ldkv;
  const T sc = T(scale);
  attn::BlasSingleThreaded blas_guard;

#pragma omp parallel if (plan.parallel)
  {
    std::vector<T> s(static_cast<size_t>(plan.max_rows * Tk));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < plan.ntasks; ++task) {
      const int64_t qb = plan.block(task), hh = plan.head(task), b = plan.batch(task);
      if (plan.grouped) {
        const int64_t kvh = hh;
        const T* kb = k + b * kv_batch_stride + kvh * D;
        const T* vb = v + b * kv_batch_stride + kvh * D;
        const int64_t kend = q_offset + 1;
        for (int64_t g0 = 0; g0 < G; g0 += kBlockQ) {  // G > 64 never happens in practice
          const int64_t rows = std::min(kBlockQ, G - g0);
          const int64_t h0 = kvh * G + g0;
          attn::forward_block(rows, kend, D, sc, q + (b * Hq + h0) * D, D, kb, vb, ldkv, kend, 0,
                              out + (b * Hq + h0) * D, D, lse + b * Hq + h0, 1, s.data());
        }
      } else {
        const int64_t h = hh, kvh = h / G;
        const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, Tq - i0);
        const int64_t kend = std::min(Tk, q_offset + i0 + rows);
        const int64_t off = (b * Tq + i0) * Hq * D + h * D;
        attn::forward_block(rows, kend, D, sc, q + off, ldq, k + b * kv_batch_stride + kvh * D,
                            v + b * kv_batch_stride + kvh * D, ldkv, q_offset + i0 + 1, 1,
                            out + off, ldq, lse + (b * Hq + h) * Tq + i0, 1, s.data());
      }
    }
  }
}

template <typename T>
void attention_backward(int64_t B, int64_t T_, int64_t Hq, int64_t Hkv, int64_t D, double scale,
                        const T* q, const T* k, const T* v, const T* out, const compute_t<T>* lse,
                        const T* dout, T* dq, T* dk, T* dv) {
  attn::check_attention("backward", B, T_, T_, Hq, Hkv, D, 0, T_ * Hkv * D);
  if (B == 0 || T_ == 0) return;
  const attn::BackwardPlan plan(B, T_, Hq, Hkv, D);
  const int64_t G = plan.G, ldq = plan.ldq, ldkv = plan.ldkv, nqb = plan.nqb;
  const T sc = T(scale);
  attn::BlasSingleThreaded blas_guard;

#pragma omp parallel if (plan.parallel)
  {
    std::vector<T> p(static_cast<size_t>(plan.brows * T_)),
        dp(static_cast<size_t>(plan.brows * T_));
    std::vector<T> di(static_cast<size_t>(plan.brows));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < plan.ntasks; ++task) {
      const int64_t b = task / Hkv, kvh = task % Hkv;
      const int64_t kv_off = b * T_ * ldkv + kvh * D;
      const T* kb = k + kv_off;
      const T* vb = v + kv_off;
      T* dkb = dk + kv_off;
      T* dvb = dv + kv_off;
      for (int64_t t = 0; t < T_; ++t) {
        std::fill(dkb + t * ldkv, dkb + t * ldkv + D, T(0));
        std::fill(dvb + t * ldkv, dvb + t * ldkv + D, T(0));
      }
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = kvh * G + g;
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, T_ - i0);
          const int64_t off = (b * T_ + i0) * ldq + h * D;
          attn::backward_block(rows, i0, D, sc, q + off, out + off, dout + off,
                               lse + (b * Hq + h) * T_ + i0, ldq, kb, vb, ldkv, dq + off, dkb, dvb,
                               p.data(), dp.data(), di.data());
        }
      }
    }
  }
}

#define KILN_INSTANTIATE(T)                                                                       \
  template void attention_forward<T>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,        \
                                     int64_t, double, const T*, const T*, const T*, int64_t, T*,  \
                                     T*);                                                         \
  template void attention_backward<T>(int64_t, int64_t, int64_t, int64_t, int64_t, double,        \
                                      const T*, const T*, const T*, const T*, const T*, const T*, \
                                      T*, T*, T*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
