// See bandwidth.h.
#include "kernels/cpu/bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace kiln::cpu {

Bandwidth measure_bandwidth(std::size_t bytes, int reps) {
  using Clock = std::chrono::steady_clock;
  std::size_t n = bytes / sizeof(double);
  std::vector<double> a(n), b(n);
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) a[i] = 1.0, b[i] = static_cast<double>(i & 7);
  Bandwidth r;
  r.bytes = bytes;
  r.threads = omp_get_max_threads();
  double best_copy = 1e30, best_read = 1e30, sink = 0;
  for (int k = 0; k < reps; ++k) {
    auto t0 = Clock::now();
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < n; ++i) a[i] = b[i];
    auto t1 = Clock::now();
    // Eight independent sums: one accumulator would be bound by the add latency, not memory.
    double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (std::size_t i = 0; i < n / 8; ++i) {
      const double* p = &a[i * 8];
      s += ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    }
    auto t2 = Clock::now();
    sink += s;
    best_copy = std::min(best_copy, std::chrono::duration<double>(t1 - t0).count());
    best_read = std::min(best_read, std::chrono::duration<double>(t2 - t1).count());
  }
  if (sink == -1) std::fputs("", stderr);  // keeps the reads
  r.copy_gbs = 2.0 * static_cast<double>(bytes) / best_copy / 1e9;
  r.read_gbs = static_cast<double>(bytes) / best_read / 1e9;
  return r;
}

}  // namespace kiln::cpu
