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
// With x rows on 16-byte boundaries each format takes its own kernel (gemv_quant_kernel_for):
// Q8_0 lane l takes whole blocks l, l + 32, ... (the scale once, the 32 codes as 16 two-byte
// loads, x in 16-byte loads); Q4_K and Q6_K lanes take 64-weight chunks of a 256-weight block
// (Q4_K's codes in two 16-byte loads, Q6_K's in 4-byte loads), a block's scales applied to f32
// sums of codes times x once per sub-block; Q4_K's kernel takes 4 weight rows per warp. The general kernel decodes every weight through
// block_weight's switch: the first window measured it at 201 GB/s on Qwen3-8B Q8_0 (H200,
// 2026-11-27), a fifth of bf16's decode.
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

enum class GemvQuantKernel { General, Q8_0, Q4_K, Q6_K };

// The Q4_K kernel takes this many weight rows per warp when gemv_quant_rows_enabled() (x
// converted once for all of them; quant.cu says why and what it measured). KILN_CUDA_QGEMV_ROWS=0 at start-up, or
// set_gemv_quant_rows_enabled(false), runs one row per warp instead (A/B in one process).
inline constexpr int kQuantGemvRowsPerWarp = 4;
#if defined(KILN_CUDA)
bool gemv_quant_rows_enabled();
void set_gemv_quant_rows_enabled(bool on);
#else
inline bool gemv_quant_rows_enabled() { return true; }
inline void set_gemv_quant_rows_enabled(bool) {}
#endif

// The kernel gemv_quant runs: the format's own when x's base and row pitch lie on 16-byte
// boundaries and w is aligned as that kernel loads it (Q4_K: 16 bytes, as 144-byte blocks keep
// each 32-byte code run; Q6_K and Q8_0: 2 bytes, their blocks being 210 and 34 bytes).
inline GemvQuantKernel gemv_quant_kernel_for(quant::QuantType type, const void* x, std::int64_t ldx,
                                             std::size_t elem_bytes, const void* w) {
  if (!aligned16({x}) || (ldx * static_cast<std::int64_t>(elem_bytes)) % 16 != 0)
    return GemvQuantKernel::General;
  const auto w_addr = reinterpret_cast<std::uintptr_t>(w);
  switch (type) {
    case quant::QuantType::Q8_0:
      return w_addr % 2 == 0 ? GemvQuantKernel::Q8_0 : GemvQuantKernel::General;
    case quant::QuantType::Q4_K:
      return aligned16({w}) ? GemvQuantKernel::Q4_K : GemvQuantKernel::General;
    case quant::QuantType::Q6_K:
      return w_addr % 2 == 0 ? GemvQuantKernel::Q6_K : GemvQuantKernel::General;
  }
  return GemvQuantKernel::General;
}

// x: (M, K) rows ldx apart; w: N x (K / block_size) blocks; bias: (N) or null; y: (M, N) rows ldy
// apart. K a multiple of the block size, 1 <= M <= kQuantGemvMaxRows.
template <typename T>
void gemv_quant(quant::QuantType type, std::int64_t M, std::int64_t N, std::int64_t K, const T* x,
                std::int64_t ldx, const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy,
                StreamHandle stream);

}  // namespace kiln::cuda
