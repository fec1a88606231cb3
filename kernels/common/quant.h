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
  return f16_bits_to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
}

// Weight j (0 <= j < 32) of the Q8_0 block at `block`, in f32.
KILN_HOST_DEVICE inline float q8_0_weight(const std::uint8_t* block, int j) {
  return f16_at(block) * static_cast<float>(static_cast<std::int8_t>(block[2 + j]));
}

// Sub-block s's (0 <= s < 8) 6-bit scale and min from a Q4_K block's 12 packed scale bytes, read
// through scale_byte(i), 0 <= i < 12 (ggml's get_scale_min_k4 unpacking). Scales and mins 0-3
// are the low 6 bits of bytes 0-3 and 4-7; 4-7 take their low 4 bits from bytes 8-11 and their
// top 2 bits from the spare top bits of bytes 0-3 (scales) and 4-7 (mins).
template <typename ScaleByte>
KILN_HOST_DEVICE inline void q4_k_unpack_scale_min(ScaleByte scale_byte, int s, int& sc, int& m) {
  if (s < 4) {
    sc = scale_byte(s) & 63;
    m = scale_byte(s + 4) & 63;
  } else {
    sc = (scale_byte(s + 4) & 0xF) | ((scale_byte(s - 4) >> 6) << 4);
    m = (scale_byte(s + 4) >> 4) | ((scale_byte(s) >> 6) << 4);
  }
}

// Sub-block s's (0 <= s < 8) 6-bit scale and min of the Q4_K block at `block`.
KILN_HOST_DEVICE inline void q4_k_scale_min(const std::uint8_t* block, int s, int& sc, int& m) {
  const std::uint8_t* scales = block + 4;
  q4_k_unpack_scale_min([scales](int i) -> int { return scales[i]; }, s, sc, m);
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
