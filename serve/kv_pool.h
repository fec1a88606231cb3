// The paged KV cache of `kiln serve`: one pool of fixed-size blocks, allocated once, shared by all
// sequences.
//
//   k[layer], v[layer]: (num_blocks, block_size, Hkv, D) in the model's dtype, on its device,
//                       charged to MemCategory::KVCache.
//
// A sequence owns a block table (the ids of its blocks, in position order); position p lives in
// block table[p / block_size], slot p % block_size. Blocks come from a free list and go back to
// it when their reference count drops to zero. The pool never grows: its size is the serving
// budget's KV row, fixed before the first request.
#pragma once

#include <cstdint>
#include <vector>

#include "models/config.h"
#include "tensor/tensor.h"

namespace kiln::serve {

// Bytes of one block across all layers (keys and values).
std::int64_t kv_block_bytes(const models::ModelConfig& c, std::int64_t block_size, DType dtype);

class KvPool {
 public:
  KvPool(const models::ModelConfig& c, std::int64_t num_blocks, std::int64_t block_size,
         DType dtype, Device device);

  std::int64_t num_blocks() const { return num_blocks_; }
  std::int64_t block_size() const { return block_size_; }
  std::int64_t free_blocks() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // Blocks needed for `tokens` positions.
  std::int64_t blocks_for(std::int64_t tokens) const {
    return (tokens + block_size_ - 1) / block_size_;
  }

  // n blocks off the free list (reference count 1 each), or an empty vector (nothing taken) when
  // fewer than n are free.
  std::vector<std::int32_t> allocate(std::int64_t n);
  // Drops one reference to each block; a block whose count reaches zero is free again.
  void release(const std::vector<std::int32_t>& blocks);

  std::vector<Tensor> k, v;  // per layer, (num_blocks, block_size, Hkv, D)

 private:
  std::int64_t num_blocks_, block_size_;
  std::vector<std::int32_t> free_;      // a stack: the most recently freed block is reused first
  std::vector<std::int32_t> refcount_;  // per block
};

}  // namespace kiln::serve
