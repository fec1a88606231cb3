// Memory bandwidth, STREAM-like: copy (a = b: 2 bytes moved per byte) and read (a sum of a), the
// best of `reps` runs over buffers far larger than the caches, on all OpenMP threads. Decode's
// limit on the CPU: `kiln generate --bandwidth` and bench/bench_gemv.cpp quote their rates as a
// fraction of the read figure measured in the same run.
#pragma once

#include <cstddef>

namespace kiln::cpu {

struct Bandwidth {
  double copy_gbs = 0, read_gbs = 0;
  std::size_t bytes = 0;  // of each buffer
  int threads = 1;
};

Bandwidth measure_bandwidth(std::size_t bytes = std::size_t{512} << 20, int reps = 5);

}  // namespace kiln::cpu
