// Softmax / log-softmax over rows; see softmax.h for the math. Rows run in parallel; each row is
// three passes (max, exp-sum, write) in cache. A row of all -inf gives NaN (0/0), as in PyTorch.
#include "kernels/cpu/softmax.h"

#include <cmath>

#include "kernels/common/error.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 16384;

template <typename T>
inline T row_max(int64_t n, const T* x) {
  T m = x[0];
  for (int64_t i = 1; i < n; ++i) m = (x[i] != x[i] || x[i] > m) ? x[i] : m;
  return m;
}

inline void check(const char* op, int64_t rows, int64_t cols) {
  KILN_CHECK(rows >= 0 && cols >= 0, "[{}] negative size ({}, {})", op, rows, cols);
}

}  // namespace

template <typename T>
void softmax_forward(int64_t rows, int64_t cols, const T* x, T* y) {
  check("softmax", rows, cols);
  if (cols == 0) return;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const T m = row_max(cols, xr);
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const T e = std::exp(xr[c] - m);
      yr[c] = e;
      s += static_cast<double>(e);
    }
    const T inv = static_cast<T>(1.0 / s);
    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
}

template <typename T>
void softmax_backward(int64_t rows, int64_t cols, const T* y, const T* dy, T* dx) {
  check("softmax_backward", rows, cols);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(dyr[c]) * yr[c];
    const T d = static_cast<T>(dot);
    for (int64_t c = 0; c < cols; ++c) dxr[c] = yr[c] * (dyr[c] - d);
  }
}

template <typename T>
void log_softmax_forward(int64_t rows, int64_t cols, const T* x, T* y) {
  check("log_softmax", rows, cols);
  if (cols == 0) return;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const T m = row_max(cols, xr);
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(std::exp(xr[c] - m));
    // (x - max) - log(sum) rather than x - (max + log(sum)): keeps precision for large logits.
    const T log_s = static_cast<T>(std::log(s));
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) - log_s;
  }
}

template <typename T>
void log_softmax_backward(int64_t rows, int64_t cols, const T* y, const T* dy, T* dx) {
  check("log_softmax_backward", rows, cols);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(dyr[c]);
    const T st = static_cast<T>(s);
    for (int64_t c = 0; c < cols; ++c) dxr[c] = dyr[c] - std::exp(yr[c]) * st;
  }
}

#define KILN_SOFTMAX_INST(T)                                                   \
  template void softmax_forward<T>(int64_t, int64_t, const T*, T*);            \
  template void softmax_backward<T>(int64_t, int64_t, const T*, const T*, T*); \
  template void log_softmax_forward<T>(int64_t, int64_t, const T*, T*);        \
  template void log_softmax_backward<T>(int64_t, int64_t, const T*, const T*, T*);
KILN_SOFTMAX_INST(float)
KILN_SOFTMAX_INST(double)
#undef KILN_SOFTMAX_INST

}  // namespace kiln::cpu
