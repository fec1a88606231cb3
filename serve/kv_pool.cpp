#include "serve/kv_pool.h"

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
  free_.reserve(static_cast<std::size_t>(num_blocks));
  for (std::int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<std::int32_t>(b));
}

std::vector<std::int32_t> KvPool::allocate(std::int64_t n) {
  KILN_CHECK(n >= 0, "[kv_pool] cannot allocate {} blocks", n);
  if (n > free_blocks()) return {};
  std::vector<std::int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<std::size_t>(n));
  for (std::int32_t b : out) refcount_[b] = 1;
  return out;
}

void KvPool::release(const std::vector<std::int32_t>& blocks) {
  for (std::int32_t b : blocks) {
    KILN_CHECK(b >= 0 && b < num_blocks_ && refcount_[b] > 0,
               "[kv_pool] block {} released but not held", b);
    if (--refcount_[b] == 0) free_.push_back(b);
  }
}

}  // namespace kiln::serve
