// What one op costs in memory, for the tensor tests that check scratch and conversion copies.
#pragma once

#include <cstddef>

#include "tensor/device.h"
#include "tensor/memory.h"

namespace kiln::test {

inline constexpr auto kTemps = static_cast<std::size_t>(MemCategory::Temporaries);

// Runs f on dev with its outputs charged to Activations, so that what its Temporaries peak shows
// (above what was live before) is scratch; num_allocs counts f's allocations.
template <typename F>
MemStats measure(Device dev, F&& f) {
  MemoryTracker& tr = MemoryTracker::get(dev.type);
  tr.reset_peaks();
  const MemStats before = tr.stats();
  MemoryScope outputs(MemCategory::Activations);
  f();
  MemStats st = tr.stats();
  st.peak[kTemps] -= before.current[kTemps];
  st.num_allocs -= before.num_allocs;
  return st;
}

}  // namespace kiln::test
