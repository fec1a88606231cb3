// Device helpers shared by the row kernels (softmax.cu, norm.cu) and the packed loads of
// embedding.cu (nvcc only).
//
// A "group" is one warp (narrow rows; several warps per block, each on its own row or chunk) or
// one whole block (wide rows). make_group<kWarp>() says which thread of which group this is;
// group_sum / group_max reduce over the group (in block mode they hold __syncthreads, so every
// thread of the block must call them).
// ldp / stp load and store a Pack<T, V> (kernels/cuda/activation.h): V elements in one access,
// so p must be aligned to sizeof(T) * V.
#pragma once

#include <cstdint>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

struct Group {
  int lane;            // thread index within the group
  int size;            // threads in the group
  std::int64_t index;  // row (or chunk of rows) this group works on
};

template <bool kWarp>
__device__ __forceinline__ Group make_group() {
  if constexpr (kWarp) {
    return {static_cast<int>(threadIdx.x % 32), 32,
            static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32};
  } else {
    return {static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x),
            static_cast<std::int64_t>(blockIdx.x)};
  }
}

template <bool kWarp>
__device__ __forceinline__ float group_sum(float v) {
  if constexpr (kWarp)
    return warp_sum(v);
  else
    return block_sum(v);
}
template <bool kWarp>
__device__ __forceinline__ float group_max(float v) {
  if constexpr (kWarp)
    return warp_max(v);
  else
    return block_max(v);
}

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> ldp(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <typename T, int V>
__device__ __forceinline__ void stp(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}

}  // namespace kiln::cuda
