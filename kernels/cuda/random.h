// Philox random fills on CUDA (=), drawing exactly the stream of kernels/cpu/random.h (layout in
// kernels/common/philox.h): element i of a fill with (seed, offset) uses Philox counter
// offset + i/4, lane i%4.
//   random_uniform: out[i] = lo + (hi - lo) * u_i     u_i in [0, 1), 24-bit
//   random_normal:  out[i] = mean + std * z_i       z_i standard normal (Box-Muller, lane pairs)
// As on the CPU, u_i and z_i are f32; for T = float, bf16, f16 the affine map runs in f32 with
// lo/hi-lo (mean/std) rounded to f32, then the result is rounded once to T; for T = double it
// runs in f64. The multiply and add are separate round-to-nearest operations (no fused
// multiply-add), as in the CPU build, so uniform fills match the CPU bit for bit and normal ones
// to a few ulps (logf/sinf/cosf differ between CUDA and libm).
//
// Plain C++ header (compiled by g++ too).
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

// T: float, double, bf16, f16. out: (n) contiguous.
template <typename T>
void random_uniform(std::int64_t n, double lo, double hi, std::uint64_t seed, std::uint64_t offset,
                    T* out, StreamHandle stream);

template <typename T>
void random_normal(std::int64_t n, double mean, double stdev, std::uint64_t seed,
                   std::uint64_t offset, T* out, StreamHandle stream);

}  // namespace kiln::cuda
