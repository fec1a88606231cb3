// Pointwise activations (the math: kernels/common/activation_math.h, shared with the CPU).
//
// One kernel template runs every op: a grid-stride loop over 16-byte packs (N elements) when all
// pointers are aligned, then a scalar loop over the n % N tail. Each op is a functor mapping
// NIN input floats to NOUT output floats; loads widen to f32, stores round once to T.
// x, y, dy, dx, gate, up, dout, dgate, dup: (n) contiguous.
#include <cmath>

#include "kernels/common/activation_math.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename P, int K>
struct Ptrs {
  P p[K];
};

// The exp, tanh and erf the shared formulas (kernels/common/activation_math.h) use on CUDA.
struct CudaMath {
  __device__ static float exp(float x) { return expf(x); }
  __device__ static float tanh(float x) { return tanhf(x); }
  __device__ static float erf(float x) { return erff(x); }
};

template <Op O>
struct ActivationFwd {
  __device__ void operator()(const float (&in)[1], float (&out)[1]) const {
    out[0] = act::Math<O>::template forward<CudaMath>(in[0]);
  }
};
template <Op O>
struct ActivationBwd {  // in: x, dy
  __device__ void operator()(const float (&in)[2], float (&out)[1]) const {
    out[0] = act::Math<O>::template grad<CudaMath>(in[0], in[1]);
  }
};
struct SwigluFwd {  // in: gate, up
  __device__ void operator()(const float (&in)[2], float (&out)[1]) const {
    out[0] = act::swiglu<CudaMath>(in[0], in[1]);
  }
};
struct SwigluBwd {  // in: gate, up, dout; out: dgate, dup
  __device__ void operator()(const float (&in)[3], float (&out)[2]) const {
    act::swiglu_grad<CudaMath>(in[0], in[1], in[2], out[0], out[1]);
  }
};

// Elements [0, n): packs of N first (all pointers 16-byte aligned when N > 1), then the tail.
template <int N, typename T, int NIN, int NOUT, typename F>
__global__ void pointwise_kernel(std::int64_t n, Ptrs<const T*, NIN> in, Ptrs<T*, NOUT> out, F f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t npacks = N > 1 ? n / N : 0;
  for (std::int64_t p = tid; p < npacks; p += stride) {
    Pack<T, N> a[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) a[k] = reinterpret_cast<const Pack<T, N>*>(in.p[k])[p];
    Pack<T, N> b[NOUT];
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float xi[NIN], yo[NOUT];
#pragma unroll
      for (int k = 0; k < NIN; ++k) xi[k] = load(a[k].v[e]);
      f(xi, yo);
#pragma unroll
      for (int k = 0; k < NOUT; ++k) b[k].v[e] = store<T>(yo[k]);
    }
#pragma unroll
    for (int k = 0; k < NOUT; ++k) reinterpret_cast<Pack<T, N>*>(out.p[k])[p] = b[k];
  }
  for (std::int64_t i = npacks * N + tid; i < n; i += stride) {
    float xi[NIN], yo[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; ++k) xi[k] = load(in.p[k][i]);
    f(xi, yo);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) out.p[k][i] = store<T>(yo[k]);
  }
}

template <typename T, int NIN, int NOUT, typename F>
void launch_pointwise(const char* op, std::int64_t n, Ptrs<const T*, NIN> in, Ptrs<T*, NOUT> out,
                      F f, StreamHandle stream) {
  KILN_CHECK(n >= 0, "[{}] negative size {}", op, n);
  if (n == 0) return;
  constexpr int kPack = 16 / sizeof(T);
  bool vec = true;
  for (int k = 0; k < NIN; ++k) vec = vec && aligned16({in.p[k]});
  for (int k = 0; k < NOUT; ++k) vec = vec && aligned16({out.p[k]});
  if (vec && n >= kPack) {
    const unsigned blocks = grid_for(ceil_div(n, kPack), kThreads);
    pointwise_kernel<kPack><<<blocks, kThreads, 0, stream>>>(n, in, out, f);
  } else {
    const unsigned blocks = grid_for(n, kThreads);
    pointwise_kernel<1><<<blocks, kThreads, 0, stream>>>(n, in, out, f);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void activation_forward(Op op, std::int64_t n, const T* x, T* y, StreamHandle stream) {
  bool found = false;
  for_each_activation([&]<Op O>() {
    if (op != O) return;
    found = true;
    launch_pointwise<T, 1, 1>(op_name(O).data(), n, {{x}}, {{y}}, ActivationFwd<O>{}, stream);
  });
  KILN_CHECK(found, "[activation] {} is not a pointwise activation", op_name(op));
}
template <typename T>
void activation_backward(Op op, std::int64_t n, const T* x, const T* dy, T* dx,
                         StreamHandle stream) {
  bool found = false;
  for_each_activation([&]<Op O>() {
    if (op != O) return;
    found = true;
    launch_pointwise<T, 2, 1>(op_backward_name(O).data(), n, {{x, dy}}, {{dx}}, ActivationBwd<O>{},
                              stream);
  });
  KILN_CHECK(found, "[activation] {} is not a pointwise activation", op_name(op));
}
template <typename T>
void swiglu_forward(std::int64_t n, const T* gate, const T* up, T* out, StreamHandle stream) {
  launch_pointwise<T, 2, 1>("swiglu", n, {{gate, up}}, {{out}}, SwigluFwd{}, stream);
}
template <typename T>
void swiglu_backward(std::int64_t n, const T* gate, const T* up, const T* dout, T* dgate, T* dup,
                     StreamHandle stream) {
  launch_pointwise<T, 3, 2>("swiglu_backward", n, {{gate, up, dout}}, {{dgate, dup}}, SwigluBwd{},
                            stream);
}

#define KILN_INSTANTIATE(T)                                                                     \
  template void activation_forward<T>(Op, std::int64_t, const T*, T*, StreamHandle);            \
  template void activation_backward<T>(Op, std::int64_t, const T*, const T*, T*, StreamHandle); \
  template void swiglu_forward<T>(std::int64_t, const T*, const T*, T*, StreamHandle);          \
  template void swiglu_backward<T>(std::int64_t, const T*, const T*, const T*, T*, T*,          \
                                   StreamHandle);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(f16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
