// Elementwise kernels on CUDA, with the math of kernels/cpu/elementwise.h. All write their output
// with =, except axpy (y += alpha * x) and scale (y *= alpha), which update y in place.
//   binary: out[i] = a[off0(i)] (op) b[off1(i)]     broadcasting through 0 strides
//   unary:  out[i] = f(x[off0(i)])     neg exp log sqrt rsqrt abs square reciprocal tanh sigmoid
//   affine: out[i] = alpha * x[off0(i)] (+ beta)   beta is added only when nonzero, as on the CPU
//   axpy:   y[i] = y[i] + alpha * x[off1(i)]       y contiguous (operand 0 of the plan); x any
//                                                  strides and a float dtype of its own
//   scale:  y[i] = alpha * y[i]                     y contiguous
// i runs over the plan's logical (row-major) index and out/y are contiguous in that order.
// T is float, bf16 or f16; every value is widened to f32, computed in f32 and rounded once into
// the output. Products and sums use round-to-nearest intrinsics (no fused multiply-add), so f32
// results match the CPU kernels bit for bit where the CPU math is exact IEEE (+ - * / sqrt);
// exp/log/tanh differ by a few ulps. Max/min propagate NaN. An output may alias an input exactly
// (element for element), as in y = y + x.
//
// Dense operands (plan_is_dense) take a flat loop with 16-byte accesses when every pointer is
// aligned; others the strided loop (div/mod per dim, 32-bit when plan_fits_u32).
//
// Plain C++ header (compiled by g++ too).
#pragma once

#include <cstdint>

#include "kernels/cuda/copy.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

enum class BinaryOp { Add, Sub, Mul, Div, Max, Min };  // same order as ops::Binary
// Same order as ops::Unary.
enum class UnaryOp { Neg, Exp, Log, Sqrt, Rsqrt, Abs, Square, Reciprocal, Tanh, Sigmoid };

// plan: out's shape with a's strides (operand 0) and b's (operand 1).
template <typename T>
void binary(BinaryOp op, const StridedPlan& plan, const T* a, const T* b, T* out,
            StreamHandle stream);

// plan: out's shape with x's strides (operand 0).
template <typename T>
void unary(UnaryOp op, const StridedPlan& plan, const T* x, T* out, StreamHandle stream);

template <typename T>
void affine(const StridedPlan& plan, const T* x, float alpha, float beta, T* out,
            StreamHandle stream);

// plan: y's shape with y's (contiguous) strides (operand 0) and x's (operand 1).
// Ty, Tx: float, bf16, f16 in any combination (a bf16 gradient += an f32 one, ...).
template <typename Ty, typename Tx>
void axpy(const StridedPlan& plan, float alpha, const Tx* x, Ty* y, StreamHandle stream);

template <typename T>
void scale(std::int64_t n, float alpha, T* y, StreamHandle stream);

}  // namespace kiln::cuda
