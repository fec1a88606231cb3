// Reductions (all write their output with =).
//   reduce:      out[o, i] = R_{d < dim} x[o, d, i]   over the middle of an (outer, dim, inner)
//                contiguous view; R = sum, mean (sum / dim), max, min. out: (outer, inner).
//   argmax:      out[o, i] = first d with x[o, d, i] maximal (a NaN counts as the maximum).
//   sum_all:     out[0] = sum of x[0..n)
//   sum_squares: returns sum of x[i]^2 in double (gradient-norm clipping).
// T is the storage type (float, double, bf16, f16); values are read in compute_t<T>
// (kernels/cpu/bf16_util.h) and each output rounded once. Sums accumulate in double. Results do not
// depend on the number of threads: partial sums are taken over fixed-size chunks and combined in
// order. Max/min propagate NaN. dim == 0: sum -> 0, mean -> NaN; max/min/argmax fail.
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

enum class ReduceOp { Sum, Mean, Max, Min };

template <typename T>
void reduce(ReduceOp op, int64_t outer, int64_t dim, int64_t inner, const T* x, T* out);

template <typename T>
void argmax(int64_t outer, int64_t dim, int64_t inner, const T* x, int64_t* out);

template <typename T>
void sum_all(int64_t n, const T* x, T* out);

template <typename T>
double sum_squares(int64_t n, const T* x);

}  // namespace kiln::cpu
