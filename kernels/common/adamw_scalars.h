// The per-step AdamW scalars shared by the CPU kernel (kernels/cpu/optimizer.cpp) and the CUDA
// kernels (kernels/cuda/optimizer.cu), so both backends round them identically. They are
// computed in double from the f32 inputs, as PyTorch's Python code does, then rounded to f32:
//   decay = f32(1 - lr * wd), neg_step_size = f32(-(lr / (1 - b1^step))),
//   bc2_sqrt = f32(sqrt(1 - b2^step)), one_m_b1 = f32(1 - b1), one_m_b2 = f32(1 - b2).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/error.h"

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

}  // namespace kiln
