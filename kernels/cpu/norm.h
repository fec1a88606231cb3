// Row normalizations, CPU. x, y, dy, dx: (rows, dim) contiguous; w, b, dw, db: (dim);
// per-row statistics mean, rstd: (rows).
//
// RMSNorm:    rstd = 1 / sqrt(mean_j(x_j^2) + eps),  y = x * rstd * w
//   backward: dx = rstd * (w dy - x * rstd^2 * mean_j(w_j dy_j x_j))      (=)
//             dw += sum_rows dy * x * rstd                                 (+=)
// LayerNorm:  mean = mean_j(x_j),  rstd = 1 / sqrt(mean_j((x_j - mean)^2) + eps),
//             xhat = (x - mean) * rstd,  y = xhat * w + b
//   backward: g = w dy,  dx = rstd * (g - mean_j(g_j) - xhat * mean_j(g_j xhat_j))  (=)
//             dw += sum_rows dy * xhat,  db += sum_rows dy                           (+=)
//
// Forward writes y, mean and rstd (=). The dw/db sums are deterministic and independent of the
// thread count: rows are cut into a fixed set of chunks, each chunk sums into its own buffer,
// and the buffers are added in chunk order. LayerNorm's b may be null (no bias; db is then
// ignored). y may alias x; dx may alias dy.
//
// T is the storage type of x, w, b, y, dy, dx (float, double, bf16, f16); the math runs in
// C = compute_t<T> (f32 for the 16-bit types, kernels/cpu/bf16_util.h) with row sums in double.
// The statistics (mean, rstd) and the weight gradients (dw, db) are C: f32 for bf16, as on CUDA.
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

template <typename T>
void rmsnorm_forward(int64_t rows, int64_t dim, double eps, const T* x, const T* w, T* y,
                     compute_t<T>* rstd);
template <typename T>
void rmsnorm_backward(int64_t rows, int64_t dim, const T* x, const T* w, const compute_t<T>* rstd,
                      const T* dy, T* dx, compute_t<T>* dw);

template <typename T>
void layernorm_forward(int64_t rows, int64_t dim, double eps, const T* x, const T* w, const T* b,
                       T* y, compute_t<T>* mean, compute_t<T>* rstd);
template <typename T>
void layernorm_backward(int64_t rows, int64_t dim, const T* x, const T* w, const compute_t<T>* mean,
                        const compute_t<T>* rstd, const T* dy, T* dx, compute_t<T>* dw,
                        compute_t<T>* db);

}  // namespace kiln::cpu
