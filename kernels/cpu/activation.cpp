// Pointwise activations (math in activation.h). Each loop is one pass over contiguous
// memory, vectorized with `omp simd` and split across threads for large n.
#include "kernels/cpu/activation.h"

#include <omp.h>

#include <type_traits>

namespace kiln::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + detail::exp_fast(-x));
}

// tanh(u) = 1 - 2 / (1 + e^{2u}); saturates cleanly to +-1 with the clamped exp_fast.
template <typename T>
inline T tanh_via_exp(T u) {
  if constexpr (std::is_same_v<T, double>) {
    return std::tanh(u);
  } else {
    return T(1) - T(2) / (T(1) + detail::exp_fast(T(2) * u));
  }
}

template <typename T>
constexpr T kGeluC = T(0.7978845608028654);  // sqrt(2/pi)
template <typename T>
constexpr T kGeluA = T(0.044715);

}  // namespace

template <typename T>
void silu_forward(int64_t n, const T* x, T* y) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T xi = x[i];
    y[i] = xi * sigmoid(xi);
  }
}

template <typename T>
void silu_backward(int64_t n, const T* x, const T* dy, T* dx) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T xi = x[i];
    const T s = sigmoid(xi);
    dx[i] = dy[i] * s * (T(1) + xi * (T(1) - s));
  }
}

template <typename T>
void gelu_tanh_forward(int64_t n, const T* x, T* y) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T xi = x[i];
    const T t = tanh_via_exp(kGeluC<T> * (xi + kGeluA<T> * xi * xi * xi));
    y[i] = T(0.5) * xi * (T(1) + t);
  }
}

template <typename T>
void gelu_tanh_backward(int64_t n, const T* x, const T* dy, T* dx) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T xi = x[i];
    const T x2 = xi * xi;
    const T t = tanh_via_exp(kGeluC<T> * (xi + kGeluA<T> * x2 * xi));
    const T du = kGeluC<T> * (T(1) + T(3) * kGeluA<T> * x2);
    dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * xi * (T(1) - t * t) * du);
  }
}

template <typename T>
void swiglu_forward(int64_t n, const T* gate, const T* up, T* out) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i];
    out[i] = g * sigmoid(g) * up[i];
  }
}

template <typename T>
void swiglu_backward(int64_t n, const T* gate, const T* up, const T* dout, T* dgate, T* dup) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i], u = up[i], d = dout[i];  // read all before writing (outputs may alias)
    const T s = sigmoid(g);
    dgate[i] = d * u * s * (T(1) + g * (T(1) - s));
    dup[i] = d * g * s;
  }
}

#define KILN_INSTANTIATE(T)                                                      \
  template void silu_forward<T>(int64_t, const T*, T*);                          \
  template void silu_backward<T>(int64_t, const T*, const T*, T*);               \
  template void gelu_tanh_forward<T>(int64_t, const T*, T*);                     \
  template void gelu_tanh_backward<T>(int64_t, const T*, const T*, T*);          \
  template void swiglu_forward<T>(int64_t, const T*, const T*, T*);              \
  template void swiglu_backward<T>(int64_t, const T*, const T*, const T*, T*, T*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
