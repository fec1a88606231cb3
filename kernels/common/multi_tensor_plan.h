// Planning of multi-tensor launches (the CUDA optimizer and gradient-norm kernels), in plain
// C++ so that CPU-only builds test it.
//
// A multi-tensor kernel processes many tensors of different sizes in one launch. Each tensor
// is cut into chunks of `chunk` elements; every block of the grid takes one chunk. The launch
// carries a table of slots (a slot is a tensor, or a piece of one: elements
// [first, first + count)) and the exclusive prefix sum of the slots' chunk counts:
//
//   chunk_start[s] = sum_{r < s} ceil(count_r / chunk),  chunk_start[nslots] = chunks
//
// Block c finds its slot with find_slot() (a binary search: the last s with
// chunk_start[s] <= c) and processes elements [(c - chunk_start[s]) * chunk, min(count, +chunk))
// of that slot. The table travels as the kernel's parameter block, which bounds the slots per
// launch (`max_slots`); grid.x bounds the chunks per launch (`max_chunks`). When the tensors do
// not fit, plan() opens another launch, splitting a tensor at a chunk boundary if needed, so
// every element of every tensor is covered exactly once, in order. Empty tensors get no slot.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/half.h"  // KILN_HOST_DEVICE

namespace kiln::mt {

struct Slot {
  int tensor = 0;          // index into the planned list
  std::int64_t first = 0;  // first element of the tensor in this slot (a multiple of chunk)
  std::int64_t count = 0;  // elements in this slot (> 0)
};

struct Launch {
  std::vector<Slot> slots;
  std::vector<std::int64_t> chunk_start;  // slots.size() + 1 entries, starts at 0
  std::int64_t chunks() const { return chunk_start.empty() ? 0 : chunk_start.back(); }
};

inline std::int64_t chunks_of(std::int64_t n, std::int64_t chunk) {
  return (n + chunk - 1) / chunk;
}

// Greedy, in tensor order: fills a launch up to max_slots slots and max_chunks chunks, then opens
// the next one.
inline std::vector<Launch> plan(std::span<const std::int64_t> numels, std::int64_t chunk,
                                int max_slots, std::int64_t max_chunks) {
  KILN_CHECK(chunk > 0 && max_slots > 0 && max_chunks > 0,
             "[multi_tensor] bad plan limits chunk={} slots={} chunks={}", chunk, max_slots,
             max_chunks);
  std::vector<Launch> out;
  auto open = [&] {
    out.emplace_back();
    out.back().chunk_start.push_back(0);
  };
  for (std::size_t t = 0; t < numels.size(); ++t) {
    const std::int64_t n = numels[t];
    KILN_CHECK(n >= 0, "[multi_tensor] tensor {} has negative size {}", t, n);
    std::int64_t done = 0;  // elements of tensor t already placed
    while (done < n) {
      if (out.empty() || static_cast<int>(out.back().slots.size()) == max_slots ||
          out.back().chunks() == max_chunks)
        open();
      Launch& l = out.back();
      const std::int64_t room = max_chunks - l.chunks();
      const std::int64_t take = std::min(chunks_of(n - done, chunk), room);
      const std::int64_t count = std::min(n - done, take * chunk);
      l.slots.push_back({static_cast<int>(t), done, count});
      l.chunk_start.push_back(l.chunks() + take);
      done += count;
    }
  }
  return out;
}

// The slot of chunk c: the last s in [0, nslots) with starts[s] <= c (starts has nslots + 1
// entries, starts[0] == 0 <= c < starts[nslots]). Slots are never empty, so starts is strictly
// increasing; equal entries would still resolve to the slot that holds the chunk.
template <typename I>
KILN_HOST_DEVICE inline int find_slot(const I* starts, int nslots, std::int64_t c) {
  int lo = 0, hi = nslots - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<std::int64_t>(starts[mid]) <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace kiln::mt
