// The AdamW math shared by the CPU kernel (kernels/cpu/optimizer.cpp) and the CUDA
// kernels (kernels/cuda/optimizer.cu), so both backends round identically: the per-step scalars
// and the per-element update. The scalars are computed in double from the f32 inputs, as PyTorch's
// Python code does, then rounded to f32:
//   decay = f32(1 - lr * wd), neg_step_size = f32(-(lr / (1 - b1^step))),
//   bc2_sqrt = f32(sqrt(1 - b2^step)), one_m_b1 = f32(1 - b1), one_m_b2 = f32(1 - b2).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/error.h"
#include "kernels/common/half.h"  // KILN_HOST_DEVICE

namespace kiln {

struct AdamWConsts {
  float beta1, beta2, one_m_b1, one_m_b2, neg_step_size, bc2_sqrt, eps;
};

inline AdamWConsts adamw_consts(float lr, float beta1, float beta2, float eps, std::int64_t step) {
  KILN_CHECK(step >= 1, "[adamw] step {} must be >= 1 (counted from 1)", step);
  const double lr_d = lr, b1 = beta1, b2 = beta2;
  const double bc1 = 1.0 - std::pow(b1, double(step));
  const double bc2 = 1.0 - std::pow(b2, double(step));
  return {beta1,
          beta2,
          static_cast<float>(1.0 - b1),
          static_cast<float>(1.0 - b2),
          static_cast<float>(-(lr_d / bc1)),
          static_cast<float>(std::sqrt(bc2)),
          eps};
}
inline float adamw_decay(float lr, float weight_decay) {
  return static_cast<float>(1.0 - double(lr) * double(weight_decay));
}

// f32 operations rounded one by one, never fused into an FMA (CUDA's default contraction would
// otherwise change the last bit), so both backends compute the same numbers.
namespace rn {
#if defined(__CUDA_ARCH__)
__device__ inline float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float add(float a, float b) { return __fadd_rn(a, b); }
__device__ inline float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline float sqrt(float a) { return __fsqrt_rn(a); }
#else
inline float mul(float a, float b) { return a * b; }
inline float add(float a, float b) { return a + b; }
inline float div(float a, float b) { return a / b; }
inline float sqrt(float a) { return std::sqrt(a); }
#endif
}  // namespace rn

// One AdamW element: w (decayed) moves by -step_size m / (sqrt(v) / bc2_sqrt + eps); m and v
// are updated in place. The CPU kernel's SIMD body performs the same operations in this order.
KILN_HOST_DEVICE inline float adamw_update(float w, float g, float& m, float& v, float decay,
                                           const AdamWConsts& c) {
  const float p = rn::mul(w, decay);
  const float mi = rn::add(rn::mul(m, c.beta1), rn::mul(c.one_m_b1, g));
  const float vi = rn::add(rn::mul(v, c.beta2), rn::mul(rn::mul(c.one_m_b2, g), g));
  const float denom = rn::add(rn::div(rn::sqrt(vi), c.bc2_sqrt), c.eps);
  m = mi;
  v = vi;
  return rn::add(p, rn::div(rn::mul(c.neg_step_size, mi), denom));
}

}  // namespace kiln
