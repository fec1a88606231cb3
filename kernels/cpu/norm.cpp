// RMSNorm and LayerNorm, forward and backward (math in norm.h). Row statistics are summed in
// double (vectorized), outputs stored in T. Rows are independent in forward; in backward the
// weight gradients go through per-chunk partial buffers so the result does not depend on
// scheduling or thread count.
#include "kernels/cpu/norm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/error.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; below this stay on one thread
constexpr int64_t kMaxChunks = 64;         // dw/db partial buffers (fixed, not per thread)

struct Chunks {
  int64_t count, rows_per;
};
Chunks row_chunks(int64_t rows) {
  const int64_t want = std::min<int64_t>(rows, kMaxChunks);
  const int64_t per = want > 0 ? (rows + want - 1) / want : 1;
  return {want > 0 ? (rows + per - 1) / per : 0, per};
}

void check_sizes(const char* op, int64_t rows, int64_t dim) {
  KILN_CHECK(rows >= 0 && dim > 0, "[{}] bad sizes rows={} dim={}", op, rows, dim);
}

// dst[j] += sum_c part[c * dim + j], chunks added in order c = 0, 1, ...
template <typename T>
void reduce_chunks(int64_t nchunks, int64_t dim, const std::vector<T>& part, T* dst) {
#pragma omp parallel for schedule(static) if (nchunks * dim >= kParallelMin)
  for (int64_t j = 0; j < dim; ++j) {
    T acc = 0;
    for (int64_t c = 0; c < nchunks; ++c) acc += part[c * dim + j];
    dst[j] += acc;
  }
}

}  // namespace

template <typename T>
void rmsnorm_forward(int64_t rows, int64_t dim, double eps, const T* x, const T* w, T* y,
                     T* rstd) {
  check_sizes("rmsnorm", rows, dim);
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < dim; ++j) ss += double(xr[j]) * double(xr[j]);
    const T rs = T(1.0 / std::sqrt(ss / double(dim) + eps));
    rstd[r] = rs;
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * rs * w[j];
  }
}

template <typename T>
void rmsnorm_backward(int64_t rows, int64_t dim, const T* x, const T* w, const T* rstd,
                      const T* dy, T* dx, T* dw) {
  check_sizes("rmsnorm", rows, dim);
  const Chunks ch = row_chunks(rows);
  std::vector<T> part(static_cast<size_t>(ch.count * dim), T(0));
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMin)
  for (int64_t c = 0; c < ch.count; ++c) {
    T* pw = part.data() + c * dim;
    const int64_t r1 = std::min(rows, (c + 1) * ch.rows_per);
    for (int64_t r = c * ch.rows_per; r < r1; ++r) {
      const T* xr = x + r * dim;
      const T* dyr = dy + r * dim;
      T* dxr = dx + r * dim;
      const T rs = rstd[r];
      double dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < dim; ++j) dot += double(w[j]) * double(dyr[j]) * double(xr[j]);
      const T coef = T(double(rs) * double(rs) * double(rs) * dot / double(dim));
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        const T xj = xr[j], dyj = dyr[j];  // read before writing: dx may alias dy
        pw[j] += dyj * xj * rs;
        dxr[j] = rs * w[j] * dyj - xj * coef;
      }
    }
  }
  reduce_chunks(ch.count, dim, part, dw);
}

template <typename T>
void layernorm_forward(int64_t rows, int64_t dim, double eps, const T* x, const T* w, const T* b,
                       T* y, T* mean, T* rstd) {
  check_sizes("layernorm", rows, dim);
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < dim; ++j) s += double(xr[j]);
    const double mu = s / double(dim);
    double ss = 0;  // two-pass variance: no cancellation for rows with a large mean
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < dim; ++j) ss += (double(xr[j]) - mu) * (double(xr[j]) - mu);
    const T rs = T(1.0 / std::sqrt(ss / double(dim) + eps));
    const T m = T(mu);
    mean[r] = m;
    rstd[r] = rs;
    if (b) {
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * rs * w[j] + b[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * rs * w[j];
    }
  }
}

template <typename T>
void layernorm_backward(int64_t rows, int64_t dim, const T* x, const T* w, const T* mean,
                        const T* rstd, const T* dy, T* dx, T* dw, T* db) {
  check_sizes("layernorm", rows, dim);
  const Chunks ch = row_chunks(rows);
  const bool with_db = db != nullptr;
  std::vector<T> part(static_cast<size_t>(ch.count * dim * (with_db ? 2 : 1)), T(0));
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMin)
  for (int64_t c = 0; c < ch.count; ++c) {
    T* pw = part.data() + c * dim;
    T* pb = with_db ? part.data() + (ch.count + c) * dim : nullptr;
    const int64_t r1 = std::min(rows, (c + 1) * ch.rows_per);
    for (int64_t r = c * ch.rows_per; r < r1; ++r) {
      const T* xr = x + r * dim;
      const T* dyr = dy + r * dim;
      T* dxr = dx + r * dim;
      const T m = mean[r], rs = rstd[r];
      double sg = 0, sgx = 0;  // sum_j g_j, sum_j g_j xhat_j with g = w dy
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < dim; ++j) {
        const double g = double(w[j]) * double(dyr[j]);
        sg += g;
        sgx += g * (double(xr[j]) - double(m)) * double(rs);
      }
      const T mg = T(sg / double(dim)), mgx = T(sgx / double(dim));
      if (pb) {
#pragma omp simd
        for (int64_t j = 0; j < dim; ++j) pb[j] += dyr[j];
      }
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        const T xhat = (xr[j] - m) * rs, dyj = dyr[j];  // read before writing (dx may alias dy)
        pw[j] += dyj * xhat;
        dxr[j] = rs * (w[j] * dyj - mg - xhat * mgx);
      }
    }
  }
  reduce_chunks(ch.count, dim, part, dw);
  if (with_db) {
    std::vector<T> pb(part.begin() + ch.count * dim, part.end());
    reduce_chunks(ch.count, dim, pb, db);
  }
}

#define KILN_INSTANTIATE(T)                                                                   \
  template void rmsnorm_forward<T>(int64_t, int64_t, double, const T*, const T*, T*, T*);     \
  template void rmsnorm_backward<T>(int64_t, int64_t, const T*, const T*, const T*, const T*, \
                                    T*, T*);                                                  \
  template void layernorm_forward<T>(int64_t, int64_t, double, const T*, const T*, const T*,  \
                                     T*, T*, T*);                                             \
  template void layernorm_backward<T>(int64_t, int64_t, const T*, const T*, const T*,         \
                                      const T*, const T*, T*, T*, T*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
