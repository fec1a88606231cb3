// Dequantization (formats and math in kernels/common/quant.h). blocks: (n / block_size) x
// block_bytes; out: (n) T. Thread i decodes weight i from its block's scales and its own bits.
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

}  // namespace

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

}  // namespace kiln::cuda
