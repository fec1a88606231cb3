// Dequantization on CUDA, the formats and math of kernels/common/quant.h: out (n) T (float, bf16,
// f16) = the n weights of the blocks at `blocks` (n / block_size consecutive GGML blocks, device
// memory). One thread per weight, grid-stride; the same f32 product and one rounding as the CPU.
#pragma once

#include <cstdint>

#include "kernels/common/quant.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

template <typename T>
void dequantize(quant::QuantType type, std::int64_t n, const std::uint8_t* blocks, T* out,
                StreamHandle stream);

}  // namespace kiln::cuda
