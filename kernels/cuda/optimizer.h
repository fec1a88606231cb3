// CUDA optimizer steps and the multi-tensor sum of squares (gradient clipping). Plain C++
// header (compiled by g++ too); kernels in optimizer.cu.
//
// The arithmetic is kernels/cpu/optimizer.h's, operation for operation, so a CUDA step gives
// the same bits as the CPU step (the CPU build has no FMA contraction by default; the kernels
// use explicitly rounded __fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn so nvcc cannot contract
// either):
//
// adamw (PyTorch 1.13 torch.optim.AdamW, step counted from 1), per element, all f32:
//   w  = master if the item has one, else param
//   p  = w * decay                                   decay = f32(1 - lr * wd)
//   m  = m * b1 + (1 - b1) * g                       g widened to f32 from the grad's dtype
//   v  = v * b2 + ((1 - b2) * g) * g
//   w' = p + (neg_step_size * m) / (sqrt(v) / bc2_sqrt + eps)
//        neg_step_size = f32(-(lr / (1 - b1^step))), bc2_sqrt = f32(sqrt(1 - b2^step))
//   master = w' (if any); param = round_to_param_dtype(w')                              (=)
// The scalars are computed in double from the f32-rounded inputs, as the CPU kernel does
// (adamw_consts / adamw_decay, kernels/common/adamw_scalars.h).
//
// sgd (PyTorch 1.13 torch.optim.SGD), per element, f32: as kernels/cpu/optimizer.h.
//
// Multi-tensor AdamW: ALL items in one launch (more only past 512 pieces or 2^31 chunks of
// kMultiChunk elements). The per-item descriptors (pointers, sizes, dtypes, decay) and the
// block -> (item, chunk) table (kernels/common/multi_tensor_plan.h) are the kernel's parameter
// block (__grid_constant__, up to 32 KB since CUDA 12.1): the launch itself uploads them, so
// there is no device buffer to allocate, account for in the memory report, or keep in sync
// with a cached copy, and the meta dry run (which launches nothing) stays exact. Items may mix
// f32 params with bf16/f16 params that have an f32 master, and grads in the param's dtype or
// f32. Each block takes kMultiChunk elements of one item, 4 per thread per step with vector
// loads when every pointer of the item is aligned for it.
//
// sum_squares_multi: sum over all tensors of x^2 in one launch plus a one-block combine, one
// device-to-host copy (the only sync). Deterministic: squares summed in f32 per thread and per
// block (fixed shuffle tree), chunk sums added in double in a fixed order per block, blocks
// combined in a fixed tree; no atomics. It keeps its partial sums in a static __device__
// array, so calls must not overlap (kiln launches everything on one stream from one thread).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "kernels/common/adamw_scalars.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

// Element types an optimizer item may hold.
enum class OptDType : std::uint8_t { F32 = 0, BF16 = 1, F16 = 2 };

// The per-step scalars (kernels/common/adamw_scalars.h, shared with the CPU kernel).
using ::kiln::adamw_consts;
using ::kiln::adamw_decay;
using ::kiln::AdamWConsts;

// One tensor of a multi-tensor AdamW step (device pointers, contiguous, numel elements each).
struct AdamWItem {
  void* param = nullptr;       // param_dtype
  const void* grad = nullptr;  // grad_dtype
  float* master = nullptr;     // f32 master, or null (then param must be f32)
  float* m = nullptr;
  float* v = nullptr;
  std::int64_t numel = 0;
  float decay = 1.0f;  // adamw_decay(lr, this item's weight decay)
  OptDType param_dtype = OptDType::F32;
  OptDType grad_dtype = OptDType::F32;  // param_dtype or F32
};

// Elements per block in the multi-tensor kernels, and pieces per launch.
inline constexpr std::int64_t kMultiChunk = 16384;
inline constexpr int kMultiSlots = 512;

// All items in as few launches as the limits allow (one for any real model). Checks the items (null
// pointers, dtype pairs, master presence) before launching anything.
void adamw_multi_step(std::span<const AdamWItem> items, const AdamWConsts& c,
                      StreamHandle stream = nullptr);

// Single f32 tensor, same signature and checks as cpu::adamw_step (one multi item).
void adamw_step(std::int64_t n, float* param, const float* grad, float* m, float* v, float lr,
                float beta1, float beta2, float eps, float weight_decay, std::int64_t step,
                StreamHandle stream = nullptr);

// Same signature and checks as cpu::sgd_step; momentum_buf may be null when momentum == 0.
void sgd_step(std::int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
              float momentum, float dampening, float weight_decay, bool nesterov, std::int64_t step,
              StreamHandle stream = nullptr);

// One tensor of sum_squares_multi (device pointer, contiguous).
struct SumSquaresItem {
  const void* data = nullptr;
  std::int64_t numel = 0;
  OptDType dtype = OptDType::F32;
};
// Returns sum over items of sum_i x_i^2 (synchronizes `stream`). 0 for no elements.
double sum_squares_multi(std::span<const SumSquaresItem> items, StreamHandle stream = nullptr);

}  // namespace kiln::cuda
