// Multi-tensor CUDA helpers beside the op contract of tensor/kernels_cuda.h (implemented in
// tensor/kernels_cuda_loss.cpp, with the optimizers). Not a public header: nn/optim.cpp calls it
// for CUDA parameters only.
#pragma once

#include <span>

#include "kernels/cuda/runtime.h"
#include "tensor/tensor.h"

namespace kiln::ops::cuda_ops {

#if defined(KILN_CUDA)
// sum over every defined tensor of sum_i x_i^2 (f32 squares, f64 across blocks), for global
// gradient-norm clipping: one launch for all tensors and one device-to-host copy (the only sync),
// instead of one per tensor. Tensors: CUDA, one device, f32/bf16/f16, any strides (non-contiguous
// ones are copied first, charged to Temporaries). Deterministic.
double sum_squares_multi(std::span<const Tensor> tensors);
#else
[[noreturn]] inline double sum_squares_multi(std::span<const Tensor>) {
  ::kiln::cuda::no_cuda("ops::sum_squares_multi");
}
#endif

}  // namespace kiln::ops::cuda_ops
