// Device-side helpers shared by the kernels/cuda/*.cu files (nvcc only; never
// included by g++).
//
// - Load/store: kernels are templated on the storage type T (float, bf16, f16)
// and always
//   compute in float: load(p[i]) widens, store<T>(x) rounds to nearest even.
//   kiln::bf16/f16 are bit-compatible with __nv_bfloat16/__half, so the
//   hardware conversions are used.
// - Reductions: warp_sum/warp_max over 32 lanes, block_sum/block_max over a
// whole block (any
//   blockDim.x that is a multiple of 32, up to 1024).
// - KILN_CUDA_CHECK_LAUNCH(): after every <<<...>>> launch, as llm.c does
// (cudaGetLastError
//   catches bad configurations immediately; asynchronous faults surface at the
//   next sync).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/common/half.h"
#include "kernels/cuda/runtime.h"

#define KILN_CUDA_CHECK_LAUNCH() KILN_CUDA_CHECK(cudaGetLastError())

namespace kiln::cuda {

static_assert(sizeof(bf16) == sizeof(__nv_bfloat16) &&
              sizeof(f16) == sizeof(__half));

__device__ __forceinline__ float load(float x) { return x; }
__device__ __forceinline__ float load(double x) {
  return static_cast<float>(x);
}
__device__ __forceinline__ float load(bf16 x) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16 *>(&x));
}
__device__ __forceinline__ float load(f16 x) {
  return __half2float(*reinterpret_cast<const __half *>(&x));
}

template <typename T> __device__ __forceinline__ T store(float x);
template <> __device__ __forceinline__ float store<float>(float x) { return x; }
template <> __device__ __forceinline__ double store<double>(float x) {
  return x;
}
template <> __device__ __forceinline__ bf16 store<bf16>(float x) {
  __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<bf16 *>(&h);
}
template <> __device__ __forceinline__ f16 store<f16>(float x) {
  __half h = __float2half_rn(x);
  return *reinterpret_cast<f16 *>(&h);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1)
    x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over the block; every thread gets the result. Uses 32 floats of shared
// memory and two
// __syncthreads, so it may be called repeatedly in one kernel.
__device__ __forceinline__ float block_sum(float x) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32,
            warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads(); // partial[] may still be read by a previous call
  if (lane == 0)
    partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : 0.f;
  return warp_sum(x);
}
__device__ __forceinline__ float block_max(float x) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32,
            warps = blockDim.x / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0)
    partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : -FLT_MAX;
  return warp_max(x);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid size for a grid-stride loop over n elements: enough blocks to fill the
// GPU, capped so the index arithmetic stays in range.
inline unsigned grid_for(int64_t n, int threads) {
  int64_t blocks = ceil_div(n, threads);
  if (blocks > 65535LL * 8)
    blocks = 65535LL * 8;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// A kernel switch that is on unless the environment sets `var` to "0" when it is first read.
// `state` (-1: not read yet, 0: off, 1: on) is the caller's, so that its setter overrides the
// environment (tests, A/B benches): KILN_CUDA_GEMV, KILN_CUDA_DECODE_ATTENTION.
inline bool env_switch(std::atomic<int> &state, const char *var) {
  int v = state.load();
  if (v < 0) {
    const char *e = std::getenv(var);
    v = e && std::strcmp(e, "0") == 0 ? 0 : 1;
    state.store(v);
  }
  return v == 1;
}

// Calls f(std::integral_constant<int, m>{}) for a run-time row count m in [1, Max] (Max for
// anything above): the count as a template argument, so that per-row accumulators stay in
// registers (the GEMVs of gemv.cu and quant.cu).
template <int Max, int M = 1, class F> void with_rows(int m, F &&f) {
  if constexpr (M < Max) {
    if (m != M)
      return with_rows<Max, M + 1>(m, std::forward<F>(f));
  }
  f(std::integral_constant<int, M>{});
}

} // namespace kiln::cuda
