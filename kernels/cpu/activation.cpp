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
  for (int64_t i = i0; i < i1; ++i) y[i] = act::Math<O>::template forward<CpuMath>(x[i]);
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
    out[i] = act::swiglu<CpuMath>(gate[i], up[i]);
  }
}

template <typename T>
KILN_SIMD_CLONES void swiglu_bwd_range(int64_t i0, int64_t i1, const T* gate, const T* up,
                                       const T* dout, T* dgate, T* dup) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    T dg, du;  // all inputs are read before either output is written (outputs may alias)
    act::swiglu_grad<CpuMath>(gate[i], up[i], dout[i], dg, du);
    dgate[i] = dg;
    dup[i] = du;
  }
}

// Runs body(j0, len, in..., out...) of the f32/f64 range kernels over [i0, i1). For 16-bit
// storage the range goes through f32 blocks: `ins` are widened into stack blocks, the f32
// (cloned, vectorized) loop runs on them, and the `outs` blocks are rounded back once.
constexpr int64_t kBlock = 512;

template <typename T, int NIn, int NOut, typename Body>
void through_compute(int64_t i0, int64_t i1, const T* const (&ins)[NIn], T* const (&outs)[NOut],
                     Body&& body) {
  if constexpr (is_half_v<T>) {
    float in_buf[NIn][kBlock], out_buf[NOut][kBlock];
    for (int64_t j0 = i0; j0 < i1; j0 += kBlock) {
      const int64_t len = std::min(kBlock, i1 - j0);
      const float* in_ptr[NIn];
      float* out_ptr[NOut];
      for (int k = 0; k < NIn; ++k) in_ptr[k] = widen(len, ins[k] + j0, in_buf[k]);
      for (int k = 0; k < NOut; ++k) out_ptr[k] = out_buf[k];
      body(len, in_ptr, out_ptr);
      for (int k = 0; k < NOut; ++k) narrow(len, out_ptr[k], outs[k] + j0);
    }
  } else {
    const T* in_ptr[NIn];
    T* out_ptr[NOut];
    for (int k = 0; k < NIn; ++k) in_ptr[k] = ins[k] + i0;
    for (int k = 0; k < NOut; ++k) out_ptr[k] = outs[k] + i0;
    body(i1 - i0, in_ptr, out_ptr);
  }
}

}  // namespace

template <typename T>
void activation_forward(Op op, int64_t n, const T* x, T* y) {
  bool found = false;
  for_each_activation([&]<Op O>() {
    if (op != O) return;
    found = true;
    for_chunks(n, [&](int64_t i0, int64_t i1) {
      through_compute<T, 1, 1>(i0, i1, {x}, {y}, [](int64_t len, auto in, auto out) {
        activation_fwd_range<O>(0, len, in[0], out[0]);
      });
    });
  });
  KILN_CHECK(found, "[activation] {} is not a pointwise activation", op_name(op));
}

template <typename T>
void activation_backward(Op op, int64_t n, const T* x, const T* dy, T* dx) {
  bool found = false;
  for_each_activation([&]<Op O>() {
    if (op != O) return;
    found = true;
    for_chunks(n, [&](int64_t i0, int64_t i1) {
      through_compute<T, 2, 1>(i0, i1, {x, dy}, {dx}, [](int64_t len, auto in, auto out) {
        activation_bwd_range<O>(0, len, in[0], in[1], out[0]);
      });
    });
  });
  KILN_CHECK(found, "[activation] {} is not a pointwise activation", op_name(op));
}

#if KILN_CPU_X86
// out[i0, i1) = silu(gate) up on bf16 with AVX-512: (gate s) up in f32, s = 1 / (1 + e^-gate)
// by exp_fast16, rounded once (the loop through f32 blocks does the same products with
// exp_fast). The bf16 prefill's MLP runs 1.6M of these per layer, where widening, the 8-wide
// cloned loop and narrowing took about 4% of a Qwen3-0.6B prefill.
KILN_TARGET_AVX512 void swiglu_fwd_bf16(int64_t i0, int64_t i1, const bf16* gate, const bf16* up,
                                        bf16* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = i0; i < i1; i += 16) {
    const int count = static_cast<int>(std::min<int64_t>(16, i1 - i));
    const __m512 g = count == 16 ? load_bf16x16(gate + i) : load_bf16x16_partial(gate + i, count);
    const __m512 u = count == 16 ? load_bf16x16(up + i) : load_bf16x16_partial(up + i, count);
    const __m512 s = _mm512_div_ps(
        one, _mm512_add_ps(one, detail::exp_fast16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(g, s), u);
    if (count == 16)
      store_bf16x16(out + i, y);
    else
      store_bf16x16_partial(out + i, y, count);
  }
}
#endif

template <typename T>
void swiglu_forward(int64_t n, const T* gate, const T* up, T* out) {
#if KILN_CPU_X86
  if constexpr (std::is_same_v<T, bf16>) {
    if (cpu_has(CpuIsa::Avx512))
      return for_chunks(n, [&](int64_t i0, int64_t i1) { swiglu_fwd_bf16(i0, i1, gate, up, out); });
  }
#endif
  for_chunks(n, [&](int64_t i0, int64_t i1) {
    through_compute<T, 2, 1>(i0, i1, {gate, up}, {out}, [](int64_t len, auto in, auto o) {
      swiglu_fwd_range(0, len, in[0], in[1], o[0]);
    });
  });
}

template <typename T>
void swiglu_backward(int64_t n, const T* gate, const T* up, const T* dout, T* dgate, T* dup) {
  for_chunks(n, [&](int64_t i0, int64_t i1) {
    through_compute<T, 3, 2>(i0, i1, {gate, up, dout}, {dgate, dup},
                             [](int64_t len, auto in, auto o) {
                               swiglu_bwd_range(0, len, in[0], in[1], in[2], o[0], o[1]);
                             });
  });
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
