// Row normalizations on CUDA, with the math of kernels/cpu/norm.h. x, dy: (rows, dim) with a row
// stride (elements; the last dim is dense); y, dx: (rows, dim) contiguous; w, b: (dim) in T;
// rstd, mean: (rows) f32. T is float, bf16 or f16; all math is f32.
//
// RMSNorm:    rstd = 1 / sqrt(mean_j(x_j^2) + eps),  y = x * rstd * w                  (y, rstd =)
//   backward: dx = rstd * w dy - x * rstd^3 * mean_j(w_j dy_j x_j)                     (dx =)
//             dw_partial[c, j] = sum over the rows of chunk c of dy * x * rstd          (=)
// add_rmsnorm: s = x + r (rounded to T), then RMSNorm of s; r: (rows, dim) with a row stride,
//             s: (rows, dim) contiguous                                           (s, y, rstd =)
// LayerNorm:  mean = mean_j(x_j),  rstd = 1 / sqrt(mean_j((x_j - mean)^2) + eps),
//             xhat = (x - mean) * rstd,  y = xhat * w + b   (b may be null)     (y, mean, rstd =)
//   backward: g = w dy,  dx = rstd * (g - mean_j(g_j) - xhat * mean_j(g_j xhat_j))    (dx =)
//             dw_partial[c, j] = sum_chunk dy * xhat,  db_partial[c, j] = sum_chunk dy  (=)
// then reduce_partials() adds the chunks into dw/db (+=) in a fixed order.
//
// Launch shape: one warp per row when dim <= kWarpRowMax, else one block per row (row_launch()).
// The backward cuts the rows into norm_chunks(rows) fixed chunks (the CPU kernel's rule, at most
// kNormMaxChunks), one warp or block per chunk walking its rows in order; each thread owns the
// same columns of every row, so it accumulates its columns of the chunk's partial sums without
// atomics. Nothing depends on the GPU's size or on scheduling: dw/db are bitwise reproducible.
// RMSNorm rows of up to 4 accesses per lane (norm_register_packs) take a register path: the
// partial sums stay in registers (written once per chunk) and the next row's x and dy are in
// flight while the current row is reduced, since a chunk's rows otherwise run one memory latency
// after another (the profile measured the general kernel at 535-861 GB/s on an H200).
// The f32 partial buffers ((chunks, dim) each, Temporaries) are the caller's to allocate:
// norm_backward_scratch_floats() gives their size.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/activation.h"  // Pack, row_vec_width
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

// ---- launch shape (plain C++, tested on the CPU) ------------------------------------------------

constexpr std::int64_t kWarpRowMax = 1024;     // widest row handled by one warp
constexpr std::int64_t kNormMaxChunks = 1024;  // dw/db partial rows in the backward

struct RowLaunch {
  bool warp_per_row = true;
  int threads = 128;        // per block
  int rows_per_block = 4;   // groups (warps or blocks) per block: 4 or 1
  std::int64_t blocks = 0;  // grid size for `groups` rows/chunks
};

// Shape for `groups` independent row groups (rows in forward, chunks in backward) of `cols`
// elements accessed `vec` at a time. Block mode uses 128..1024 threads, one access each where
// 1024 suffice: a row's loads then go out at once, where 4 per thread were 4 memory latencies in
// turn (decode normalizes one 4096-wide row, 5.5 us on the H200 with 128 threads: ncu,
// 2026-11-27). The shape depends on cols only, never on groups, so a row's bits do not change
// with the batch (batch-invariant serving).
inline RowLaunch row_launch(std::int64_t groups, std::int64_t cols, int vec) {
  RowLaunch l;
  if (cols <= kWarpRowMax) {
    l.warp_per_row = true;
    l.threads = 128;
    l.rows_per_block = 4;
  } else {
    const std::int64_t accesses = (cols + vec - 1) / vec;
    int t = 128;
    while (t < 1024 && t < accesses) t *= 2;
    l.warp_per_row = false;
    l.threads = t;
    l.rows_per_block = 1;
  }
  l.blocks = (groups + l.rows_per_block - 1) / l.rows_per_block;
  return l;
}

struct NormChunks {
  std::int64_t count = 0;     // non-empty chunks
  std::int64_t rows_per = 1;  // rows in each (the last may have fewer)
};
// Same rule as the CPU kernel's row_chunks, with kNormMaxChunks chunks at most.
inline NormChunks norm_chunks(std::int64_t rows) {
  const std::int64_t want = std::min(rows, kNormMaxChunks);
  if (want <= 0) return {0, 1};
  const std::int64_t per = (rows + want - 1) / want;
  return {(rows + per - 1) / per, per};
}

// The RMSNorm backward's register path: with one warp per chunk and at most kNormRegPacks
// accesses of `vec` elements per lane in a row, each lane keeps w and its columns' dw partial
// sums in registers and loads the next row while it reduces this one. Returns the accesses per
// lane rounded up to 1, 2 or 4, or 0 when the row is too wide (the general kernel runs).
constexpr int kNormRegPacks = 4;
inline int norm_register_packs(std::int64_t dim, int vec) {
  if (dim > kWarpRowMax || vec <= 0) return 0;
  const std::int64_t per_lane = (dim + 32LL * vec - 1) / (32LL * vec);
  if (per_lane > kNormRegPacks) return 0;
  return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : 4;
}

// f32 elements of the partial buffers the backward needs: (chunks, dim), twice with db.
inline std::int64_t norm_backward_scratch_floats(std::int64_t rows, std::int64_t dim,
                                                 bool with_db) {
  return norm_chunks(rows).count * dim * (with_db ? 2 : 1);
}

// ---- launchers
// -----------------------------------------------------------------------------------

template <typename T>
void rmsnorm_forward(std::int64_t rows, std::int64_t dim, float eps, const T* x,
                     std::int64_t x_stride, const T* w, T* y, float* rstd, StreamHandle stream);
template <typename T>
void add_rmsnorm_forward(std::int64_t rows, std::int64_t dim, float eps, const T* x,
                         std::int64_t x_stride, const T* r, std::int64_t r_stride, const T* w, T* s,
                         T* y, float* rstd, StreamHandle stream);
// dw_partial: (norm_chunks(rows).count, dim) f32, written; null when dw is not wanted.
template <typename T>
void rmsnorm_backward(std::int64_t rows, std::int64_t dim, const T* x, std::int64_t x_stride,
                      const T* w, const float* rstd, const T* dy, std::int64_t dy_stride, T* dx,
                      float* dw_partial, StreamHandle stream);

template <typename T>
void layernorm_forward(std::int64_t rows, std::int64_t dim, float eps, const T* x,
                       std::int64_t x_stride, const T* w, const T* b, T* y, float* mean,
                       float* rstd, StreamHandle stream);
// dw_partial / db_partial: (norm_chunks(rows).count, dim) f32 each, written; either may be null.
template <typename T>
void layernorm_backward(std::int64_t rows, std::int64_t dim, const T* x, std::int64_t x_stride,
                        const T* w, const float* mean, const float* rstd, const T* dy,
                        std::int64_t dy_stride, T* dx, float* dw_partial, float* db_partial,
                        StreamHandle stream);

// dst[j] += sum_{c < chunks} part[c * dim + j], summed in a fixed order, rounded once to U
// (float, bf16 or f16). Also used by the fused qk_norm_rope backward (rope.h).
template <typename U>
void reduce_partials(std::int64_t chunks, std::int64_t dim, const float* part, U* dst,
                     StreamHandle stream);

}  // namespace kiln::cuda
