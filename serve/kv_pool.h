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
//
// Prefix caching: a full block can be published under its content, (the block before it, its
// block_size token ids), which names the whole prefix up to it exactly (no hash collisions). A
// later sequence whose prompt starts with the same tokens takes those blocks (one more reference
// each) instead of computing them again. The cache holds a reference of its own, so a published
// block outlives its sequence; blocks only the cache holds are evicted, least recently used
// first, when allocate() finds the free list short.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
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
  // Blocks on the free list; blocks held by sequences; blocks only the prefix cache holds (taken
  // back by allocate() when the free list runs short).
  std::int64_t free_blocks() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t used_blocks() const { return num_blocks_ - free_blocks() - evictable_blocks(); }
  // Blocks needed for `tokens` positions.
  std::int64_t blocks_for(std::int64_t tokens) const {
    return (tokens + block_size_ - 1) / block_size_;
  }

  // n blocks off the free list (reference count 1 each), or an empty vector (nothing taken) when
  // fewer than n are free.
  std::vector<std::int32_t> allocate(std::int64_t n);
  // Drops one reference to each block; a block whose count reaches zero is free again.
  void release(const std::vector<std::int32_t>& blocks);

  // The published blocks that hold the longest prefix of `tokens` made of whole blocks, at most
  // max_blocks of them, each with one more reference (release them like allocated ones).
  std::vector<std::int32_t> match_prefix(const std::vector<std::int32_t>& tokens,
                                         std::int64_t max_blocks);
  // Publishes `block`, which holds tokens [i * block_size, (i + 1) * block_size) of a sequence
  // whose block i - 1 is `parent` (-1 for the first block). A block already published, or content
  // already cached under another block, is left as it is.
  void publish(std::int32_t parent, const std::int32_t* block_tokens, std::int32_t block);
  std::int64_t cached_blocks() const { return static_cast<std::int64_t>(by_content_.size()); }
  std::int64_t evictable_blocks() const { return static_cast<std::int64_t>(lru_.size()); }

  std::vector<Tensor> k, v;  // per layer, (num_blocks, block_size, Hkv, D)

 private:
  std::int64_t num_blocks_, block_size_;
  std::vector<std::int32_t> free_;      // a stack: the most recently freed block is reused first
  std::vector<std::int32_t> refcount_;  // per block

  std::string content_key(std::int32_t parent, const std::int32_t* tokens) const;
  void take(std::int32_t b);  // one more reference (leaves the LRU list if only the cache held it)
  std::unordered_map<std::string, std::int32_t> by_content_;
  std::vector<std::string> key_of_;  // per block: its key in by_content_, empty if unpublished
  std::list<std::int32_t> lru_;      // published blocks only the cache holds, oldest first
  std::vector<std::list<std::int32_t>::iterator> lru_pos_;  // per block, valid while in lru_
  std::vector<bool> in_lru_;
};

}  // namespace kiln::serve
