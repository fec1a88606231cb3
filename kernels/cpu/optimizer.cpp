// Fused AdamW and SGD steps; see optimizer.h for the exact semantics.
#include "kernels/cpu/optimizer.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kernels/common/adamw_scalars.h"
#include "kernels/common/error.h"
#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

namespace {
constexpr int64_t kParallelMin = 16384;
}

namespace {

// One AdamW update of elements [i0, i1). GCC does not vectorize std::sqrt without
// -fno-math-errno, so the body is written with SSE (same IEEE ops in the same order as the
// scalar tail, hence the same results).
inline void adamw_range(int64_t i0, int64_t i1, float* __restrict param,
                        const float* __restrict grad, float* __restrict m, float* __restrict v,
                        float decay_f, const AdamWConsts& s) {
  int64_t i = i0;
#if defined(__SSE2__)
  const __m128 decay = _mm_set1_ps(decay_f), b1 = _mm_set1_ps(s.beta1), b2 = _mm_set1_ps(s.beta2);
  const __m128 omb1 = _mm_set1_ps(s.one_m_b1), omb2 = _mm_set1_ps(s.one_m_b2);
  const __m128 nss = _mm_set1_ps(s.neg_step_size), bc2 = _mm_set1_ps(s.bc2_sqrt);
  const __m128 eps = _mm_set1_ps(s.eps);
  for (; i + 4 <= i1; i += 4) {
    const __m128 g = _mm_loadu_ps(grad + i);
    const __m128 p = _mm_mul_ps(_mm_loadu_ps(param + i), decay);
    const __m128 mi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m + i), b1), _mm_mul_ps(omb1, g));
    const __m128 vi =
        _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(v + i), b2), _mm_mul_ps(_mm_mul_ps(omb2, g), g));
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), bc2), eps);
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    _mm_storeu_ps(param + i, _mm_add_ps(p, _mm_div_ps(_mm_mul_ps(nss, mi), denom)));
  }
#endif
  for (; i < i1; ++i) param[i] = adamw_update(param[i], grad[i], m[i], v[i], decay_f, s);
}

}  // namespace

void adamw_step(int64_t n, float* param, const float* grad, float* m, float* v, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  KILN_CHECK(n >= 0, "[adamw] negative size {}", n);
  const AdamWConsts s = adamw_consts(lr, beta1, beta2, eps, step);  // checks step >= 1
  const float decay = adamw_decay(lr, weight_decay);
  constexpr int64_t kChunk = 4096;
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < nchunks; ++c)
    adamw_range(c * kChunk, std::min(n, (c + 1) * kChunk), param, grad, m, v, decay, s);
}

void adamw_step(int64_t n, double* param, const double* grad, double* m, double* v, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  KILN_CHECK(n >= 0, "[adamw] negative size {}", n);
  KILN_CHECK(step >= 1, "[adamw] step {} must be >= 1 (counted from 1)", step);
  const double decay = 1.0 - lr * weight_decay;
  const double neg_step_size = -(lr / (1.0 - std::pow(beta1, double(step))));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, double(step)));
  const double one_m_b1 = 1.0 - beta1, one_m_b2 = 1.0 - beta2;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    m[i] = m[i] * beta1 + one_m_b1 * g;
    v[i] = v[i] * beta2 + one_m_b2 * g * g;
    param[i] = param[i] * decay + neg_step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

template <typename P, typename G>
void adamw_step_master(int64_t n, P* param, float* master, const G* grad, float* m, float* v,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       int64_t step) {
  KILN_CHECK(n >= 0, "[adamw] negative size {}", n);
  const AdamWConsts s = adamw_consts(lr, beta1, beta2, eps, step);  // checks step >= 1
  const float decay = adamw_decay(lr, weight_decay);
  constexpr int64_t kChunk = kComputeChunk;
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t i0 = c * kChunk, len = std::min(n, i0 + kChunk) - i0;
    float buf[std::is_same_v<G, float> ? 1 : kChunk];
    const float* g = widen(len, grad + i0, buf);
    adamw_range(0, len, master + i0, g, m + i0, v + i0, decay, s);
    from_compute_n(len, master + i0, param + i0);
  }
}

template void adamw_step_master<bf16, bf16>(int64_t, bf16*, float*, const bf16*, float*, float*,
                                            float, float, float, float, float, int64_t);
template void adamw_step_master<bf16, float>(int64_t, bf16*, float*, const float*, float*, float*,
                                             float, float, float, float, float, int64_t);
template void adamw_step_master<f16, f16>(int64_t, f16*, float*, const f16*, float*, float*, float,
                                          float, float, float, float, int64_t);
template void adamw_step_master<f16, float>(int64_t, f16*, float*, const float*, float*, float*,
                                            float, float, float, float, float, int64_t);

namespace {

// SGD over [i0, i1) with the per-step choices as template parameters, so each variant is a
// straight loop that vectorizes.
template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_range(int64_t i0, int64_t i1, float* __restrict param, const float* __restrict grad,
               float* __restrict buf, float neg_lr, float momentum, float one_m_damp, float wd) {
  for (int64_t i = i0; i < i1; ++i) {
    float d = grad[i];
    if constexpr (kDecay) d = d + wd * param[i];
    if constexpr (kMomentum) {
      const float b = kFirst ? d : buf[i] * momentum + one_m_damp * d;
      buf[i] = b;
      d = kNesterov ? d + momentum * b : b;
    }
    param[i] = param[i] + neg_lr * d;
  }
}

using SgdFn = void (*)(int64_t, int64_t, float*, const float*, float*, float, float, float, float);

template <bool kDecay, bool kMomentum, bool kFirst>
SgdFn pick_sgd(bool nesterov) {
  return nesterov ? &sgd_range<kDecay, kMomentum, kFirst, true>
                  : &sgd_range<kDecay, kMomentum, kFirst, false>;
}
template <bool kDecay, bool kMomentum>
SgdFn pick_sgd(bool first, bool nesterov) {
  return first ? pick_sgd<kDecay, kMomentum, true>(nesterov)
               : pick_sgd<kDecay, kMomentum, false>(nesterov);
}
template <bool kDecay>
SgdFn pick_sgd(bool momentum, bool first, bool nesterov) {
  return momentum ? pick_sgd<kDecay, true>(first, nesterov)
                  : pick_sgd<kDecay, false>(first, nesterov);
}

}  // namespace

void sgd_step(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
              float momentum, float dampening, float weight_decay, bool nesterov, int64_t step) {
  KILN_CHECK(n >= 0, "[sgd] negative size {}", n);
  KILN_CHECK(step >= 1, "[sgd] step {} must be >= 1 (counted from 1)", step);
  KILN_CHECK(momentum == 0.0f || momentum_buf != nullptr, "[sgd] momentum {} needs a buffer",
             momentum);
  KILN_CHECK(!nesterov || (momentum > 0.0f && dampening == 0.0f),
             "[sgd] nesterov needs momentum > 0 and dampening 0");
  const float neg_lr = -lr, one_m_damp = static_cast<float>(1.0 - double(dampening));
  const bool has_mom = momentum != 0.0f;
  const SgdFn fn = weight_decay != 0.0f ? pick_sgd<true>(has_mom, step == 1, nesterov)
                                        : pick_sgd<false>(has_mom, step == 1, nesterov);
  constexpr int64_t kChunk = 4096;
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < nchunks; ++c)
    fn(c * kChunk, std::min(n, (c + 1) * kChunk), param, grad, momentum_buf, neg_lr, momentum,
       one_m_damp, weight_decay);
}

}  // namespace kiln::cpu
