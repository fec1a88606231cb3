// Tile math of kiln's flash attention that is the same on the host and the
// device: shared-memory swizzle, the per-lane addresses of ldmatrix, the
// register layout of mma.m16n8k16 accumulators, the online-softmax step and the
// loop bounds / mask decisions of the block loops.
//
// The CUDA kernels (attention_fwd.cu, attention_bwd.cu) call these functions,
// and tests/tensor/test_cuda_attention.cpp runs them on the CPU: it emulates
// ldmatrix and mma from the PTX ISA's fragment tables to check the addressing,
// and replays the blocked forward and backward recurrences against
// kernels/cpu/attention. Plain C++ (g++ compiles it too).
//
// Conventions (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .bf16):
//   lane = threadIdx.x % 32, g = lane / 4 (groupID), t = lane % 4
//   (threadID_in_group). A (16x16, row-major m x k), 4 x .b32, each two bf16
//   (lower column in the low half):
//     a0: (m g,   k 2t..2t+1)  a1: (m g+8, k 2t..)  a2: (m g, k 2t+8..)  a3: (m
//     g+8, k 2t+8..)
//   B (16x8, k x n, "col"), 2 x .b32:  b0: (k 2t..2t+1, n g)  b1: (k 2t+8.., n
//   g) C/D (16x8 f32), 4 floats: c0, c1: (m g, n 2t, 2t+1)  c2, c3: (m g+8, n
//   2t, 2t+1) ldmatrix.x4: lanes 8i..8i+7 give the row addresses of matrix i (8
//   rows of 16 bytes); lane l
//     receives in register i the elements (row l/4, cols 2(l%4), +1) of matrix
//     i, or with .trans the elements (rows 2(l%4), +1; col l/4).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/half.h"  // KILN_HOST_DEVICE

namespace kiln::cuda::attn {

// ---- shared-memory tiles
// -------------------------------------------------------------------- A tile
// of rows x D bf16 is stored in 16-byte chunks (8 elements), D/8 chunks per
// row. Chunk c of row r sits at chunk position c ^ (r % 8) of its row: the 8
// rows one ldmatrix reads (same logical chunk, consecutive rows) then fall into
// 8 different 16-byte bank groups, and so do the 8-row groups of the
// accumulator stores. Needs D/8 >= 8 (D in {64, 128}).
KILN_HOST_DEVICE inline int tile_byte_offset(int row, int chunk, int chunks_per_row) {
  return (row * chunks_per_row + (chunk ^ (row & 7))) * 16;
}

struct RowChunk {
  int row;
  int chunk;
};

// Which (row, chunk) of a tile lane `lane` points ldmatrix.x4 at. Two patterns
// cover all uses:
//
// Pattern X: row r0 + lane % 16, chunk c0 + lane / 16. Matrices: 0 = rows 0-7 /
// chunk 0,
//   1 = rows 8-15 / chunk 0, 2 = rows 0-7 / chunk 1, 3 = rows 8-15 / chunk 1.
//   Used for
//   - the A operand from a row-major [m][k] tile (Q in the forward, K and V in
//   the backward):
//     registers 0..3 are a0..a3 of the 16 x 16 block at (m r0, k 8 c0);
//   - with .trans, the B operands of two n-tiles from a [k][n] tile (V in the
//   forward, dO, Q
//     and K in the backward): registers are (b0, b1) of n-tile 8 c0 and (b0,
//     b1) of 8 c0 + 8.
KILN_HOST_DEVICE inline RowChunk ldsm_pattern_x(int lane, int r0, int c0) {
  return {r0 + (lane & 15), c0 + (lane >> 4)};
}
// Pattern Y: row r0 + 8 (lane / 16) + lane % 8, chunk c0 + (lane / 8) % 2.
// Matrices: 0 = rows
//   0-7 / chunk 0, 1 = rows 0-7 / chunk 1, 2 = rows 8-15 / chunk 0, 3 = rows
//   8-15 / chunk 1. Used for
//   - the B operands of two n-tiles from an [n][k] tile (K for S = Q K^T, Q and
//   dO for the
//     transposed scores of the backward): registers are (b0, b1) of n-tile r0,
//     then of r0 + 8;
//   - with .trans, the A operand from a [k][m] tile (dS^T stored key-major, for
//   dQ = dS K):
//     registers 0..3 are a0..a3 of the block (m 8 c0, k r0).
KILN_HOST_DEVICE inline RowChunk ldsm_pattern_y(int lane, int r0, int c0) {
  return {r0 + ((lane >> 4) << 3) + (lane & 7), c0 + ((lane >> 3) & 1)};
}

// Row and column, inside the 16 x 8 tile, of accumulator element e (0..3) of
// lane `lane`.
KILN_HOST_DEVICE inline int acc_row(int lane, int e) { return (lane >> 2) + ((e >> 1) << 3); }
KILN_HOST_DEVICE inline int acc_col(int lane, int e) { return ((lane & 3) << 1) + (e & 1); }

// ---- online softmax (base 2)
// ------------------------------------------------------------- Scores are kept
// as s2 = scale * log2(e) * q.k, so exp(scale q.k - m) = exp2(s2 - m2). A row's
// running state is its maximum m (-inf before any visible key) and its sum l of
// exp2(s2 - m). After a tile whose largest visible score is tile_max (-inf when
// the whole tile is masked for this row), the row's maximum becomes max(m,
// tile_max); `base` is what the tile's scores are measured from (0 while
// nothing is visible, so -inf - -inf never happens) and `rescale` the factor l
// and the output accumulator are multiplied by (0 on the first visible tile).
struct SoftmaxStep {
  float base;
  float rescale;
};
KILN_HOST_DEVICE inline SoftmaxStep online_softmax_step(float &m, float tile_max) {
  const float m_new = m > tile_max ? m : tile_max;
  const float base = m_new == -INFINITY ? 0.f : m_new;
  const float rescale = exp2f(m - base);  // m = -inf gives 0
  m = m_new;
  return {base, rescale};
}
// Natural-log log-sum-exp of a finished row: ln(sum exp(scale q.k)) = (m + log2
// l) ln 2.
KILN_HOST_DEVICE inline float row_lse(float m, float l) {
  return (m + log2f(l)) * 0.693147180559945309f;
}

// ---- forward loop bounds
// ------------------------------------------------------------------- Query
// rows [q0, q0 + rows) (clipped to Tq) sit at positions q_offset + i and see
// keys <= their position. Number of key blocks of bc keys the block visits:
KILN_HOST_DEVICE inline int64_t fwd_key_blocks(int64_t q0, int64_t rows, int64_t Tq, int64_t Tk,
                                               int64_t q_offset, int64_t bc) {
  const int64_t last = (q0 + rows < Tq ? q0 + rows : Tq) - 1;
  int64_t kend = q_offset + last + 1;
  if (kend > Tk) kend = Tk;
  return (kend + bc - 1) / bc;
}
// Key block [k0, k0 + bc) needs the causal mask for this query block when its
// last key lies past the first row's position. (Keys >= Tk then also get
// masked: every real row has position < Tk.)
KILN_HOST_DEVICE inline bool fwd_block_needs_mask(int64_t q0, int64_t q_offset, int64_t k0,
                                                  int64_t bc) {
  return k0 + bc - 1 > q_offset + q0;
}

// ---- backward loop bounds (Tq == Tk == T, q_offset 0)
// ---------------------------------------- Key block [k0, k0 + bc): the first
// query block of bq rows that sees any of its keys.
KILN_HOST_DEVICE inline int64_t bwd_first_query_block(int64_t k0, int64_t bq) { return k0 / bq; }
// The query block [q0, q0 + bq) needs masking against key block [k0, k0 + bc)
// when some key lies after some query (the diagonal), or when the block runs
// past T (rows >= T carry no gradient). Keys >= T only occur in a key block
// that reaches past T, and then q0 < T <= k0 + bc - 1.
KILN_HOST_DEVICE inline bool bwd_block_needs_mask(int64_t q0, int64_t bq, int64_t k0, int64_t bc,
                                                  int64_t T) {
  return q0 < k0 + bc - 1 || q0 + bq > T;
}

// ---- generic (SIMT) kernels
// ---------------------------------------------------------------- The generic
// kernels treat (query i, head of the group) as one "item": item r of kv head
// hk is query r / G with query head hk * G + r % G, so the G heads sharing a kv
// head read each K/V tile once. One past the last key the items [r0, r1) of a
// block can see:
KILN_HOST_DEVICE inline int64_t generic_key_end(int64_t r1, int64_t G, int64_t q_offset) {
  return q_offset + (r1 - 1) / G + 1;
}

}  // namespace kiln::cuda::attn
