#include "serve/kv_pool.h"

#include <cstring>

#include "tensor/memory.h"
#include "tensor/ops.h"

namespace kiln::serve {

std::int64_t kv_block_bytes(const models::ModelConfig& c, std::int64_t block_size, DType dtype) {
  return 2 * c.n_layers * block_size * c.n_kv_heads * c.head_dim *
         static_cast<std::int64_t>(dtype_size(dtype));
}

KvPool::KvPool(const models::ModelConfig& c, std::int64_t num_blocks, std::int64_t block_size,
               DType dtype, Device device)
    : num_blocks_(num_blocks), block_size_(block_size) {
  KILN_CHECK(block_size > 0 && block_size <= 4096, "[kv_pool] block size {} outside [1, 4096]",
             block_size);
  KILN_CHECK(num_blocks > 0 && num_blocks < (std::int64_t{1} << 31),
             "[kv_pool] {} blocks: need at least one, and fewer than 2^31", num_blocks);
  MemoryScope scope(MemCategory::KVCache);
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    k.push_back(Tensor::empty({num_blocks, block_size, c.n_kv_heads, c.head_dim}, dtype, device));
    v.push_back(Tensor::empty({num_blocks, block_size, c.n_kv_heads, c.head_dim}, dtype, device));
  }
  refcount_.assign(static_cast<std::size_t>(num_blocks), 0);
  key_of_.resize(static_cast<std::size_t>(num_blocks));
  lru_pos_.resize(static_cast<std::size_t>(num_blocks));
  in_lru_.assign(static_cast<std::size_t>(num_blocks), false);
  free_.reserve(static_cast<std::size_t>(num_blocks));
  for (std::int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<std::int32_t>(b));
}

std::vector<std::int32_t> KvPool::allocate(std::int64_t n) {
  KILN_CHECK(n >= 0, "[kv_pool] cannot allocate {} blocks", n);
  if (n > free_blocks() + evictable_blocks()) return {};
  // Evict cached blocks nobody uses, least recently used first, until n are free.
  while (n > free_blocks()) {
    const std::int32_t b = lru_.front();
    lru_.pop_front();
    in_lru_[b] = false;
    by_content_.erase(key_of_[b]);
    key_of_[b].clear();
    refcount_[b] = 0;
    free_.push_back(b);
  }
  std::vector<std::int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<std::size_t>(n));
  for (std::int32_t b : out) refcount_[b] = 1;
  return out;
}

void KvPool::release(const std::vector<std::int32_t>& blocks) {
  for (std::int32_t b : blocks) {
    KILN_CHECK(b >= 0 && b < num_blocks_ && refcount_[b] > 0,
               "[kv_pool] block {} released but not held", b);
    --refcount_[b];
    if (refcount_[b] == 0) {
      free_.push_back(b);
    } else if (refcount_[b] == 1 && !key_of_[b].empty()) {
      lru_pos_[b] = lru_.insert(lru_.end(), b);  // only the cache holds it now
      in_lru_[b] = true;
    }
  }
}

std::string KvPool::content_key(std::int32_t parent, const std::int32_t* tokens) const {
  std::string key(sizeof(std::int32_t) * static_cast<std::size_t>(block_size_ + 1), '\0');
  std::memcpy(key.data(), &parent, sizeof parent);
  std::memcpy(key.data() + sizeof parent, tokens,
              sizeof(std::int32_t) * static_cast<std::size_t>(block_size_));
  return key;
}

void KvPool::take(std::int32_t b) {
  if (in_lru_[b]) {
    lru_.erase(lru_pos_[b]);
    in_lru_[b] = false;
  }
  ++refcount_[b];
}

std::vector<std::int32_t> KvPool::match_prefix(const std::vector<std::int32_t>& tokens,
                                               std::int64_t max_blocks) {
  std::vector<std::int32_t> out;
  std::int32_t parent = -1;
  for (std::int64_t i = 0;
       i < max_blocks && (i + 1) * block_size_ <= static_cast<std::int64_t>(tokens.size()); ++i) {
    const auto it = by_content_.find(content_key(parent, tokens.data() + i * block_size_));
    if (it == by_content_.end()) break;
    take(it->second);
    out.push_back(it->second);
    parent = it->second;
  }
  return out;
}

void KvPool::publish(std::int32_t parent, const std::int32_t* block_tokens, std::int32_t block) {
  KILN_CHECK(block >= 0 && block < num_blocks_ && refcount_[block] > 0,
             "[kv_pool] block {} published but not held", block);
  if (!key_of_[block].empty()) return;
  std::string key = content_key(parent, block_tokens);
  if (by_content_.count(key)) return;
  by_content_.emplace(key, block);
  key_of_[block] = std::move(key);
  ++refcount_[block];  // the cache's own reference
}

}  // namespace kiln::serve
