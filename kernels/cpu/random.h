// Philox-based random fills (=), following the stream layout in kernels/common/philox.h:
// element i of a fill with (seed, offset) uses Philox counter offset + i/4, lane i%4.
//   random_uniform: out[i] = lo + (hi - lo) * u_i,     u_i in [0, 1) (24-bit float)
//   random_normal:  out[i] = mean + std * z_i,         z_i standard normal (Box-Muller, float)
// u_i / z_i are computed in float (as on the GPU), then the affine map runs in T.
// A fill of n elements consumes ceil(n/4) counters; the next fill should use
// offset + ceil(n/4) to get fresh numbers.
#pragma once

#include <cstdint>

namespace kiln::cpu {

template <typename T>
void random_uniform(int64_t n, double lo, double hi, uint64_t seed, uint64_t offset, T* out);

template <typename T>
void random_normal(int64_t n, double mean, double std, uint64_t seed, uint64_t offset, T* out);

}  // namespace kiln::cpu
