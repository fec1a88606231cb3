// Causal attention over a paged KV cache (serving: many sequences, each with its own block table),
// CPU. Inference only: no log-sum-exp is kept and there is no backward.
//
//   q, out:        (N, Hq, D) contiguous: N query rows from any number of sequences
//   k_pool, v_pool (num_blocks, block_size, Hkv, D) contiguous: every sequence's keys and values
//   block_tables   i32 (S, max_blocks): row s lists sequence s's blocks; position p of sequence s
//                  lives in block block_tables[s][p / block_size], slot p % block_size
//   token_seq      i32 (N): the block-table row of each query row
//   token_pos      i32 (N): each query row's absolute position; it sees keys 0..token_pos[i]
//
//   s_j = scale * q_i . k_j  (j <= pos_i),  p = softmax(s),  out_i = sum_j p_j v_j        (out =)
//
// Query head h reads kv head h / (Hq / Hkv). Each (row, head) is one task whose sums run in a
// fixed order (keys in position order, dims in index order): a row's result depends only on its
// own query and its sequence's keys, never on which other rows share the call, how the prompt was
// chunked or how many threads run. That is the batch invariance `kiln serve` promises.
//
// The caller has checked that every table entry a row reads is in [0, num_blocks) and every
// position is below max_blocks * block_size. T is float, double or bf16 (math in compute_t<T>).
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

template <typename T>
void paged_attention_forward(int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t block_size,
                             int64_t max_blocks, double scale, const T* q, const T* k_pool,
                             const T* v_pool, const int32_t* block_tables, const int32_t* token_seq,
                             const int32_t* token_pos, T* out);

}  // namespace kiln::cpu
