// Fused AdamW and SGD steps; see optimizer.h for the exact semantics.
#include "kernels/cpu/optimizer.h"

#include <cmath>

#include "kernels/common/error.h"

namespace kiln::cpu {

namespace {
constexpr int64_t kParallelMin = 16384;
}

void adamw_step(int64_t n, float* __restrict param, const float* __restrict grad,
                float* __restrict m, float* __restrict v, float lr, float beta1, float beta2,
                float eps, float weight_decay, int64_t step) {
  KILN_CHECK(n >= 0, "[adamw] negative size {}", n);
  KILN_CHECK(step >= 1, "[adamw] step {} must be >= 1 (counted from 1)", step);
  const double lr_d = lr, b1 = beta1, b2 = beta2;
  const float decay = static_cast<float>(1.0 - lr_d * double(weight_decay));
  const float one_m_b1 = static_cast<float>(1.0 - b1), one_m_b2 = static_cast<float>(1.0 - b2);
  const double bc1 = 1.0 - std::pow(b1, double(step));
  const double bc2 = 1.0 - std::pow(b2, double(step));
  const float neg_step_size = static_cast<float>(-(lr_d / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float mi = m[i] * beta1 + one_m_b1 * g;
    const float vi = v[i] * beta2 + (one_m_b2 * g) * g;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    param[i] = p + (neg_step_size * mi) / denom;
  }
}

void sgd_step(int64_t n, float* __restrict param, const float* __restrict grad,
              float* __restrict momentum_buf, float lr, float momentum, float dampening,
              float weight_decay, bool nesterov, int64_t step) {
  KILN_CHECK(n >= 0, "[sgd] negative size {}", n);
  KILN_CHECK(step >= 1, "[sgd] step {} must be >= 1 (counted from 1)", step);
  KILN_CHECK(momentum == 0.0f || momentum_buf != nullptr, "[sgd] momentum {} needs a buffer",
             momentum);
  KILN_CHECK(!nesterov || (momentum > 0.0f && dampening == 0.0f),
             "[sgd] nesterov needs momentum > 0 and dampening 0");
  const float neg_lr = -lr, one_m_damp = static_cast<float>(1.0 - double(dampening));
  const bool first = step == 1;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float d = grad[i];
    if (weight_decay != 0.0f) d = d + weight_decay * param[i];
    if (momentum != 0.0f) {
      const float buf = first ? d : momentum_buf[i] * momentum + one_m_damp * d;
      momentum_buf[i] = buf;
      d = nesterov ? d + momentum * buf : buf;
    }
    param[i] = param[i] + neg_lr * d;
  }
}

}  // namespace kiln::cpu
