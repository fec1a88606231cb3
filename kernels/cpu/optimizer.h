// Fused optimizer steps on float32 parameters (update param, m, v, momentum_buf in place).
//
// adamw_step, PyTorch 1.13 torch.optim.AdamW (amsgrad off, maximize off), step counted from 1:
//   p  = p * (1 - lr * wd)
//   m  = b1 * m + (1 - b1) * g
//   v  = b2 * v + (1 - b2) * g * g
//   p += -(lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),   bc1 = 1 - b1^step, bc2 = 1 - b2^step
// Scalars (1 - lr*wd, lr/bc1, sqrt(bc2), ...) are computed in double as Python does, then rounded
// to float; the per-element arithmetic is float in torch's order, so results agree with torch to
// about float rounding.
//
// sgd_step, PyTorch 1.13 torch.optim.SGD (maximize off):
//   d = g + wd * p                                  (if wd != 0)
//   if momentum != 0:
//     buf = d                        at step 1     (torch creates the buffer from d)
//     buf = momentum * buf + (1 - dampening) * d   afterwards
//     d = nesterov ? d + momentum * buf : buf
//   p = p - lr * d
// momentum_buf may be null when momentum == 0.
#pragma once

#include <cstdint>

namespace kiln::cpu {

void adamw_step(int64_t n, float* param, const float* grad, float* m, float* v, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t step);

// f64 parameters (the checking dtype: data-parallel equality tests compare in f64, where the
// summation order's rounding is too small for AdamW's near-sign first step to amplify): the
// same update with every scalar and element in double, as PyTorch computes f64 tensors.
void adamw_step(int64_t n, double* param, const double* grad, double* m, double* v, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step);

// Mixed precision, the recipe of the CUDA kernel: a bf16/f16 parameter P with an f32 master.
// The master takes adamw_step's update (same operations, same order, so the same bits) from the
// gradient G (the parameter's type or f32) widened to f32 a chunk at a time on the stack, then
// param = P(master), rounded once. No f32 copy of the gradient is made.
template <typename P, typename G>
void adamw_step_master(int64_t n, P* param, float* master, const G* grad, float* m, float* v,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       int64_t step);

void sgd_step(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
              float momentum, float dampening, float weight_decay, bool nesterov, int64_t step);

}  // namespace kiln::cpu
