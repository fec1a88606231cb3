// Quantized weight blocks as GGML stores them (GGUF), decoded the same way on the CPU
// (tensor/kernels_cpu_basic.cpp) and on CUDA (kernels/cuda/quant.cu):
//
//   Q8_0: blocks of 32 weights, 34 bytes each: d (f16 scale), then qs[32] (int8).
//         w_i = d * qs_i                       (w = f32(d) * f32(qs_i), rounded once to T)
//
// A tensor of n weights (n a multiple of 32, in row-major order) is n/32 consecutive blocks.
// Only the scale's bytes are read as f16 (little-endian, 2-byte aligned: blocks are 34 bytes).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "kernels/common/half.h"

namespace kiln::quant {

enum class QuantType : std::uint8_t { Q8_0 };

struct QuantInfo {
  QuantType type;
  std::string_view name;    // GGUF's name
  std::int64_t block_size;  // weights per block
  std::int64_t block_bytes;
};
inline constexpr QuantInfo kQuantTypes[] = {{QuantType::Q8_0, "q8_0", 32, 34}};

constexpr const QuantInfo& quant_info(QuantType t) { return kQuantTypes[static_cast<int>(t)]; }

// Weight j (0 <= j < 32) of the Q8_0 block at `block`, in f32.
KILN_HOST_DEVICE inline float q8_0_weight(const std::uint8_t* block, int j) {
  f16 d;
  d.bits = static_cast<std::uint16_t>(block[0] | (block[1] << 8));
  return f16_to_float(d) * static_cast<float>(static_cast<std::int8_t>(block[2 + j]));
}

}  // namespace kiln::quant
