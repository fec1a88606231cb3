// Weights to GGML blocks (kernels/common/quant.h layouts), for `kiln quantize` and the GGUF
// writer (models/gguf_model.h).
//
//   Q8_0: per block of 32, d = max|x| / 127 (stored as f16, rounded to nearest even), id = 1 / d
//         (0 for an all-zero block), q_j = round(x_j * id) with ties away from zero (roundf).
//         Byte for byte llama.cpp's quantize_row_q8_0_ref.
//   Q4_K: per sub-block s of 32, a grid lo_s + step_s q (q in 0..15, lo_s <= 0): the range's
//         (lo_s = min(0, min x), step_s = (max x - lo_s) / 15) or, if its squared error is
//         smaller, one of 21 stretched grids refit by least squares (as llama.cpp's
//         make_qkx2_quants searches; not its exact search or weighting, so not its bytes);
//         then per 256: d = max step_s / 63, dmin = max(-lo_s) / 63 (both f16), the 6-bit codes
//         sc_s = round(step_s / d), m_s = round(-lo_s / dmin), and the 4-bit values
//         q = clamp(round((x + dmin m_s) / (d sc_s)), 0, 15) against the stored (rounded)
//         scales. Values that are exactly d sc q - dmin m with those maxima come back exactly.
//   Q6_K: per sub-block j of 16: the value of largest magnitude v_j, scale_j = v_j / -32 (so
//         it is the code -32, the end of the asymmetric range); per 256: d = max |scale_j| / 127
//         (f16), sc_j = round(scale_j / d) (int8), q = clamp(round(x / (d sc_j)), -32, 31) + 32.
//         Also llama.cpp's format with a simpler choice than its make_qx_quants.
// Every function refuses non-finite weights and lengths that are not whole blocks.
#pragma once

#include <cstdint>

#include "kernels/common/quant.h"

namespace kiln::cpu {

// n weights (a multiple of t's block size) into n / block_size blocks at out.
void quantize_blocks(quant::QuantType t, const float* x, std::int64_t n, std::uint8_t* out);

}  // namespace kiln::cpu
