// Decode's matrix-vector product on CUDA, bound by the bytes of the weight it streams:
//
//   gemv_bf16: y[m, n] = sum_k W[n, k] x[m, k]  (=)   W: (N, K) bf16, row-major (a Linear
//                                                      weight, (out, in)); x: (M, K) bf16 rows
//                                                      ldx apart; y: (M, N) bf16 rows ldy apart;
//                                                      M <= kGemvMaxRows
//
// A warp per row (or kGemvWarps warps per row for fewer rows, gemv_ksplit): each lane reads
// 16-byte chunks of the row (8 bf16), kGemvUnroll chunks in flight before it multiplies, with
// cache-streaming loads (the weight is read once per token and must not evict the KV cache); x, 8
// KiB for K = 4096, is read through the read-only cache by every warp. Products are accumulated in
// f32 in a fixed order per lane, then summed across the warp: the result does not depend on the
// launch (deterministic), and it rounds once to bf16. With M rows of x, each chunk of W is loaded
// once and multiplied into every row's own accumulator in the same order as for one row, so a
// row's result is bitwise the same alone or among others (batch-invariant serving: kiln serve
// tiles its rows by kGemvMaxRows on CUDA), and M = 1 is the single-row kernel.
//
// cuBLASLt's GEMV kernels plus their split-K reductions read Qwen3-8B's decode weights at
// 1.3-3.5 TB/s on the H200 (ncu, 2026-11-26); this kernel is what replaces them when
// gemv_supported() holds, and set_gemv_enabled(false) (or KILN_CUDA_GEMV=0) goes back to cuBLASLt
// for A/B timing in one process.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

inline constexpr int kGemvWarps = 4;    // warps per 128-thread block
inline constexpr int kGemvUnroll = 4;   // 16-byte chunks in flight per lane
inline constexpr int kGemvMaxRows = 4;  // rows of x per launch (x chunks in registers per row)

// True when the kernel takes this problem: K a multiple of 8 (whole 16-byte chunks), W and x
// 16-byte aligned (y is written element by element), sizes in range. Host only, plain C++
// (tested on the CPU).
inline bool gemv_supported(std::int64_t N, std::int64_t K, const void* w, const void* x,
                           const void* y) {
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return N > 0 && K > 0 && K % 8 == 0 && K <= (std::int64_t(1) << 30) &&
         N <= (std::int64_t(1) << 40) && aligned(w) && aligned(x) && y != nullptr;
}

// Warps that share one row, each summing every ksplit-th chunk, then added in warp order:
// kGemvWarps for N < 8192 (Qwen3-8B's q/o/k/v/down projections), where a warp per row left too
// few loads in flight (k_proj/v_proj, N 1024: 1.0 TB/s on the H200, ncu 2026-11-26), else 1.
inline int gemv_ksplit(std::int64_t N) { return N < 8192 ? kGemvWarps : 1; }

// Blocks for N rows: kGemvWarps / ksplit rows per block.
inline std::int64_t gemv_blocks(std::int64_t N, int ksplit) {
  const std::int64_t rows = kGemvWarps / ksplit;
  return (N + rows - 1) / rows;
}

// Whether linear() routes single-row bf16 products here: KILN_CUDA_GEMV=0 at start-up turns it
// off; set_gemv_enabled() overrides (tests, A/B benches).
#if defined(KILN_CUDA)
bool gemv_enabled();
void set_gemv_enabled(bool on);
#else
// Without CUDA no kernel runs; a dry run simulating CUDA plans as a GPU does by default.
inline bool gemv_enabled() { return true; }
inline void set_gemv_enabled(bool) {}
#endif

// y = W x for one row. Fails by name unless gemv_supported(N, K, w, x, y).
void gemv_bf16(std::int64_t N, std::int64_t K, const bf16* w, const bf16* x, bf16* y,
               StreamHandle stream);
// y (M, N) = x (M, K) W^T, 1 <= M <= kGemvMaxRows; ldx a multiple of 8 (each row 16-byte
// aligned when x is). Fails by name otherwise.
void gemv_bf16(int M, std::int64_t N, std::int64_t K, const bf16* w, const bf16* x,
               std::int64_t ldx, bf16* y, std::int64_t ldy, StreamHandle stream);

}  // namespace kiln::cuda
