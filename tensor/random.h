// Seeded, counter-based random numbers (Philox4x32-10, kernels/common/philox.h).
// A draw of n numbers uses counters [offset, offset + n) of the seed's stream and
// then advances offset, so CPU and GPU produce the same numbers for the same
// (seed, offset), and saving (seed, offset) in a checkpoint restores the stream.
#pragma once

#include <cstdint>

namespace kiln {

struct Generator {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;

  explicit Generator(std::uint64_t s = 0, std::uint64_t o = 0) : seed(s), offset(o) {}
  // Reserves n counters and returns the first.
  std::uint64_t take(std::uint64_t n) {
    std::uint64_t o = offset;
    offset += n;
    return o;
  }
};

}  // namespace kiln
