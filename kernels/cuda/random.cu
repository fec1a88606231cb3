// Philox random fills (math and stream layout in random.h and kernels/common/philox.h).
// One thread per Philox block: it computes the 4 lanes of counter offset + b once and writes
// elements 4b .. 4b+3 (fewer at the end). out: (n) contiguous.
#include "kernels/common/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/random.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// Separate round-to-nearest multiply and add: never contracted into an FMA, as on the CPU.
__device__ __forceinline__ float affine_rn(float a, float s, float u) {
  return __fadd_rn(a, __fmul_rn(s, u));
}
__device__ __forceinline__ double affine_rn(double a, double s, double u) {
  return __dadd_rn(a, __dmul_rn(s, u));
}

template <typename T, typename C>
__device__ __forceinline__ T to_storage(C x) {
  if constexpr (std::is_same_v<T, C>)
    return x;
  else
    return store<T>(x);  // C is float here: bf16/f16 round to nearest even
}

// C: the compute type (double for T = double, else float).
template <typename T, typename C>
__global__ void uniform_kernel(std::int64_t n, C lo, C span, std::uint64_t seed,
                               std::uint64_t offset, T* __restrict__ out) {
  const std::int64_t blocks = (n + 3) / 4;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < blocks; b += stride) {
    const Philox4 r = philox_block(seed, offset + static_cast<std::uint64_t>(b));
    const std::int64_t i0 = b * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i0 + k < n)
        out[i0 + k] = to_storage<T>(affine_rn(lo, span, static_cast<C>(uniform01(r.v[k]))));
  }
}

template <typename T, typename C>
__global__ void normal_kernel(std::int64_t n, C mean, C stdev, std::uint64_t seed,
                              std::uint64_t offset, T* __restrict__ out) {
  const std::int64_t blocks = (n + 3) / 4;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < blocks; b += stride) {
    const Philox4 r = philox_block(seed, offset + static_cast<std::uint64_t>(b));
    float z[4];
    box_muller(r.v[0], r.v[1], z[0], z[1]);
    box_muller(r.v[2], r.v[3], z[2], z[3]);
    const std::int64_t i0 = b * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i0 + k < n) out[i0 + k] = to_storage<T>(affine_rn(mean, stdev, static_cast<C>(z[k])));
  }
}

template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace

template <typename T>
void random_uniform(std::int64_t n, double lo, double hi, std::uint64_t seed, std::uint64_t offset,
                    T* out, StreamHandle stream) {
  KILN_CHECK(n >= 0, "[random_uniform] negative size {}", n);
  if (n == 0) return;
  using C = compute_t<T>;
  // As the CPU: lo and (hi - lo) computed in double, then rounded to the compute type.
  uniform_kernel<T, C><<<grid_for(ceil_div(n, 4), kThreads), kThreads, 0, stream>>>(
      n, static_cast<C>(lo), static_cast<C>(hi - lo), seed, offset, out);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void random_normal(std::int64_t n, double mean, double stdev, std::uint64_t seed,
                   std::uint64_t offset, T* out, StreamHandle stream) {
  KILN_CHECK(n >= 0, "[random_normal] negative size {}", n);
  if (n == 0) return;
  using C = compute_t<T>;
  normal_kernel<T, C><<<grid_for(ceil_div(n, 4), kThreads), kThreads, 0, stream>>>(
      n, static_cast<C>(mean), static_cast<C>(stdev), seed, offset, out);
  KILN_CUDA_CHECK_LAUNCH();
}

#define KILN_CUDA_RANDOM_INST(T)                                                                  \
  template void random_uniform<T>(std::int64_t, double, double, std::uint64_t, std::uint64_t, T*, \
                                  StreamHandle);                                                  \
  template void random_normal<T>(std::int64_t, double, double, std::uint64_t, std::uint64_t, T*,  \
                                 StreamHandle);
KILN_CUDA_RANDOM_INST(float)
KILN_CUDA_RANDOM_INST(double)
KILN_CUDA_RANDOM_INST(bf16)
KILN_CUDA_RANDOM_INST(f16)
#undef KILN_CUDA_RANDOM_INST

}  // namespace kiln::cuda
