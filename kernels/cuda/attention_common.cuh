// Pieces shared by attention_fwd.cu and attention_bwd.cu (nvcc only).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"

namespace kiln::cuda::attn {

// Raise a kernel's dynamic shared-memory limit (needed above 48 KB) once per
// device. The flag array is per kernel instantiation (one static per template
// argument list of the caller).
template <typename Kernel>
void ensure_smem(Kernel kernel, size_t bytes, std::atomic<bool> (&done)[16]) {
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 16 && done[dev].load(std::memory_order_acquire)) return;
  KILN_CHECK(bytes <= 227 * 1024, "[attention] kernel needs {} bytes of shared memory", bytes);
  KILN_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  if (dev >= 0 && dev < 16) done[dev].store(true, std::memory_order_release);
}

inline dim3 plan_grid(const AttentionPlan &p) {
  return dim3(static_cast<unsigned>(p.grid[0]), static_cast<unsigned>(p.grid[1]),
              static_cast<unsigned>(p.grid[2]));
}

}  // namespace kiln::cuda::attn
