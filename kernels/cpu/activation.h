// Pointwise activations, CPU: the activations of kernels/op_list.h (kActivations) and SwiGLU,
// with the math of kernels/common/activation_math.h. All arrays contiguous, n elements;
// outputs may alias inputs. T is the storage type (float, double, bf16, f16); the math runs in
// compute_t<T> (f32 for the 16-bit types, kernels/cpu/bf16_util.h), each output rounded once.
//
// Every kernel writes (=) its outputs; none accumulates.
//
// Also home of exp_fast(), the vectorizable exp that the softmax-like kernels (attention,
// cross-entropy) share: glibc's expf is only vectorized under -ffast-math, and exp is the
// dominant cost of a causal softmax over T^2 scores with head_dim 32-48.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/op_list.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

// KILN_SIMD_CLONES on a function compiles it twice, for AVX2+FMA (x86-64-v3) and for the
// baseline, and picks one at load time (GCC ifunc). The library is built for plain x86-64 unless
// KILN_NATIVE is set, and exp-heavy loops run ~3x faster with 8-wide FMA. Put it on the
// functions that hold the hot loops, not on functions with OpenMP regions (the outlined region
// bodies would not be cloned).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define KILN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KILN_SIMD_CLONES
#endif

namespace kiln::cpu {

// y = act(x) and dx = dy act'(x) for a pointwise activation op (kernels/op_list.h:
// kActivations; the math in kernels/common/activation_math.h).
template <typename T>
void activation_forward(Op op, int64_t n, const T* x, T* y);
template <typename T>
void activation_backward(Op op, int64_t n, const T* x, const T* dy, T* dx);

template <typename T>
void silu_forward(int64_t n, const T* x, T* y) {
  activation_forward(Op::Silu, n, x, y);
}
template <typename T>
void silu_backward(int64_t n, const T* x, const T* dy, T* dx) {
  activation_backward(Op::Silu, n, x, dy, dx);
}

template <typename T>
void swiglu_forward(int64_t n, const T* gate, const T* up, T* out);
template <typename T>
void swiglu_backward(int64_t n, const T* gate, const T* up, const T* dout, T* dgate, T* dup);

namespace detail {

// exp(x) for float in plain arithmetic so loops (with `#pragma omp simd` where they reduce)
// vectorize it. Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r, 2^n
// built in the exponent bits. Measured max relative error 8e-8 (< 1 ulp) on [-87, 88].
// x < -87 gives 0 (also -inf), x > 88.3 gives +inf, NaN stays NaN.
// No clamps or branches on x: GCC constant-folds a clamped path, splits the loop body and
// then refuses to vectorize it (float ops may trap); out-of-range lanes are fixed up with
// integer masks at the end instead.
inline float exp_fast(float x) {
  const float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;                                   // round(x / ln2)
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2, ln2 = hi + lo
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // t's low mantissa bits hold n (t = 1.5*2^23 + n); build 2^n as float bits (n + 127) << 23.
  const uint32_t biased = static_cast<uint32_t>(std::bit_cast<int32_t>(t) - 0x4B400000 + 127);
  const float y = p * std::bit_cast<float>(static_cast<int32_t>(biased << 23));
  const int32_t keep_lo = x < -87.0f ? 0 : -1;
  const int32_t keep_hi = x > 88.3f ? 0 : -1;
  const int32_t inf_bits = x > 88.3f ? 0x7f800000 : 0;
  return std::bit_cast<float>((std::bit_cast<int32_t>(y) & keep_lo & keep_hi) | inf_bits);
}
inline double exp_fast(double x) { return std::exp(x); }

#if KILN_CPU_X86
// exp_fast in 16 lanes for kernels written with AVX-512 intrinsics: the same reduction and
// polynomial, 2^n by vscalefps. x is clamped to [-104, 89] first (NaN passes through): below
// about -87.3 the result is a subnormal or 0 (exp_fast: 0), above 88.73 +inf.
KILN_TARGET_AVX512 inline __m512 exp_fast16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c :
       {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
#endif

}  // namespace detail
}  // namespace kiln::cpu
