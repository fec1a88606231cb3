// The quantized GEMV's 16-row tiles on AVX512-VNNI (internal to kernels/cpu/gemv_quant.cpp,
// which picks them; the math of each is in gemv_quant_tiles.cpp).
//
// A tile is 16 consecutive W rows (8 on AVX2), one 32-bit lane of a vector per row: each 32-byte
// run of quantized values of the 16 rows is loaded from GGUF's layout in place and transposed in
// registers, so that vpdpbusd with a broadcast dword of x adds 4 products to each of the 16 rows'
// sums. The transpose and the per-block scale work are paid once for all M rows of x; the
// int32 -> f32 conversion and fmadd per block serve 16 rows at once.
//
// Both kernels write acc[16 m + j] = row m of x against W row n0 + j, for m < M, and compute
// each of them by the formula stated beside the kernel, whatever M is.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemv_quant.h"

namespace kiln::cpu::tiles {

// x's 4 codes at p as one dword, for a broadcast.
inline std::int32_t load_i32(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q8_0. w: row n0's first block; x: M rows of nb BlockQ8, xstride bytes apart; x_corr: M * nb
// ints from q8_0_x_corr.
void gemv_q8_0_tile16(const std::uint8_t* w, std::int64_t row_bytes, const std::uint8_t* x,
                      std::int64_t xstride, const std::int32_t* x_corr, std::int64_t nb,
                      std::int64_t M, float* acc);
// x_corr[i] = -128 * sum_j q_j of x block i (n blocks).
void q8_0_x_corr(const BlockQ8* x, std::int64_t n, std::int32_t* x_corr);

// Q4_K. w: row n0's first super-block; x: M rows of nb BlockQ8K, xstride bytes apart; x_pairs:
// 4 ints per x block from q4_k_x_pairs.
void gemv_q4_k_tile16(const std::uint8_t* w, std::int64_t row_bytes, const std::uint8_t* x,
                      std::int64_t xstride, const std::int32_t* x_pairs, std::int64_t nb,
                      std::int64_t M, float* acc);
// Per x block (n of them), the sums of its eight 32-value sub-blocks, xs_s = bsums[2s] +
// bsums[2s+1], as four pairs of i16: (xs0, xs2), (xs1, xs3), (xs4, xs6), (xs5, xs7).
void q4_k_x_pairs(const BlockQ8K* x, std::int64_t n, std::int32_t* x_pairs);

// Q6_K. As Q4_K, with 8 ints per x block from q6_k_x_pairs.
void gemv_q6_k_tile16(const std::uint8_t* w, std::int64_t row_bytes, const std::uint8_t* x,
                      std::int64_t xstride, const std::int32_t* x_pairs, std::int64_t nb,
                      std::int64_t M, float* acc);
// Per x block (n of them), its 16 bsums as eight pairs of i16: for j = 0..3, (bsums[4j],
// bsums[4j + 2]) and (bsums[4j + 1], bsums[4j + 3]).
void q6_k_x_pairs(const BlockQ8K* x, std::int64_t n, std::int32_t* x_pairs);

// AVX2 (gemv_quant_tiles_avx2.cpp): the same tiles on 8 W rows (acc[8 m + j]), with the same x
// extras for Q4_K and Q6_K (Q8_0 needs none); each output's bits are the 16-row tile's.
void gemv_tile8_avx2(quant::QuantType t, const std::uint8_t* w, std::int64_t row_bytes,
                     const std::uint8_t* x, std::int64_t xstride, const std::int32_t* x_extra,
                     std::int64_t nb, std::int64_t M, float* acc);

}  // namespace kiln::cpu::tiles
