// Decode's bf16 matrix-vector product (math, layout and why in gemv.h).
#include <cuda_bf16.h>

#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.h"

namespace kiln::cuda {
namespace {

// Sum of the 8 products of one 16-byte chunk of W and of x, in f32.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) {
  const auto* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  const auto* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// W: (N, K) bf16; x: M rows of K, ldxc chunks apart; y: M rows of N, ldy apart. A block holds
// kGemvWarps / KSPLIT rows of W; warp w works on row blockIdx.x * (kGemvWarps / KSPLIT) +
// w / KSPLIT, chunks lane + 32 (w % KSPLIT) + 32 KSPLIT i. Row m's accumulator sees the same
// products in the same order for every M.
template <int KSPLIT, int M>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_bf16_kernel(std::int64_t N, int chunks, const uint4* __restrict__ w,
                     const uint4* __restrict__ x, std::int64_t ldxc, __nv_bfloat16* __restrict__ y,
                     std::int64_t ldy) {
  constexpr int kRows = kGemvWarps / KSPLIT, kStride = 32 * KSPLIT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % KSPLIT;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kRows + warp / KSPLIT;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  if (n < N) {  // warp-uniform; no early return: the KSPLIT warps of a row meet at a barrier
    const uint4* row = w + n * chunks;
    int c = lane + 32 * part;
    for (; c + kStride * (kGemvUnroll - 1) < chunks; c += kStride * kGemvUnroll) {
      uint4 wv[kGemvUnroll], xv[M][kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        wv[u] = __ldcs(row + c + kStride * u);  // streamed: read once per token
#pragma unroll
        for (int m = 0; m < M; ++m) xv[m][u] = __ldg(x + m * ldxc + c + kStride * u);
      }
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m] += dot8(wv[u], xv[m][u]);
    }
    for (; c < chunks; c += kStride) {
      const uint4 wc = __ldcs(row + c);
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] += dot8(wc, __ldg(x + m * ldxc + c));
    }
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  }
  if constexpr (KSPLIT == 1) {
    if (n < N && lane == 0)
#pragma unroll
      for (int m = 0; m < M; ++m) y[m * ldy + n] = __float2bfloat16_rn(acc[m]);
  } else {
    __shared__ float partial[M][kGemvWarps];
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < M; ++m) partial[m][warp] = acc[m];
    __syncthreads();
    if (n < N && part == 0 && lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float sum = 0.f;
#pragma unroll
        for (int k = 0; k < KSPLIT; ++k) sum += partial[m][warp + k];  // warp order
        y[m * ldy + n] = __float2bfloat16_rn(sum);
      }
    }
  }
}

template <int M>
void launch_gemv(std::int64_t N, int chunks, const uint4* w, const uint4* x, std::int64_t ldxc,
                 __nv_bfloat16* y, std::int64_t ldy, StreamHandle stream) {
  const int ksplit = gemv_ksplit(N);
  const std::int64_t blocks = gemv_blocks(N, ksplit);
  KILN_CHECK(blocks <= 0x7fffffff, "[gemv] {} rows need too many blocks", N);
  if (ksplit == kGemvWarps)
    gemv_bf16_kernel<kGemvWarps, M><<<static_cast<unsigned>(blocks), kGemvWarps * 32, 0, stream>>>(
        N, chunks, w, x, ldxc, y, ldy);
  else
    gemv_bf16_kernel<1, M><<<static_cast<unsigned>(blocks), kGemvWarps * 32, 0, stream>>>(
        N, chunks, w, x, ldxc, y, ldy);
  KILN_CUDA_CHECK_LAUNCH();
}

std::atomic<int> g_gemv_enabled{-1};  // -1: not read from the environment yet

}  // namespace

bool gemv_enabled() { return env_switch(g_gemv_enabled, "KILN_CUDA_GEMV"); }

void set_gemv_enabled(bool on) { g_gemv_enabled.store(on ? 1 : 0); }

void gemv_bf16(std::int64_t N, std::int64_t K, const bf16* w, const bf16* x, bf16* y,
               StreamHandle stream) {
  gemv_bf16(1, N, K, w, x, K, y, N, stream);
}

void gemv_bf16(int M, std::int64_t N, std::int64_t K, const bf16* w, const bf16* x,
               std::int64_t ldx, bf16* y, std::int64_t ldy, StreamHandle stream) {
  KILN_CHECK(gemv_supported(N, K, w, x, y) && M >= 1 && M <= kGemvMaxRows && ldx % 8 == 0 &&
                 ldx >= K && ldy >= N,
             "[gemv] {} rows of N {} K {} (ldx {}, ldy {}) with these pointers are not supported "
             "(1 to {} rows, K and ldx % 8, 16-byte alignment)",
             M, N, K, ldx, ldy, kGemvMaxRows);
  const auto* wv = reinterpret_cast<const uint4*>(w);
  const auto* xv = reinterpret_cast<const uint4*>(x);
  auto* yv = reinterpret_cast<__nv_bfloat16*>(y);
  const int chunks = static_cast<int>(K / 8);
  const std::int64_t ldxc = ldx / 8;
  with_rows<kGemvMaxRows>(M, [&](auto rows) {
    launch_gemv<decltype(rows)::value>(N, chunks, wv, xv, ldxc, yv, ldy, stream);
  });
}

}  // namespace kiln::cuda
