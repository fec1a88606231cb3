// Reductions on CUDA, with the math of kernels/cpu/reduce.h (all write their output with =):
//   reduce:      out[o, j] = R_{d < n} x[o, d, j]  over the middle of an (outer, n, inner) view;
//                R = sum, mean (sum / n), max, min. out: (outer, inner) contiguous.
//   argmax:      out[o, j] = first d with x[o, d, j] maximal; a NaN counts as the maximum (the
//                first NaN wins). out: (outer, inner) int64 contiguous.
//   sum_all:     out[0] = sum of every element of x.
//   sum_squares: returns sum x^2 to the host (squares and per-thread sums in f64).
// x may be strided (the plan carries its strides); T is float, bf16 or f16 and the math is f32
// (f32 accumulation for sums). Max/min propagate NaN. Every result is deterministic: each
// thread's share of the elements and the order partial results are combined in depend only on
// the sizes, never on timing (no atomics). Whole-tensor sums run in two passes through a small
// buffer that lives in the module (__device__ arrays, no allocation), which is safe because every
// kernel runs on the legacy default stream.
//
// Plain C++ header (compiled by g++ too).
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

enum class ReduceOp { Sum, Mean, Max, Min };  // same order as ops::Reduce

// A group of dims walked as one index: offset(i) = sum over dims of digit(i, d) * stride[d],
// row-major (the last dim fastest). ndim 0 is the single index 0.
struct DimGroup {
  int ndim = 0;
  std::int64_t shape[kMaxStridedDims] = {};
  std::int64_t stride[kMaxStridedDims] = {};
};

KILN_HOST_DEVICE inline std::int64_t group_offset(const DimGroup& g, std::int64_t i) {
  std::int64_t off = 0;
  KILN_UNROLL
  for (int d = kMaxStridedDims - 1; d >= 0; --d) {
    if (d < g.ndim) {
      off += (i % g.shape[d]) * g.stride[d];
      i /= g.shape[d];
    }
  }
  return off;
}

// x as (outer, n, inner): element (o, d, j) is at
//   group_offset(outer_dims, o) + d * n_stride + group_offset(inner_dims, j).
struct ReducePlan {
  std::int64_t outer = 1, n = 1, inner = 1;
  std::int64_t n_stride = 0;
  DimGroup outer_dims, inner_dims;
};

// Finds the reduced dim of x (shape/strides, ndim dims) from the (outer, n, inner) split the front
// end computed, and collapses the dims before and after it. Fails with "[op] ..." when the split
// does not match the shape or a group needs more than kMaxStridedDims dims.
ReducePlan plan_reduce(const char* op, int ndim, const std::int64_t* shape,
                       const std::int64_t* strides, std::int64_t outer, std::int64_t n,
                       std::int64_t inner);

// ---- launchers (T: float, bf16, f16) ------------------------------------------------------------

// n == 0 writes 0 for Sum (Mean/Max/Min over an empty dim fail).
template <typename T>
void reduce(ReduceOp op, const ReducePlan& plan, const T* x, T* out, StreamHandle stream);

template <typename T>
void argmax(const ReducePlan& plan, const T* x, std::int64_t* out, StreamHandle stream);

// plan: x over its own shape, one operand. out: one element of T on the device.
template <typename T>
void sum_all(const StridedPlan& plan, const T* x, T* out, StreamHandle stream);

// Synchronizes the stream and returns the result on the host.
template <typename T>
double sum_squares(const StridedPlan& plan, const T* x, StreamHandle stream);

}  // namespace kiln::cuda
