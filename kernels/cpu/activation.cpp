// Pointwise activations (math in activation.h). Each loop is one pass over contiguous
// memory, vectorized with `omp simd` and split across threads for large n.
#include "kernels/cpu/activation.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/common/activation_math.h"
#include "kernels/common/error.h"
#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

// The exp and tanh the shared formulas (kernels/common/activation_math.h) use on the CPU.
struct CpuMath {
  template <typename T>
  static T exp(T x) {
    return detail::exp_fast(x);
  }
  // tanh(u) = 1 - 2 / (1 + e^{2u}); saturates cleanly to +-1 with the clamped exp_fast.
  template <typename T>
  static T tanh(T u) {
    if constexpr (std::is_same_v<T, double>) {
      return std::tanh(u);
    } else {
      return T(1) - T(2) / (T(1) + detail::exp_fast(T(2) * u));
    }
  }
  template <typename T>
  static T erf(T x) {
    return std::erf(x);
  }
};

// Each op runs its loop over [i0, i1) in a cloned (AVX2 / baseline) function; the public
// function splits n into chunks across threads.
constexpr int64_t kChunk = 1 << 14;

template <typename F>
void for_chunks(int64_t n, F&& body) {
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < nchunks; ++c) body(c * kChunk, std::min(n, (c + 1) * kChunk));
}

template <Op O, typename T>
KILN_SIMD_CLONES void activation_fwd_range(int64_t i0, int64_t i1, const T* x, T* y) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i)
    y[i] = from_compute<T>(act::Math<O>::template forward<CpuMath>(to_compute(x[i])));
}

template <Op O, typename T>
KILN_SIMD_CLONES void activation_bwd_range(int64_t i0, int64_t i1, const T* x, const T* dy, T* dx) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i)
    dx[i] =
        from_compute<T>(act::Math<O>::template grad<CpuMath>(to_compute(x[i]), to_compute(dy[i])));
}

template <typename T>
KILN_SIMD_CLONES void swiglu_fwd_range(int64_t i0, int64_t i1, const T* gate, const T* up, T* out) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    out[i] = from_compute<T>(act::swiglu<CpuMath>(to_compute(gate[i]), to_compute(up[i])));
  }
}

template <typename T>
KILN_SIMD_CLONES void swiglu_bwd_range(int64_t i0, int64_t i1, const T* gate, const T* up,
                                       const T* dout, T* dgate, T* dup) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    compute_t<T> dg, du;  // all inputs are read before either output is written (may alias)
    act::swiglu_grad<CpuMath>(to_compute(gate[i]), to_compute(up[i]), to_compute(dout[i]), dg, du);
    dgate[i] = from_compute<T>(dg);
    dup[i] = from_compute<T>(du);
  }
}

}  // namespace

template <typename T>
void activation_forward(Op op, int64_t n, const T* x, T* y) {
  bool found = false;
  for_each_activation([&]<Op O>() {
    if (op != O) return;
    found = true;
    for_chunks(n, [&](int64_t i0, int64_t i1) { activation_fwd_range<O>(i0, i1, x, y); });
  });
  KILN_CHECK(found, "[activation] {} is not a pointwise activation", op_name(op));
}

template <typename T>
void activation_backward(Op op, int64_t n, const T* x, const T* dy, T* dx) {
  bool found = false;
  for_each_activation([&]<Op O>() {
    if (op != O) return;
    found = true;
    for_chunks(n, [&](int64_t i0, int64_t i1) { activation_bwd_range<O>(i0, i1, x, dy, dx); });
  });
  KILN_CHECK(found, "[activation] {} is not a pointwise activation", op_name(op));
}

template <typename T>
void swiglu_forward(int64_t n, const T* gate, const T* up, T* out) {
  for_chunks(n, [&](int64_t i0, int64_t i1) { swiglu_fwd_range(i0, i1, gate, up, out); });
}

template <typename T>
void swiglu_backward(int64_t n, const T* gate, const T* up, const T* dout, T* dgate, T* dup) {
  for_chunks(n,
             [&](int64_t i0, int64_t i1) { swiglu_bwd_range(i0, i1, gate, up, dout, dgate, dup); });
}

#define KILN_INSTANTIATE(T)                                                  \
  template void activation_forward<T>(Op, int64_t, const T*, T*);            \
  template void activation_backward<T>(Op, int64_t, const T*, const T*, T*); \
  template void swiglu_forward<T>(int64_t, const T*, const T*, T*);          \
  template void swiglu_backward<T>(int64_t, const T*, const T*, const T*, T*, T*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(f16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
