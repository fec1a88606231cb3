// Matrix-vector products on GGML-quantized weights (kernels/common/quant.h), for decode:
//
//   gemv_quant:  y(M, N) = x(M, K) @ W(N, K)^T (+ bias(N))        (=, y is not read)
//
// W row n is K / block_size blocks at w + n * row_bytes (row_bytes = K / block_size *
// block_bytes): GGUF's layout, used in place. x rows are first quantized to 8 bits, the way
// llama.cpp's CPU backend does it, so each block's dot product is exact integer arithmetic:
//
//   Q8_0 weights:  x in BlockQ8 (32 values: f32 d, i8 q[32]);
//                  y = sum_b (d_w,b * d_x,b) * sum_j qw_j qx_j
//   Q4_K weights:  x in BlockQ8K (256 values: f32 d, i8 q[256], i16 sums of each 16);
//                  y = sum_b d_x,b * (d_b * sum_s sc_s sum_j q_j qx_j - dmin_b * sum_s m_s sum qx)
//   Q6_K weights:  x in BlockQ8K;
//                  y = sum_b d_x,b * d_b * (sum_g sc_g sum_j q_j qx_j - 32 sum_g sc_g sum qx)
//
// The x quantizer: d = max|x| / 127 over the block, q = nearest(x / d) (ties to even); an
// all-zero block has d = 0, and a block holding a NaN or an infinity has d = NaN and q = 0 (so
// the outputs it reaches are NaN, at every ISA level). Its error per value is at most d / 2;
// everything after it is exact integer sums, one f32 product of the two scales per block, and an
// f32 sum over blocks.
//
// Implementations, picked at run time (kernels/cpu/isa.h):
//   Avx512Bf16 and above, with AVX512-VNNI:  Q8_0 with vpdpbusd (u8 x s8 -> i32): W in tiles of
//                                            16 rows transposed in registers, one lane per W
//                                            row (gemv_quant.cpp), the last N % 16 rows one at
//                                            a time on 32 bytes
//   Avx2 and Avx512:                         vpmaddubsw + vpmaddwd on 32 bytes (|w| as u8,
//                                            sign(w) moved onto x), 4-bit and 6-bit values
//                                            unpacked in registers; tiles of 8 W rows
//                                            (gemv_quant_tiles_avx2.cpp), the last N % 8 rows
//                                            one at a time
//   Scalar:                                  the same integer sums in plain loops
// (every CPU with AVX512_BF16 shipped so far has AVX512_VNNI; without it the Avx2 path runs.)
//
// OpenMP threads take contiguous ranges of W's rows (or tiles); each is read once for all M rows
// of x. A row of y does not depend on M: the serving engine's batch invariance rests on it.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/common/half.h"
#include "kernels/common/quant.h"

namespace kiln::cpu {

struct BlockQ8 {
  float d;
  std::int8_t q[32];
};
struct BlockQ8K {
  float d;
  std::int8_t q[256];
  std::int16_t bsums[16];  // sum of q over each 16 values
};

// Up to quant_gemv_max_rows(t) rows of x, Linear on quantized weights runs gemv_quant; above it
// the weights are dequantized a slice at a time and multiplied by a GEMM
// (tensor/kernels_cpu_quant.cpp). Serving tiles a batch by the same count, so that many streams
// read each weight once per step.
//
// kQuantGemvMaxRows, for the one-row-at-a-time kernels. Measured on Qwen3-0.6B (AMD EPYC,
// AVX512-VNNI, 2 threads, 2026-11-27; prefill tok/s, GEMV vs slices): 16 rows 92 vs 47 (Q8_0)
// and 36 vs 20 (Q4_K_M), 32 rows 98 vs 79 and 38 vs 29, 64 rows 100 vs 103 and 48 vs 56.
inline constexpr std::int64_t kQuantGemvMaxRows = 32;
// kQuantGemvTileMaxRows, where a type runs on the tiles (kernels/cpu/gemv_quant_tiles.h:
// AVX512-VNNI or AVX2): no limit. Measured the same way (Q8_0 on VNNI; GEMV vs
// slices): 64 rows 490 vs 113, 128 rows 491 vs 131, 256 rows 426 vs 138, 512 rows 348 vs 133,
// 1000 rows 314 vs 132; q4_k_m 512 rows 265 vs 122, 1000 rows 212 vs 137; q4_k_m at
// KILN_CPU_ISA=avx2, 128 rows 173-188 vs 78-85; Q8_0 on an AVX2-only EPYC (2026-11-29, kiln's
// file), 128 rows 121-159 vs 70-81, 512 rows 134-137 vs 89-93. On an AMX CPU the slices run on
// AMX-BF16, which was not measured against the tiles: there the smaller limit stays.
inline constexpr std::int64_t kQuantGemvTileMaxRows = std::numeric_limits<std::int64_t>::max();
std::int64_t quant_gemv_max_rows(quant::QuantType t);
// Above it, the weights are dequantized this many bytes (in the compute dtype) at a time, at
// least one row: the slice, and the GEMM's (rows, slice) output when the slice is not all of N.
inline constexpr std::int64_t kQuantPrefillSliceBytes = std::int64_t{4} << 20;

// Bytes of x's quantized copy that gemv_quant needs as scratch for M rows of K values.
std::int64_t gemv_quant_scratch_bytes(quant::QuantType t, std::int64_t M, std::int64_t K);

// Quantizes one row of K values (K a multiple of 32, resp. 256).
template <typename X>
void quantize_row_q8(const X* x, std::int64_t K, BlockQ8* out);
template <typename X>
void quantize_row_q8_k(const X* x, std::int64_t K, BlockQ8K* out);

// X and Y: bf16 or float; bias may be null. K must be a multiple of t's block size. scratch
// holds gemv_quant_scratch_bytes(t, M, K) bytes, aligned to 4.
template <typename X, typename Y>
void gemv_quant(quant::QuantType t, std::int64_t M, std::int64_t N, std::int64_t K, const X* x,
                std::int64_t ldx, const std::uint8_t* w, const Y* bias, Y* y, std::int64_t ldy,
                void* scratch);

// One row's dot product with a quantized x row (nb blocks of x; W's row at w), at the current
// ISA level: exposed for the tests, which check every level against an f64 reference.
float dot_q8_0(const std::uint8_t* w, const BlockQ8* x, std::int64_t nb);
float dot_q4_k(const std::uint8_t* w, const BlockQ8K* x, std::int64_t nb);
float dot_q6_k(const std::uint8_t* w, const BlockQ8K* x, std::int64_t nb);

// Whether dot_q8_0 uses VNNI at the current level (for the tests' and bench's labels).
bool gemv_quant_uses_vnni();
// The W rows per tile (kernels/cpu/gemv_quant_tiles.h) type t runs on at the current level: 16
// with AVX512-VNNI, 8 with AVX2, 0 where one W row runs at a time.
std::int64_t gemv_quant_tile_width(quant::QuantType t);

}  // namespace kiln::cpu
