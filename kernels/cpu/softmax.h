// Softmax and log-softmax over the last dim of a contiguous (rows, cols) array (all write =).
//   softmax_forward:      y = exp(x - max) / sum(exp(x - max))
//   softmax_backward:     dx = y * (dy - sum(dy * y))           (y: the forward output)
//   log_softmax_forward:  y = x - max - log(sum(exp(x - max)))
//   log_softmax_backward: dx = dy - exp(y) * sum(dy)            (y: the forward output)
// T is the storage type (float, double, bf16, f16): math in compute_t<T> (f32 for the 16-bit
// types, kernels/cpu/bf16_util.h), max and sums in compute/double, each output rounded once.
// Row sums accumulate in double for float inputs. Outputs may alias inputs exactly (y == x,
// dx == dy) for in-place use. cols == 0 is a no-op.
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

template <typename T>
void softmax_forward(int64_t rows, int64_t cols, const T* x, T* y);

template <typename T>
void softmax_backward(int64_t rows, int64_t cols, const T* y, const T* dy, T* dx);

template <typename T>
void log_softmax_forward(int64_t rows, int64_t cols, const T* x, T* y);

template <typename T>
void log_softmax_backward(int64_t rows, int64_t cols, const T* y, const T* dy, T* dx);

}  // namespace kiln::cpu
