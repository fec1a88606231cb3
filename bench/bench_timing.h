// Timing helpers shared by the C++ benchmarks (bench/*.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace kiln::bench {

// The middle value (the upper middle of an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The median of reps timed calls of f, in milliseconds (no warm-up call: callers that need one
// make it first).
template <typename F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(std::move(t));
}

}  // namespace kiln::bench
