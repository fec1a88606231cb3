// Quantized weights on CUDA, the formats and math of kernels/common/quant.h.
//
// dequantize: out (n) T (float, bf16, f16) = the n weights of the blocks at `blocks` (n /
// block_size consecutive GGML blocks, device memory). One thread per weight, grid-stride; the
// same f32 product and one rounding as the CPU.
//
// gemv_quant: y (M, N) = x (M, K) W^T (+ bias) for M <= kQuantGemvMaxRows rows of x, W as N rows
// of K / block_size GGML blocks, read in place (no dequantized copy: decode reads the file's
// bytes, 2-4x fewer than bf16's). One warp per weight row: lane l takes weights l, l + 32, ...
// (consecutive lanes, consecutive bytes of a block), decodes each as dequantize does (the same
// f32 weight) and accumulates w * x in f32 for every row of x; a fixed-order warp sum per row.
// Q8_0 with x rows on 16-byte boundaries takes its own kernel (q8_0_gemv_vectorized): lane l
// takes whole blocks l, l + 32, ... (the scale once, the 32 codes as 16 two-byte loads, x in
// 16-byte loads), where the general kernel decodes every weight through block_weight's switch.
// The profile of the first window measured the general kernel at 201 GB/s on Qwen3-8B Q8_0
// (H200, 2026-11-27), a fifth of bf16's decode.
// A row's result depends on nothing but that row of x: the same bits alone or among M - 1
// others (batch-invariant serving), and from run to run.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/quant.h"
#include "kernels/cuda/activation.h"  // aligned16
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

template <typename T>
void dequantize(quant::QuantType type, std::int64_t n, const std::uint8_t* blocks, T* out,
                StreamHandle stream);

inline constexpr std::int64_t kQuantGemvMaxRows = 8;
inline constexpr int kQuantGemvWarpsPerBlock = 4;

// Whether gemv_quant runs the Q8_0 kernel: Q8_0, x's base and row pitch on 16-byte boundaries.
inline bool q8_0_gemv_vectorized(quant::QuantType type, const void* x, std::int64_t ldx,
                                 std::size_t elem_bytes) {
  return type == quant::QuantType::Q8_0 && aligned16({x}) &&
         (ldx * static_cast<std::int64_t>(elem_bytes)) % 16 == 0;
}

// x: (M, K) rows ldx apart; w: N x (K / block_size) blocks; bias: (N) or null; y: (M, N) rows ldy
// apart. K a multiple of the block size, 1 <= M <= kQuantGemvMaxRows.
template <typename T>
void gemv_quant(quant::QuantType type, std::int64_t M, std::int64_t N, std::int64_t K, const T* x,
                std::int64_t ldx, const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy,
                StreamHandle stream);

}  // namespace kiln::cuda
