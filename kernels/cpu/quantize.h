// Weights to GGML blocks, as llama.cpp's reference quantizers write them (ggml-quants.c), for
// `kiln quantize` and the GGUF writer (models/gguf_model.h).
//
//   Q8_0: per block of 32, d = max|x| / 127 (stored as f16, rounded to nearest even), id = 1 / d
//         (0 for an all-zero block), q_j = round(x_j * id) with ties away from zero (roundf).
//         Byte for byte llama.cpp's quantize_row_q8_0_ref.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// n weights (a multiple of 32) into n / 32 blocks of 34 bytes at out.
void quantize_q8_0(const float* x, std::int64_t n, std::uint8_t* out);

}  // namespace kiln::cpu
