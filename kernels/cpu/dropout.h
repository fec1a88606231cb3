// Dropout with a Philox mask, CPU. x, y, dy, dx: (n) contiguous; mask: (n) bytes, 1 = kept.
//
// forward:  u_i = Philox uniform of element i under (seed, offset), the stream layout of
//           kernels/common/philox.h (counter offset + i/4, lane i%4, 24-bit float in [0, 1));
//           keep_i = u_i >= p (probability 1 - p);  y_i = keep_i ? x_i / (1 - p) : 0;
//           mask_i = keep_i                                                 (y, mask =)
// backward: dx_i = mask_i ? dy_i / (1 - p) : 0                              (dx =)
// The GPU kernel draws the same u_i, so masks match bit for bit across backends. One call
// consumes ceil(n/4) Philox counters: the next draw from the same seed should start at
// offset + ceil(n/4).
// p = 0 is the identity (mask all ones, no random numbers drawn; mask may then be null);
// p = 1 drops everything. p outside [0, 1] throws. y may alias x, dx may alias dy.
#pragma once

#include <cstdint>

namespace kiln::cpu {

template <typename T>
void dropout_forward(int64_t n, float p, uint64_t seed, uint64_t offset, const T* x, T* y,
                     uint8_t* mask);
template <typename T>
void dropout_backward(int64_t n, float p, const uint8_t* mask, const T* dy, T* dx);

}  // namespace kiln::cpu
