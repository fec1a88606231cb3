// Causal attention over a paged KV cache on CUDA; layouts and math as the CPU's
// (kernels/cpu/paged_attention.h). One warp per (query row, head): lanes split the head dim, the
// keys are read in position order with an online softmax, so a row's result never depends on the
// other rows of the call (batch invariance). T: float or bf16; pointers are device memory.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

template <typename T>
void paged_attention_forward(std::int64_t N, std::int64_t Hq, std::int64_t Hkv, std::int64_t D,
                             std::int64_t block_size, std::int64_t max_blocks, double scale,
                             const T* q, const T* k_pool, const T* v_pool,
                             const std::int32_t* block_tables, const std::int32_t* token_seq,
                             const std::int32_t* token_pos, T* out, StreamHandle stream);

}  // namespace kiln::cuda
