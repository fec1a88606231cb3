// Dropout with a Philox mask on CUDA, with the math and RNG contract of kernels/cpu/dropout.h:
//   forward:  u_i = Philox uniform of element i under (seed, offset) (kernels/common/philox.h:
//             counter offset + i/4, lane i%4, 24-bit float in [0, 1));
//             keep_i = u_i >= p;  y_i = keep_i ? x_i * scale : 0;  mask_i = keep_i   (y, mask =)
//   backward: dx_i = mask_i ? dy_i * scale : 0                                       (dx =)
// with scale = 1 / (1 - p) computed in float (0 when p = 1). The bits are the CPU kernel's, so
// the mask matches it exactly for the same (seed, offset). x, y, dy, dx: (n) contiguous T
// (float, bf16, f16); mask: (n) bytes, 1 = kept. p = 0 copies and sets the mask to ones (mask may
// then be null). y may alias x, dx may alias dy. One thread per Philox block of 4 elements.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

template <typename T>
void dropout_forward(std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset, const T* x,
                     T* y, std::uint8_t* mask, StreamHandle stream);
template <typename T>
void dropout_backward(std::int64_t n, float p, const std::uint8_t* mask, const T* dy, T* dx,
                      StreamHandle stream);

}  // namespace kiln::cuda
