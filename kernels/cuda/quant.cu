// Dequantization and the quantized GEMV (formats and math in kernels/common/quant.h; the
// kernels' shapes in quant.h). dequantize: thread i decodes weight i from its block's scales and
// its own bits; gemv_quant: a warp per weight row, decoding as dequantize does (Q8_0 with aligned
// x: whole blocks per lane).
#include "kernels/cuda/activation.h"  // Pack
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void dequantize_kernel(quant::QuantType type, std::int64_t n, std::int64_t block_size,
                                  std::int64_t block_bytes, const std::uint8_t* blocks, T* out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = store<T>(quant::block_weight(type, blocks + (i / block_size) * block_bytes,
                                          static_cast<int>(i % block_size)));
}

// One warp per weight row n (blockIdx.x * warps + warp); acc[m] for the M rows of x.
template <typename T, int M>
__global__ void __launch_bounds__(32 * kQuantGemvWarpsPerBlock)
    gemv_quant_kernel(quant::QuantType type, std::int64_t N, std::int64_t K,
                      std::int64_t block_size, std::int64_t block_bytes, const T* x,
                      std::int64_t ldx, const std::uint8_t* w, const T* bias, T* y,
                      std::int64_t ldy) {
  const int lane = threadIdx.x % 32;
  const std::int64_t n =
      static_cast<std::int64_t>(blockIdx.x) * kQuantGemvWarpsPerBlock + threadIdx.x / 32;
  if (n >= N) return;  // whole warps
  const std::int64_t nb = K / block_size;
  const std::uint8_t* row = w + n * nb * block_bytes;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  // Block by block (no 64-bit division per weight); lane l takes weights l, l + 32, ... of each.
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = row + b * block_bytes;
    for (int j = lane; j < block_size; j += 32) {
      const float wk = quant::block_weight(type, blk, j);
      const std::int64_t k = b * block_size + j;
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] = fmaf(wk, load(x[m * ldx + k]), acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float s = warp_sum(acc[m]);
    if (lane == 0) y[m * ldy + n] = store<T>(bias ? s + load(bias[n]) : s);
  }
}

// Q8_0, one warp per weight row n, lane l on blocks l, l + 32, ...: acc[m] += d * sum_j q_j x_j
// over each block (the 32 products in order, then one multiply by d), a fixed-order warp sum.
// x rows 16-byte aligned (q8_0_gemv_vectorized); blocks are 34 bytes, so 2-byte aligned.
template <typename T, int M>
__global__ void __launch_bounds__(32 * kQuantGemvWarpsPerBlock)
    gemv_q8_0_kernel(std::int64_t N, std::int64_t K, const T* x, std::int64_t ldx,
                     const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy) {
  constexpr int P = 16 / sizeof(T);  // x elements per 16-byte load
  const int lane = threadIdx.x % 32;
  const std::int64_t n =
      static_cast<std::int64_t>(blockIdx.x) * kQuantGemvWarpsPerBlock + threadIdx.x / 32;
  if (n >= N) return;  // whole warps
  const std::int64_t nb = K / 32;
  const std::uint8_t* row = w + n * nb * 34;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  for (std::int64_t b = lane; b < nb; b += 32) {
    const auto* bp = reinterpret_cast<const std::uint16_t*>(row + b * 34);
    f16 dh;
    dh.bits = bp[0];
    const float d = f16_to_float(dh);
    std::uint16_t qs[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) qs[i] = bp[1 + i];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const T* xr = x + m * ldx + b * 32;
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < 32 / P; ++c) {
        const Pack<T, P> xp = *reinterpret_cast<const Pack<T, P>*>(xr + c * P);
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const int j = c * P + e;
          const std::uint16_t pair = qs[j / 2];
          const auto q = static_cast<std::int8_t>(j % 2 ? pair >> 8 : pair & 0xFF);
          s = fmaf(static_cast<float>(q), load(xp.v[e]), s);
        }
      }
      acc[m] = fmaf(d, s, acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float s = warp_sum(acc[m]);
    if (lane == 0) y[m * ldy + n] = store<T>(bias ? s + load(bias[n]) : s);
  }
}

template <typename T, int M>
void launch_gemv_quant(quant::QuantType type, std::int64_t N, std::int64_t K,
                       const quant::QuantInfo& q, const T* x, std::int64_t ldx,
                       const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy,
                       StreamHandle stream) {
  const std::int64_t blocks = (N + kQuantGemvWarpsPerBlock - 1) / kQuantGemvWarpsPerBlock;
  KILN_CHECK(blocks <= 0x7fffffffLL, "[linear_quant] {} weight rows exceed the grid", N);
  if (q8_0_gemv_vectorized(type, x, ldx, sizeof(T))) {
    gemv_q8_0_kernel<T, M>
        <<<static_cast<unsigned>(blocks), 32 * kQuantGemvWarpsPerBlock, 0, stream>>>(
            N, K, x, ldx, w, bias, y, ldy);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  gemv_quant_kernel<T, M>
      <<<static_cast<unsigned>(blocks), 32 * kQuantGemvWarpsPerBlock, 0, stream>>>(
          type, N, K, q.block_size, q.block_bytes, x, ldx, w, bias, y, ldy);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void gemv_quant(quant::QuantType type, std::int64_t M, std::int64_t N, std::int64_t K, const T* x,
                std::int64_t ldx, const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy,
                StreamHandle stream) {
  const quant::QuantInfo& q = quant::quant_info(type);
  KILN_CHECK(M >= 1 && M <= kQuantGemvMaxRows && N >= 0 && K >= 0 && K % q.block_size == 0,
             "[linear_quant] the quantized GEMV takes 1 to {} rows of whole {} blocks, got {} x {}",
             kQuantGemvMaxRows, q.name, M, K);
  if (N == 0) return;
  with_rows<static_cast<int>(kQuantGemvMaxRows)>(static_cast<int>(M), [&](auto rows) {
    launch_gemv_quant<T, decltype(rows)::value>(type, N, K, q, x, ldx, w, bias, y, ldy, stream);
  });
}

template <typename T>
void dequantize(quant::QuantType type, std::int64_t n, const std::uint8_t* blocks, T* out,
                StreamHandle stream) {
  const quant::QuantInfo& q = quant::quant_info(type);
  KILN_CHECK(n >= 0 && n % q.block_size == 0,
             "[dequantize] {} weights are not whole {} blocks of {}", n, q.name, q.block_size);
  if (n == 0) return;
  dequantize_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(type, n, q.block_size,
                                                                       q.block_bytes, blocks, out);
  KILN_CUDA_CHECK_LAUNCH();
}

template void dequantize<float>(quant::QuantType, std::int64_t, const std::uint8_t*, float*,
                                StreamHandle);
template void dequantize<bf16>(quant::QuantType, std::int64_t, const std::uint8_t*, bf16*,
                               StreamHandle);
template void dequantize<f16>(quant::QuantType, std::int64_t, const std::uint8_t*, f16*,
                              StreamHandle);

#define KILN_INSTANTIATE_GEMV(T)                                                          \
  template void gemv_quant<T>(quant::QuantType, std::int64_t, std::int64_t, std::int64_t, \
                              const T*, std::int64_t, const std::uint8_t*, const T*, T*,  \
                              std::int64_t, StreamHandle);
KILN_INSTANTIATE_GEMV(float)
KILN_INSTANTIATE_GEMV(bf16)
KILN_INSTANTIATE_GEMV(f16)
#undef KILN_INSTANTIATE_GEMV

}  // namespace kiln::cuda
