// Fused cross-entropy forward and backward on CUDA (math, layouts and the bad-target policy in
// cross_entropy.h).
//
// One block per row (grid.x = N). A row is split into a head (elements before the first
// 16-byte boundary), a body of 16-byte vectors (4 f32 or 8 bf16/f16), and a tail; thread k takes
// vectors k, k + blockDim, ... of the body and at most one head and one tail element.
// forward: each thread keeps an online (max, sum of exp(x - max)) pair over its elements; the
//   pairs are merged across the warp (shuffles) and the block (shared memory), in a fixed
//   order, so results are deterministic. One read of the row.
// backward: each thread reads its vectors, writes dloss * (softmax - onehot) over them in T;
//   ignored rows are only written (zeros). One read and one write of the row.
// Few rows (decode-sized N) get 1024 threads per row rather than a split of V across blocks:
// a split needs a scratch buffer for the partial (max, sum) pairs, which the dry run would not
// see.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cross_entropy.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxThreads = 1024;
constexpr float kLog2e = 1.4426950408889634f;

// The sticky smallest bad (row, target) of this device; see cross_entropy.h.
__device__ unsigned long long g_bad_target = ~0ull;

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
union Vec {
  uint4 raw;
  T e[kVec<T>];
};

struct MaxSum {
  float m, s;  // running max, and sum of exp(x - m) over the elements seen
};

// exp(from - to) with exp(-inf - -inf) taken as 1 (an empty or all -inf partial stays as is).
__device__ __forceinline__ float rescale(float from, float to) {
  return from == to ? 1.f : exp2f((from - to) * kLog2e);
}
// exp(x - m) with exp(-inf - m) = 0 for every m (m = -inf would give NaN).
__device__ __forceinline__ float term(float x, float m) {
  return x == -INFINITY ? 0.f : exp2f((x - m) * kLog2e);
}

template <int E>
__device__ __forceinline__ void ms_add(MaxSum& a, const float (&x)[E]) {
  float vm = x[0];
#pragma unroll
  for (int k = 1; k < E; ++k) vm = fmaxf(vm, x[k]);  // NaNs are dropped here, kept in the sum
  const float m = fmaxf(a.m, vm);
  if (m != a.m) {
    a.s *= rescale(a.m, m);
    a.m = m;
  }
#pragma unroll
  for (int k = 0; k < E; ++k) a.s += term(x[k], m);
}

__device__ __forceinline__ MaxSum ms_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * rescale(a.m, m) + b.s * rescale(b.m, m)};
}

// Merge over the block (blockDim.x a multiple of 32); thread 0 gets the result.
__device__ __forceinline__ MaxSum block_merge(MaxSum a) {
  __shared__ MaxSum partial[32];
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
    b.s = __shfl_xor_sync(0xffffffffu, a.s, o);
    a = ms_merge(a, b);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) partial[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < warps ? partial[lane] : MaxSum{-INFINITY, 0.f};
    for (int o = 16; o > 0; o >>= 1) {
      MaxSum b;
      b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
      b.s = __shfl_xor_sync(0xffffffffu, a.s, o);
      a = ms_merge(a, b);
    }
  }
  return a;
}

// Elements before the first 16-byte boundary of the row (p is aligned to sizeof(T)).
template <typename T>
__device__ __forceinline__ int head_of(const T* p, int V) {
  const int mis = static_cast<int>((reinterpret_cast<std::uintptr_t>(p) % 16) / sizeof(T));
  return min(V, mis == 0 ? 0 : kVec<T> - mis);
}

// logits: (N, V) rows ld apart; targets, loss, lse: (N).
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    ce_forward_kernel(int V, std::int64_t ld, const T* __restrict__ logits,
                      const std::int32_t* __restrict__ targets, std::int32_t ignore_index,
                      float* __restrict__ loss, float* __restrict__ lse) {
  constexpr int E = kVec<T>;
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  const int head = head_of(x, V);
  const int nvec = (V - head) / E;
  const int tail = head + nvec * E;
  MaxSum a{-INFINITY, 0.f};
  const int tid = threadIdx.x;
  if (tid < head) ms_add<1>(a, {load(x[tid])});
  if (tail + tid < V) ms_add<1>(a, {load(x[tail + tid])});
  const uint4* body = reinterpret_cast<const uint4*>(x + head);
#pragma unroll 2
  for (int k = tid; k < nvec; k += blockDim.x) {
    Vec<T> u;
    u.raw = body[k];
    float f[E];
#pragma unroll
    for (int j = 0; j < E; ++j) f[j] = load(u.e[j]);
    ms_add<E>(a, f);
  }
  a = block_merge(a);
  if (tid != 0) return;
  const float log_s = logf(a.s);
  // A row of all -inf has no finite max: its lse is -inf (as log(0)), as on the CPU.
  lse[row] = isfinite(a.m) ? a.m + log_s : a.m;
  const std::int32_t t = targets[row];
  if (t == ignore_index) {
    loss[row] = 0.f;
  } else if (t < 0 || t >= V) {
    loss[row] = __int_as_float(0x7fc00000);  // NaN
    atomicMin(&g_bad_target, static_cast<unsigned long long>(encode_bad_target(row, t)));
  } else {
    // (max - target) + log(sum): keeps a small loss's digits when the logits are large.
    loss[row] = (a.m - load(x[t])) + log_s;
  }
}

// dlogits (N, V) dense, may be logits itself (then ld == V).
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    ce_backward_kernel(int V, std::int64_t ld, const T* logits, const float* __restrict__ lse,
                       std::int64_t lse_stride, const std::int32_t* __restrict__ targets,
                       std::int32_t ignore_index, const float* __restrict__ dloss,
                       std::int64_t dloss_stride, T* dlogits) {
  constexpr int E = kVec<T>;
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  T* d = dlogits + row * static_cast<std::int64_t>(V);
  const int tid = threadIdx.x;
  const std::int32_t t = targets[row];
  const bool same_align =
      (reinterpret_cast<std::uintptr_t>(x) ^ reinterpret_cast<std::uintptr_t>(d)) % 16 == 0;
  const int head = same_align ? head_of(d, V) : V;  // misaligned pair: all scalar
  const int nvec = (V - head) / E;
  const int tail = head + nvec * E;
  uint4* dbody = reinterpret_cast<uint4*>(d + head);

  if (t == ignore_index) {  // zeros, without reading the row
    const T zero = store<T>(0.f);
    for (int i = tid; i < head; i += blockDim.x) d[i] = zero;
    for (int i = tail + tid; i < V; i += blockDim.x) d[i] = zero;
    Vec<T> z;
#pragma unroll
    for (int j = 0; j < E; ++j) z.e[j] = zero;
    for (int k = tid; k < nvec; k += blockDim.x) dbody[k] = z.raw;
    return;
  }
  float g, l;  // dloss, lse
  if (t < 0 || t >= V) {
    g = __int_as_float(0x7fc00000);  // a NaN row: the step must not go on quietly
    l = 0.f;
    if (tid == 0)
      atomicMin(&g_bad_target, static_cast<unsigned long long>(encode_bad_target(row, t)));
  } else {
    g = dloss[row * dloss_stride];
    l = lse[row * lse_stride];
  }
  // x - lse first: exact-ish where it matters (x near lse), then one rounding into exp2.
  auto grad = [&](int v, float xv) {
    return g * (exp2f((xv - l) * kLog2e) - (v == t ? 1.f : 0.f));
  };
  // head and tail: at most E - 1 elements each, unless the row is all scalar
  for (int i = tid; i < head; i += blockDim.x) d[i] = store<T>(grad(i, load(x[i])));
  for (int i = tail + tid; i < V; i += blockDim.x) d[i] = store<T>(grad(i, load(x[i])));
  const uint4* xbody = reinterpret_cast<const uint4*>(x + head);
#pragma unroll 2
  for (int k = tid; k < nvec; k += blockDim.x) {
    Vec<T> u;
    u.raw = xbody[k];  // read before the write below (same thread and address in place)
    const int v0 = head + k * E;
#pragma unroll
    for (int j = 0; j < E; ++j) u.e[j] = store<T>(grad(v0 + j, load(u.e[j])));
    dbody[k] = u.raw;
  }
}

// Threads per row: enough vectors for every thread, a multiple of 32, at most 512 (1024 when there
// are few rows, so that a single long row still gets a whole SM's worth of loads).
template <typename T>
int threads_for(std::int64_t N, std::int64_t V) {
  const std::int64_t cap = N < 128 ? 1024 : 512;
  const std::int64_t need = (ceil_div(V, kVec<T>) + 31) / 32 * 32;
  return static_cast<int>(std::max<std::int64_t>(32, std::min(cap, need)));
}

void check_sizes(std::int64_t N, std::int64_t V, std::int64_t ld) {
  KILN_CHECK(N >= 0 && V > 0 && V <= INT_MAX && ld >= V,
             "[cross_entropy] bad sizes N={} V={} row stride {}", N, V, ld);
  KILN_CHECK(N <= INT_MAX, "[cross_entropy] {} rows: at most {} per call on CUDA", N, INT_MAX);
}

}  // namespace

template <typename T>
void cross_entropy_forward(std::int64_t N, std::int64_t V, std::int64_t ld, const T* logits,
                           const std::int32_t* targets, std::int32_t ignore_index, float* loss,
                           float* lse, StreamHandle stream) {
  check_sizes(N, V, ld);
  if (N == 0) return;
  KILN_CHECK(logits && targets && loss && lse, "[cross_entropy] null pointer");
  ce_forward_kernel<T><<<static_cast<unsigned>(N), threads_for<T>(N, V), 0, stream>>>(
      static_cast<int>(V), ld, logits, targets, ignore_index, loss, lse);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy_backward(std::int64_t N, std::int64_t V, std::int64_t ld, const T* logits,
                            const float* lse, std::int64_t lse_stride, const std::int32_t* targets,
                            std::int32_t ignore_index, const float* dloss,
                            std::int64_t dloss_stride, T* dlogits, StreamHandle stream) {
  check_sizes(N, V, ld);
  if (N == 0) return;
  KILN_CHECK(logits && lse && targets && dloss && dlogits, "[cross_entropy] null pointer");
  KILN_CHECK(static_cast<const void*>(logits) != static_cast<const void*>(dlogits) || ld == V,
             "[cross_entropy] in place needs dense rows (row stride {} != V {})", ld, V);
  ce_backward_kernel<T><<<static_cast<unsigned>(N), threads_for<T>(N, V), 0, stream>>>(
      static_cast<int>(V), ld, logits, lse, lse_stride, targets, ignore_index, dloss, dloss_stride,
      dlogits);
  KILN_CUDA_CHECK_LAUNCH();
}

std::uint64_t cross_entropy_take_bad_target(StreamHandle stream) {
  unsigned long long code = 0;
  KILN_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&code, g_bad_target, sizeof(code), 0,
                                            cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (code != kNoBadTarget) {
    static const unsigned long long none = ~0ull;
    KILN_CUDA_CHECK(cudaMemcpyToSymbolAsync(g_bad_target, &none, sizeof(none), 0,
                                            cudaMemcpyHostToDevice, stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return code;
}

#define KILN_INSTANTIATE(T)                                                                  \
  template void cross_entropy_forward<T>(std::int64_t, std::int64_t, std::int64_t, const T*, \
                                         const std::int32_t*, std::int32_t, float*, float*,  \
                                         StreamHandle);                                      \
  template void cross_entropy_backward<T>(                                                   \
      std::int64_t, std::int64_t, std::int64_t, const T*, const float*, std::int64_t,        \
      const std::int32_t*, std::int32_t, const float*, std::int64_t, T*, StreamHandle);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(f16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
