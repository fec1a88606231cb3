// The scalar math of the pointwise activations, written once for the CPU kernels
// (kernels/cpu/activation.cpp) and the CUDA kernels (kernels/cuda/activation.cu). Each backend
// supplies exp / tanh / erf through a policy M (CPU: the vectorizable exp_fast; CUDA: expf,
// tanhf, erff), so the formulas and their evaluation order are the same on both.
//
//   silu:   y = x s, s = sigmoid(x)                 dx = dy s (1 + x (1 - s))
//   gelu_tanh: y = 0.5 x (1 + t),                   dx = dy (0.5 (1 + t) + 0.5 x (1 - t^2) u'),
//           t = tanh(u), u = c (x + a x^3),         u' = c (1 + 3 a x^2)
//           c = sqrt(2/pi), a = 0.044715 (HF gelu_pytorch_tanh)
//   gelu:   y = x Phi(x),                           dx = dy (Phi(x) + x phi(x)),
//           Phi(x) = 0.5 (1 + erf(x / sqrt 2)),     phi(x) = exp(-x^2 / 2) / sqrt(2 pi) (HF gelu)
//   swiglu: out = silu(gate) up                     dgate = dout up s (1 + gate (1 - s)),
//                                                   dup = dout silu(gate)
#pragma once

#include "kernels/common/half.h"  // KILN_HOST_DEVICE
#include "kernels/op_list.h"

namespace kiln::act {

template <class T>
inline constexpr T kGeluC = T(0.7978845608028654);  // sqrt(2/pi)
template <class T>
inline constexpr T kGeluA = T(0.044715);
template <class T>
inline constexpr T kInvSqrt2 = T(0.7071067811865476);  // 1/sqrt(2)
template <class T>
inline constexpr T kInvSqrt2Pi = T(0.3989422804014327);  // 1/sqrt(2 pi)

template <class M, class T>
KILN_HOST_DEVICE inline T sigmoid(T x) {
  return T(1) / (T(1) + M::exp(-x));
}

// The pointwise activations of kernels/op_list.h (kActivations): forward(x) and grad(x, dy).
template <Op O>
struct Math;

template <>
struct Math<Op::Silu> {
  template <class M, class T>
  KILN_HOST_DEVICE static T forward(T x) {
    return x * sigmoid<M>(x);
  }
  template <class M, class T>
  KILN_HOST_DEVICE static T grad(T x, T dy) {
    const T s = sigmoid<M>(x);
    return dy * s * (T(1) + x * (T(1) - s));
  }
};

template <>
struct Math<Op::GeluTanh> {  // tanh approximation
  template <class M, class T>
  KILN_HOST_DEVICE static T forward(T x) {
    const T t = M::tanh(kGeluC<T> * (x + kGeluA<T> * x * x * x));
    return T(0.5) * x * (T(1) + t);
  }
  template <class M, class T>
  KILN_HOST_DEVICE static T grad(T x, T dy) {
    const T x2 = x * x;
    const T t = M::tanh(kGeluC<T> * (x + kGeluA<T> * x2 * x));
    const T du = kGeluC<T> * (T(1) + T(3) * kGeluA<T> * x2);
    return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
};

template <>
struct Math<Op::Gelu> {  // exact (erf)
  template <class M, class T>
  KILN_HOST_DEVICE static T forward(T x) {
    return x * (T(0.5) * (T(1) + M::erf(x * kInvSqrt2<T>)));
  }
  template <class M, class T>
  KILN_HOST_DEVICE static T grad(T x, T dy) {
    const T cdf = T(0.5) * (T(1) + M::erf(x * kInvSqrt2<T>));
    return dy * (cdf + x * kInvSqrt2Pi<T> * M::exp(T(-0.5) * x * x));
  }
};

template <class M, class T>
KILN_HOST_DEVICE inline T swiglu(T gate, T up) {
  return gate * sigmoid<M>(gate) * up;
}
// dgate and dup of out = silu(gate) * up.
template <class M, class T>
KILN_HOST_DEVICE inline void swiglu_grad(T gate, T up, T dout, T& dgate, T& dup) {
  const T s = sigmoid<M>(gate);
  dgate = dout * up * s * (T(1) + gate * (T(1) - s));
  dup = dout * gate * s;
}

}  // namespace kiln::act
