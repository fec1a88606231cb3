// How ZeRO splits one parameter tensor across ranks. Shared by the trainer (which owns the shard's
// optimizer state) and the memory budget (which charges it), so the two agree to the byte.
//
// Each parameter's flat elements are cut into `world` contiguous pieces of ceil(numel / world)
// elements; the last pieces are shorter, or empty when numel < world. Rank r owns
// [begin, end) = [min(r * per, numel), min((r + 1) * per, numel)).
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::dist {

struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

inline int64_t shard_stride(int64_t numel, int world) { return (numel + world - 1) / world; }

inline ShardRange shard_range(int64_t numel, int rank, int world) {
  const int64_t per = shard_stride(numel, world);
  const int64_t begin = std::min<int64_t>(per * rank, numel);
  return {begin, std::min<int64_t>(begin + per, numel)};
}

}  // namespace kiln::dist
