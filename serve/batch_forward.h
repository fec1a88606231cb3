// One forward pass over the rows of a continuous batch: any mix of sequences, each contributing a
// decode token or a chunk of its prompt, with keys and values in the paged pool (serve/kv_pool.h).
//
// Batch invariance: every op here computes a row from that row alone, in an order that does not
// depend on the other rows:
//   - embedding, norms, SwiGLU, residual adds, RoPE: row-wise kernels;
//   - attention: ops::paged_attention (one fixed-order task per row and head);
//   - linears (and the LM head): called on tiles of rows. On the CPU, GGML weights (the int8
//     GEMV, up to 8 rows) and bf16 weights with bf16 rows (the bf16 GEMV, up to kBf16GemvRows)
//     take tiles of exactly the rows there are: those kernels compute each row alone, in one
//     order for any row count. Everything else (f32 GEMMs, CUDA's cuBLASLt) is always called on
//     kRowTile rows, the last tile padded with zero rows, so its kernel, blocking and reduction
//     order are the same for a row whether the batch holds 1 or 64 rows. The cost (weights read
//     once per tile rather than once per batch; padding rows computed) is measured by
//     bench/run_serve_bench.sh.
#pragma once

#include <cstdint>
#include <vector>

#include "models/decoder.h"
#include "serve/kv_pool.h"

namespace kiln::serve {

inline constexpr std::int64_t kRowTile = 4;
// The bf16 GEMV's row limit (tensor/kernels_cpu_matmul_bf16.cpp: kLinearGemvMaxRows).
inline constexpr std::int64_t kBf16GemvRows = 4;

struct BatchRows {
  std::vector<std::int32_t> tokens;       // (N) token ids
  std::vector<std::int32_t> seq;          // (N) row of `tables`
  std::vector<std::int32_t> pos;          // (N) absolute position of each row
  std::vector<std::int64_t> logits_rows;  // rows whose next-token logits are wanted, in order
  Tensor tables;                          // i32 (S, max_blocks) on the host: block tables
};

// Writes every row's keys and values into the pool at (seq, pos), then returns the logits of
// `logits_rows` as f32 (R, V) on the host (on meta for a model on meta: the budget's dry run).
// The model must use RoPE (no learned positions).
Tensor forward_rows(const models::DecoderModel& m, KvPool& pool, const BatchRows& rows);

}  // namespace kiln::serve
