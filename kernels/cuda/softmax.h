// Softmax and log-softmax over the last dim on CUDA, with the math of kernels/cpu/softmax.h:
//   softmax:              y = exp(x - max) / sum(exp(x - max))
//   softmax backward:     dx = y * (dy - sum(dy * y))           (y: the forward output)
//   log_softmax:          y = (x - max) - log(sum(exp(x - max)))
//   log_softmax backward: dx = dy - exp(y) * sum(dy)
// Inputs are (rows, cols) with a row stride in elements (the last dim dense); outputs are
// (rows, cols) contiguous and written (=). T is float, bf16 or f16; all math is f32. One warp per
// row up to kWarpRowMax columns, else one block per row (norm.h's row_launch). The forward takes
// the max and the sum of exponentials in one online pass (each thread keeps a running max and a
// sum rescaled to it; the group then combines them), then writes in a second pass. A row of all
// -inf gives NaN, as on the CPU; a NaN in a row makes the whole row NaN. cols == 0 is a no-op.
// An output may alias its input exactly (dx == dy) when the row strides are equal to cols.
#pragma once

#include <cstdint>

#include "kernels/cuda/norm.h"  // row_launch, row_vec_width
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

template <typename T>
void softmax_forward(std::int64_t rows, std::int64_t cols, const T* x, std::int64_t x_stride,
                     bool log, T* y, StreamHandle stream);

template <typename T>
void softmax_backward(std::int64_t rows, std::int64_t cols, const T* y, std::int64_t y_stride,
                      const T* dy, std::int64_t dy_stride, bool log, T* dx, StreamHandle stream);

}  // namespace kiln::cuda
