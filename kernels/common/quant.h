// Quantized weight blocks as GGML stores them (GGUF; llama.cpp's ggml-common.h layouts), decoded
// the same way on the CPU (tensor/kernels_cpu_basic.cpp) and on CUDA (kernels/cuda/quant.cu).
// A tensor of n weights (n a multiple of the block size, row-major) is n / block_size
// consecutive blocks. Scales are f16, little-endian (read byte by byte: blocks are not aligned).
//
//   Q8_0: 32 weights in 34 bytes: d (f16), q[32] (int8).
//         w_i = d * q_i                                  (exact in f32)
//   Q4_K: 256 weights in 144 bytes: d, dmin (f16), scales[12] (eight 6-bit scales sc_s and
//         eight 6-bit mins m_s, packed), q[128] (4-bit). Sub-block s = i / 32 of 8; within
//         group g = i / 64, q byte 32 g + i % 32, the low nibble for even s, the high for odd.
//         w_i = (d * sc_s) * q_i - dmin * m_s            (each product exact in f32; one
//                                                          rounding at the subtraction)
//   Q6_K: 256 weights in 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16]
//         (int8), d (f16). Half h = i / 128, quarter r = (i % 128) / 32, l = i % 32:
//         q = (ql[64 h + l + 32 (r & 1)] >> 4 (r >= 2)) & 15 | ((qh[32 h + l] >> 2 r) & 3) << 4,
//         w_i = (d * scales[8 h + l / 16 + 2 r]) * (q - 32)   (d * scale exact; one rounding)
//
// Each formula is evaluated as llama.cpp's dequantize_row_* evaluates it, in f32, so the values
// are its values bit for bit, and every backend rounds them once more to its output dtype.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/common/half.h"

namespace kiln::quant {

enum class QuantType : std::uint8_t { Q8_0, Q4_K, Q6_K };

struct QuantInfo {
  QuantType type;
  std::string_view name;    // GGUF's name
  std::int64_t block_size;  // weights per block
  std::int64_t block_bytes;
};
inline constexpr QuantInfo kQuantTypes[] = {{QuantType::Q8_0, "q8_0", 32, 34},
                                            {QuantType::Q4_K, "q4_k", 256, 144},
                                            {QuantType::Q6_K, "q6_k", 256, 210}};

constexpr const QuantInfo& quant_info(QuantType t) { return kQuantTypes[static_cast<int>(t)]; }

KILN_HOST_DEVICE inline float f16_at(const std::uint8_t* p) {
  f16 h;
  h.bits = static_cast<std::uint16_t>(p[0] | (p[1] << 8));
  return f16_to_float(h);
}

// Weight j (0 <= j < 32) of the Q8_0 block at `block`, in f32.
KILN_HOST_DEVICE inline float q8_0_weight(const std::uint8_t* block, int j) {
  return f16_at(block) * static_cast<float>(static_cast<std::int8_t>(block[2 + j]));
}

// Sub-block s's (0 <= s < 8) 6-bit scale and min of the Q4_K block at `block` (ggml's
// get_scale_min_k4 unpacking).
KILN_HOST_DEVICE inline void q4_k_scale_min(const std::uint8_t* block, int s, int& sc, int& m) {
  const std::uint8_t* scales = block + 4;
  if (s < 4) {
    sc = scales[s] & 63;
    m = scales[s + 4] & 63;
  } else {
    sc = (scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4);
    m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

// Weight i (0 <= i < 256) of the Q4_K block at `block`.
KILN_HOST_DEVICE inline float q4_k_weight(const std::uint8_t* block, int i) {
  const std::uint8_t* q = block + 16;
  const int s = i / 32;  // sub-block: its 6-bit scale and min
  int sc, m;
  q4_k_scale_min(block, s, sc, m);
  const std::uint8_t byte = q[32 * (i / 64) + i % 32];
  const int nibble = (s & 1) ? byte >> 4 : byte & 0xF;
  const float d1 = f16_at(block) * static_cast<float>(sc);
  const float m1 = f16_at(block + 2) * static_cast<float>(m);
  return d1 * static_cast<float>(nibble) - m1;
}

// Weight i (0 <= i < 256) of the Q6_K block at `block`.
KILN_HOST_DEVICE inline float q6_k_weight(const std::uint8_t* block, int i) {
  const std::uint8_t* ql = block;
  const std::uint8_t* qh = block + 128;
  const std::int8_t* scales = reinterpret_cast<const std::int8_t*>(block + 192);
  const int h = i / 128, r = (i % 128) / 32, l = i % 32;
  const std::uint8_t low = ql[64 * h + l + 32 * (r & 1)];
  const int q = ((r >= 2 ? low >> 4 : low & 0xF) | (((qh[32 * h + l] >> (2 * r)) & 3) << 4)) - 32;
  const float d = f16_at(block + 208) * static_cast<float>(scales[8 * h + l / 16 + 2 * r]);
  return d * static_cast<float>(q);
}

// Weight i of a block of type t.
KILN_HOST_DEVICE inline float block_weight(QuantType t, const std::uint8_t* block, int i) {
  switch (t) {
    case QuantType::Q4_K:
      return q4_k_weight(block, i);
    case QuantType::Q6_K:
      return q6_k_weight(block, i);
    case QuantType::Q8_0:
      break;
  }
  return q8_0_weight(block, i);
}

}  // namespace kiln::quant
