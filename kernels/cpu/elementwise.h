// Elementwise kernels (all write their output with =, except axpy which does y += alpha * x).
//   binary:     out[i] = a[ia(i)] (op) b[ib(i)]  with broadcasting through 0 strides
//   unary:      out[i] = f(x[i])
//   scale_add:  out[i] = alpha * x[i] + beta * y[i]
//   add_scalar: out[i] = x[i] + s;   mul_scalar: out[i] = x[i] * s
//   affine:     out[i] = alpha * x[i] + beta
//   axpy:       y[i] += alpha * x[i]
// Max/Min propagate NaN (as torch.maximum/minimum). In-place use (out == a, out == x, ...) is
// fine as long as out aliases an input exactly, element for element.
// T is the storage type (float, double, bf16, f16); the math runs in compute_t<T> (f32 for the
// 16-bit types, kernels/cpu/bf16_util.h) and each output is rounded once. Scalars are given in
// compute_t<T>.
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

enum class BinaryOp { Add, Sub, Mul, Div, Max, Min };
enum class UnaryOp { Neg, Exp, Log, Sqrt, Rsqrt, Abs, Square, Reciprocal, Tanh, Sigmoid };

// out: contiguous with shape out_shape[ndim]; a_strides/b_strides in elements, 0 where the
// operand is broadcast along that dim (must be >= 0). ndim may be 0 (scalars).
template <typename T>
void binary(BinaryOp op, int ndim, const int64_t* out_shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out);

template <typename T>
void unary(UnaryOp op, int64_t n, const T* x, T* out);

template <typename T>
void scale_add(int64_t n, compute_t<T> alpha, const T* x, compute_t<T> beta, const T* y, T* out);

template <typename T>
void add_scalar(int64_t n, const T* x, compute_t<T> s, T* out);

template <typename T>
void mul_scalar(int64_t n, const T* x, compute_t<T> s, T* out);

// out[i] = alpha * x[i] + beta (one rounding for 16-bit storage).
template <typename T>
void affine(int64_t n, const T* x, compute_t<T> alpha, compute_t<T> beta, T* out);

template <typename T>
void axpy(int64_t n, compute_t<T> alpha, const T* x, T* y);

}  // namespace kiln::cpu
