// Softmax / log-softmax over rows; see softmax.h for the math. Rows run in parallel; each row is
// three passes (max, exp-sum, write) in cache. A row of all -inf gives NaN (0/0), as in PyTorch.
#include "kernels/cpu/softmax.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/common/error.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 16384;

template <typename T>
inline compute_t<T> row_max(int64_t n, const T* x) {
  compute_t<T> m = to_compute(x[0]);
  for (int64_t i = 1; i < n; ++i) {
    const compute_t<T> v = to_compute(x[i]);
    m = (v != v || v > m) ? v : m;
  }
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
  using C = compute_t<T>;
#pragma omp parallel if (rows * cols > kParallelMin)
  {
    // 16-bit storage: the unnormalized exponentials go to a per-thread f32 row (y could only
    // hold them rounded), and the row is rounded once at the end. f32/f64 use y itself.
    std::vector<C> row(is_half_v<T> ? static_cast<size_t>(cols) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      C* er = out_row(yr, row.data());
      const C m = row_max(cols, xr);
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const C e = std::exp(to_compute(xr[c]) - m);
        er[c] = e;
        s += static_cast<double>(e);
      }
      const C inv = static_cast<C>(1.0 / s);
      for (int64_t c = 0; c < cols; ++c) er[c] *= inv;
      narrow(cols, er, yr);
    }
  }
}

template <typename T>
void softmax_backward(int64_t rows, int64_t cols, const T* y, const T* dy, T* dx) {
  check("softmax_backward", rows, cols);
  using C = compute_t<T>;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < cols; ++c)
      dot += static_cast<double>(to_compute(dyr[c])) * to_compute(yr[c]);
    const C d = static_cast<C>(dot);
    for (int64_t c = 0; c < cols; ++c)
      dxr[c] = from_compute<T>(to_compute(yr[c]) * (to_compute(dyr[c]) - d));
  }
}

template <typename T>
void log_softmax_forward(int64_t rows, int64_t cols, const T* x, T* y) {
  check("log_softmax", rows, cols);
  if (cols == 0) return;
  using C = compute_t<T>;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const C m = row_max(cols, xr);
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(std::exp(to_compute(xr[c]) - m));
    // (x - max) - log(sum) rather than x - (max + log(sum)): keeps precision for large logits.
    const C log_s = static_cast<C>(std::log(s));
    for (int64_t c = 0; c < cols; ++c) yr[c] = from_compute<T>((to_compute(xr[c]) - m) - log_s);
  }
}

template <typename T>
void log_softmax_backward(int64_t rows, int64_t cols, const T* y, const T* dy, T* dx) {
  check("log_softmax_backward", rows, cols);
  using C = compute_t<T>;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(to_compute(dyr[c]));
    const C st = static_cast<C>(s);
    for (int64_t c = 0; c < cols; ++c)
      dxr[c] = from_compute<T>(to_compute(dyr[c]) - std::exp(to_compute(yr[c])) * st);
  }
}

#define KILN_SOFTMAX_INST(T)                                                   \
  template void softmax_forward<T>(int64_t, int64_t, const T*, T*);            \
  template void softmax_backward<T>(int64_t, int64_t, const T*, const T*, T*); \
  template void log_softmax_forward<T>(int64_t, int64_t, const T*, T*);        \
  template void log_softmax_backward<T>(int64_t, int64_t, const T*, const T*, T*);
KILN_SOFTMAX_INST(float)
KILN_SOFTMAX_INST(double)
KILN_SOFTMAX_INST(bf16)
KILN_SOFTMAX_INST(f16)
#undef KILN_SOFTMAX_INST

}  // namespace kiln::cpu
