// Elementwise kernels (math in elementwise.h, matching kernels/cpu/elementwise.h).
//
// Two generic kernels run every op: map1 (one input) and map2 (two inputs), each as
//   - flat:    operands dense in logical order; packs of N elements (N * sizeof = 16 bytes for
//              the widest type) when every pointer is aligned, then a scalar tail; and
//   - strided: logical index -> per-operand offsets through the collapsed plan.
// The op is a functor on f32 values; binary and unary pick their op with a switch on a
// kernel argument (uniform across the grid, so it costs a few instructions per element in a
// memory-bound loop and saves 6x/10x the kernel instantiations).
// a, b, x: (numel) logical, any strides; out, y: (numel) contiguous.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// ---- ops on f32 values ----------------------------------------------------------------------

struct BinaryF {
  BinaryOp op;
  __device__ __forceinline__ float operator()(float a, float b) const {
    switch (op) {
      case BinaryOp::Add:
        return __fadd_rn(a, b);
      case BinaryOp::Sub:
        return __fsub_rn(a, b);
      case BinaryOp::Mul:
        return __fmul_rn(a, b);
      case BinaryOp::Div:
        return __fdiv_rn(a, b);
      case BinaryOp::Max:
        return (a != a || a > b) ? a : b;  // NaN in either gives NaN
      case BinaryOp::Min:
        return (a != a || a < b) ? a : b;
    }
    return 0.f;
  }
};

struct UnaryF {
  UnaryOp op;
  __device__ __forceinline__ float operator()(float v) const {
    switch (op) {
      case UnaryOp::Neg:
        return -v;
      case UnaryOp::Exp:
        return expf(v);
      case UnaryOp::Log:
        return logf(v);
      case UnaryOp::Sqrt:
        return __fsqrt_rn(v);
      case UnaryOp::Rsqrt:
        return __fdiv_rn(1.0f, __fsqrt_rn(v));  // as the CPU: 1 / sqrt(v)
      case UnaryOp::Abs:
        return fabsf(v);
      case UnaryOp::Square:
        return __fmul_rn(v, v);
      case UnaryOp::Reciprocal:
        return __fdiv_rn(1.0f, v);
      case UnaryOp::Tanh:
        return tanhf(v);
      case UnaryOp::Sigmoid:
        return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v)));
    }
    return 0.f;
  }
};

struct AffineF {
  float alpha, beta;
  bool add_beta;
  __device__ __forceinline__ float operator()(float v) const {
    const float r = __fmul_rn(v, alpha);
    return add_beta ? __fadd_rn(r, beta) : r;
  }
};

struct ScaleF {
  float alpha;
  __device__ __forceinline__ float operator()(float v) const { return __fmul_rn(v, alpha); }
};

struct AxpyF {  // (y, x) -> y + alpha * x
  float alpha;
  __device__ __forceinline__ float operator()(float y, float x) const {
    return __fadd_rn(y, __fmul_rn(alpha, x));
  }
};

// ---- generic kernels ------------------------------------------------------------------------

// x, out: (n) dense. N > 1: x and out aligned to N elements.
template <int N, typename Ti, typename To, typename F>
__global__ void map1_flat_kernel(std::int64_t n, const Ti* x, To* out, F f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t npacks = n / N;
  for (std::int64_t p = tid; p < npacks; p += stride) {
    const Vec<Ti, N> vx = reinterpret_cast<const Vec<Ti, N>*>(x)[p];
    Vec<To, N> vo;
#pragma unroll
    for (int k = 0; k < N; ++k) vo.v[k] = store<To>(f(load(vx.v[k])));
    reinterpret_cast<Vec<To, N>*>(out)[p] = vo;
  }
  for (std::int64_t i = npacks * N + tid; i < n; i += stride) out[i] = store<To>(f(load(x[i])));
}

// out[i] = f(x[off0(i)]); out: (numel) contiguous.
template <typename Idx, typename Ti, typename To, typename F>
__global__ void map1_strided_kernel(IndexPlan<Idx> p, const Ti* x, To* out, F f) {
  const Idx stride = static_cast<Idx>(gridDim.x) * blockDim.x;
  for (Idx i = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel; i += stride) {
    Idx off[1];
    plan_offsets<1>(p, i, off);
    out[i] = store<To>(f(load(x[off[0]])));
  }
}

// a, b, out: (n) dense. N > 1: all aligned to N elements.
template <int N, typename Ta, typename Tb, typename To, typename F>
__global__ void map2_flat_kernel(std::int64_t n, const Ta* a, const Tb* b, To* out, F f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t npacks = n / N;
  for (std::int64_t p = tid; p < npacks; p += stride) {
    const Vec<Ta, N> va = reinterpret_cast<const Vec<Ta, N>*>(a)[p];
    const Vec<Tb, N> vb = reinterpret_cast<const Vec<Tb, N>*>(b)[p];
    Vec<To, N> vo;
#pragma unroll
    for (int k = 0; k < N; ++k) vo.v[k] = store<To>(f(load(va.v[k]), load(vb.v[k])));
    reinterpret_cast<Vec<To, N>*>(out)[p] = vo;
  }
  for (std::int64_t i = npacks * N + tid; i < n; i += stride)
    out[i] = store<To>(f(load(a[i]), load(b[i])));
}

// out[i] = f(a[off0(i)], b[off1(i)]); out: (numel) contiguous.
template <typename Idx, typename Ta, typename Tb, typename To, typename F>
__global__ void map2_strided_kernel(IndexPlan<Idx> p, const Ta* a, const Tb* b, To* out, F f) {
  const Idx stride = static_cast<Idx>(gridDim.x) * blockDim.x;
  for (Idx i = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel; i += stride) {
    Idx off[2];
    plan_offsets<2>(p, i, off);
    out[i] = store<To>(f(load(a[off[0]]), load(b[off[1]])));
  }
}

bool aligned_to(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

template <typename Ti, typename To, typename F>
void launch_map1(const char* op, const StridedPlan& plan, const Ti* x, To* out, F f,
                 StreamHandle stream) {
  KILN_CHECK(plan.nops >= 1, "[{}] the plan has no operand", op);
  const std::int64_t n = plan.numel;
  if (n == 0) return;
  if (plan_is_dense(plan, 0)) {
    constexpr int N = 16 / (sizeof(Ti) > sizeof(To) ? sizeof(Ti) : sizeof(To));
    if (aligned_to(x, sizeof(Ti) * N) && aligned_to(out, sizeof(To) * N)) {
      map1_flat_kernel<N, Ti, To, F>
          <<<grid_for(ceil_div(n, N), kThreads), kThreads, 0, stream>>>(n, x, out, f);
    } else {
      map1_flat_kernel<1, Ti, To, F><<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, x, out, f);
    }
    KILN_CUDA_CHECK_LAUNCH();
  } else if (plan_fits_u32(plan)) {
    map1_strided_kernel<std::uint32_t, Ti, To, F><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        to_index_plan<std::uint32_t>(plan), x, out, f);
    KILN_CUDA_CHECK_LAUNCH();
  } else {
    map1_strided_kernel<std::int64_t, Ti, To, F><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        to_index_plan<std::int64_t>(plan), x, out, f);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

template <typename Ta, typename Tb, typename To, typename F>
void launch_map2(const char* op, const StridedPlan& plan, const Ta* a, const Tb* b, To* out, F f,
                 StreamHandle stream) {
  KILN_CHECK(plan.nops == 2, "[{}] the plan needs two operands", op);
  const std::int64_t n = plan.numel;
  if (n == 0) return;
  if (plan_is_dense(plan, 0) && plan_is_dense(plan, 1)) {
    constexpr std::size_t kWidest = sizeof(Ta) > sizeof(Tb)
                                        ? (sizeof(Ta) > sizeof(To) ? sizeof(Ta) : sizeof(To))
                                        : (sizeof(Tb) > sizeof(To) ? sizeof(Tb) : sizeof(To));
    constexpr int N = static_cast<int>(16 / kWidest);
    if (aligned_to(a, sizeof(Ta) * N) && aligned_to(b, sizeof(Tb) * N) &&
        aligned_to(out, sizeof(To) * N)) {
      map2_flat_kernel<N, Ta, Tb, To, F>
          <<<grid_for(ceil_div(n, N), kThreads), kThreads, 0, stream>>>(n, a, b, out, f);
    } else {
      map2_flat_kernel<1, Ta, Tb, To, F>
          <<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, a, b, out, f);
    }
    KILN_CUDA_CHECK_LAUNCH();
  } else if (plan_fits_u32(plan)) {
    map2_strided_kernel<std::uint32_t, Ta, Tb, To, F>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(to_index_plan<std::uint32_t>(plan), a, b,
                                                         out, f);
    KILN_CUDA_CHECK_LAUNCH();
  } else {
    map2_strided_kernel<std::int64_t, Ta, Tb, To, F>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(to_index_plan<std::int64_t>(plan), a, b,
                                                         out, f);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

template <typename T>
void binary(BinaryOp op, const StridedPlan& plan, const T* a, const T* b, T* out,
            StreamHandle stream) {
  KILN_CHECK(static_cast<int>(op) >= 0 && static_cast<int>(op) <= static_cast<int>(BinaryOp::Min),
             "[binary] unknown op {}", static_cast<int>(op));
  launch_map2("binary", plan, a, b, out, BinaryF{op}, stream);
}

template <typename T>
void unary(UnaryOp op, const StridedPlan& plan, const T* x, T* out, StreamHandle stream) {
  KILN_CHECK(
      static_cast<int>(op) >= 0 && static_cast<int>(op) <= static_cast<int>(UnaryOp::Sigmoid),
      "[unary] unknown op {}", static_cast<int>(op));
  launch_map1("unary", plan, x, out, UnaryF{op}, stream);
}

template <typename T>
void affine(const StridedPlan& plan, const T* x, float alpha, float beta, T* out,
            StreamHandle stream) {
  launch_map1("affine", plan, x, out, AffineF{alpha, beta, beta != 0.0f}, stream);
}

template <typename Ty, typename Tx>
void axpy(const StridedPlan& plan, float alpha, const Tx* x, Ty* y, StreamHandle stream) {
  // y is contiguous (the caller checks), so its plan offsets are the logical index itself, even
  // where a strided x keeps the plan from collapsing to one dim.
  KILN_CHECK(plan.nops == 2, "[axpy] the plan needs y and x");
  launch_map2("axpy", plan, static_cast<const Ty*>(y), x, y, AxpyF{alpha}, stream);
}

template <typename T>
void scale(std::int64_t n, float alpha, T* y, StreamHandle stream) {
  KILN_CHECK(n >= 0, "[scale] negative size {}", n);
  StridedPlan plan;  // y: (n) dense
  plan.numel = n;
  plan.ndim = n == 1 ? 0 : 1;
  plan.shape[0] = n;
  plan.stride[0][0] = 1;
  launch_map1("scale", plan, static_cast<const T*>(y), y, ScaleF{alpha}, stream);
}

#define KILN_CUDA_ELEMENTWISE_INST(T)                                                          \
  template void binary<T>(BinaryOp, const StridedPlan&, const T*, const T*, T*, StreamHandle); \
  template void unary<T>(UnaryOp, const StridedPlan&, const T*, T*, StreamHandle);             \
  template void affine<T>(const StridedPlan&, const T*, float, float, T*, StreamHandle);       \
  template void scale<T>(std::int64_t, float, T*, StreamHandle);                               \
  template void axpy<T, float>(const StridedPlan&, float, const float*, T*, StreamHandle);     \
  template void axpy<T, bf16>(const StridedPlan&, float, const bf16*, T*, StreamHandle);       \
  template void axpy<T, f16>(const StridedPlan&, float, const f16*, T*, StreamHandle);
KILN_CUDA_ELEMENTWISE_INST(float)
KILN_CUDA_ELEMENTWISE_INST(bf16)
KILN_CUDA_ELEMENTWISE_INST(f16)
#undef KILN_CUDA_ELEMENTWISE_INST

}  // namespace kiln::cuda
