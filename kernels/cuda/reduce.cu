// Reductions (math in reduce.h, matching kernels/cpu/reduce.h). x: (outer, n, inner) logical,
// any strides through the ReducePlan; out: (outer, inner) contiguous.
//
// Every kernel is generic over a policy P (Acc type, identity, take(value, d), combine) and a
// writer W for the final value, so sum/mean/max/min and argmax share the layouts:
//   - rows (inner == 1): a warp per row for n < 1024, else a block per row; lanes stride over d,
//     then a shuffle tree (and a 32-slot shared tree for blocks).
//   - columns (inner > 1): a (32, TY) block per (o, 32 consecutive j): lane x owns column j,
//     lanes y stride over d (coalesced rows of 32 j), then lane y == 0 combines the TY partials in
//     order y = 0..TY-1 through shared memory.
//   - whole tensor (sum_all, sum_squares, and reduce with outer == inner == 1 and a long n): two
//     passes. Pass 1: G <= 1024 blocks, thread t of block b takes d = b*256 + t + k*G*256 and the
//     block's result goes to slot b of a __device__ buffer; pass 2: one block combines the G slots.
//     G depends only on n.
// Each thread's share of d and the combine trees are fixed by the sizes, so results are
// deterministic run to run. Block sizes are multiples of 32, at most 1024 threads; grids are
// capped and every kernel loops (grid-stride) over the rest.
#include <cfloat>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxPartials = 1024;  // pass-1 blocks of a whole-tensor reduction
constexpr int kPass1Threads = 256;
constexpr std::int64_t kTwoPassMinN = 65536;    // whole-vector reduce below this: one block
constexpr std::int64_t kMaxGrid = 65535LL * 8;  // blocks launched; kernels loop over the rest

// The module's own scratch for two-pass reductions: no allocation, and safe because every
// kernel runs in order on the legacy default stream.
__device__ float g_partial_f[kMaxPartials];
__device__ double g_partial_d[kMaxPartials];
__device__ double g_sum_squares;

// ---- policies ---------------------------------------------------------------------------------

__device__ __forceinline__ float max_nan(float a, float b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ float min_nan(float a, float b) { return (a != a || a < b) ? a : b; }

struct SumP {
  using Acc = float;
  __device__ static Acc identity() { return 0.f; }
  __device__ static Acc take(float v, std::int64_t) { return v; }
  __device__ static Acc combine(Acc a, Acc b) { return a + b; }
};
struct MaxP {
  using Acc = float;
  __device__ static Acc identity() { return -INFINITY; }
  __device__ static Acc take(float v, std::int64_t) { return v; }
  __device__ static Acc combine(Acc a, Acc b) { return max_nan(a, b); }
};
struct MinP {
  using Acc = float;
  __device__ static Acc identity() { return INFINITY; }
  __device__ static Acc take(float v, std::int64_t) { return v; }
  __device__ static Acc combine(Acc a, Acc b) { return min_nan(a, b); }
};
// Squares of floats are exact in double; sums stay in double.
struct SumSqP {
  using Acc = double;
  __device__ static Acc identity() { return 0.0; }
  __device__ static Acc take(float v, std::int64_t) { return double(v) * double(v); }
  __device__ static Acc combine(Acc a, Acc b) { return a + b; }
};

struct ArgAcc {
  float v;
  std::int64_t i;
};
// The first maximum: a NaN beats any number (the first NaN wins), a larger value beats a smaller
// one, and equal values keep the smaller index. Commutative and associative, so any tree agrees
// with the CPU's left-to-right scan.
struct ArgMaxP {
  using Acc = ArgAcc;
  __device__ static Acc identity() { return {-INFINITY, INT64_MAX}; }
  __device__ static Acc take(float v, std::int64_t d) { return {v, d}; }
  __device__ static Acc combine(Acc a, Acc b) {
    const bool na = a.v != a.v, nb = b.v != b.v;
    const bool take_b = nb ? (!na || b.i < a.i) : (!na && (b.v > a.v || (b.v == a.v && b.i < a.i)));
    return take_b ? b : a;
  }
};

__device__ __forceinline__ float shfl_xor(float v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ double shfl_xor(double v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ ArgAcc shfl_xor(ArgAcc a, int o) {
  return {__shfl_xor_sync(0xffffffffu, a.v, o),
          static_cast<std::int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(a.i), o))};
}

// All 32 lanes must call; every lane gets the result.
template <typename P>
__device__ __forceinline__ typename P::Acc warp_reduce(typename P::Acc v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = P::combine(v, shfl_xor(v, o));
  return v;
}

// 1-D blocks (blockDim.x a multiple of 32); every thread must call; every thread gets the result.
// Two __syncthreads, so it may be called repeatedly.
template <typename P>
__device__ typename P::Acc block_reduce(typename P::Acc v) {
  using Acc = typename P::Acc;
  __shared__ Acc partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_reduce<P>(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : P::identity();
  return warp_reduce<P>(v);
}

// ---- writers ----------------------------------------------------------------------------------

template <typename T>
struct ValueW {  // out[idx] = acc (/ n for mean)
  T* out;
  float n;
  bool mean;
  __device__ void operator()(std::int64_t idx, float acc) const {
    out[idx] = store<T>(mean ? __fdiv_rn(acc, n) : acc);
  }
};
struct IndexW {
  std::int64_t* out;
  __device__ void operator()(std::int64_t idx, ArgAcc acc) const { out[idx] = acc.i; }
};
struct SumSqW {
  __device__ void operator()(std::int64_t, double acc) const { g_sum_squares = acc; }
};

// ---- kernels ----------------------------------------------------------------------------------

// inner == 1; block (32, kWarpRows): warp y takes rows blockIdx.x*kWarpRows + y + k*grid.
constexpr int kWarpRows = 8;
template <typename T, typename P, typename W>
__global__ void rows_warp_kernel(ReducePlan p, const T* __restrict__ x, W w) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kWarpRows;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpRows + threadIdx.y;
       row < p.outer; row += step) {
    const T* xr = x + group_offset(p.outer_dims, row);
    typename P::Acc acc = P::identity();
    for (std::int64_t d = threadIdx.x; d < p.n; d += 32)
      acc = P::combine(acc, P::take(load(xr[d * p.n_stride]), d));
    acc = warp_reduce<P>(acc);
    if (threadIdx.x == 0) w(row, acc);
  }
}

// inner == 1; one 1-D block per row (grid-stride over rows).
template <typename T, typename P, typename W>
__global__ void rows_block_kernel(ReducePlan p, const T* __restrict__ x, W w) {
  for (std::int64_t row = blockIdx.x; row < p.outer; row += gridDim.x) {
    const T* xr = x + group_offset(p.outer_dims, row);
    typename P::Acc acc = P::identity();
    for (std::int64_t d = threadIdx.x; d < p.n; d += blockDim.x)
      acc = P::combine(acc, P::take(load(xr[d * p.n_stride]), d));
    acc = block_reduce<P>(acc);
    if (threadIdx.x == 0) w(row, acc);
  }
}

// inner > 1; block (32, blockDim.y <= 32) per (o, 32 columns), grid-stride over those tiles.
template <typename T, typename P, typename W>
__global__ void cols_kernel(ReducePlan p, const T* __restrict__ x, W w) {
  using Acc = typename P::Acc;
  __shared__ Acc part[32][33];
  const std::int64_t jblocks = (p.inner + 31) / 32;
  const std::int64_t tiles = p.outer * jblocks;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t o = t / jblocks;
    const std::int64_t j = (t % jblocks) * 32 + threadIdx.x;
    Acc acc = P::identity();
    if (j < p.inner) {
      const T* xc = x + group_offset(p.outer_dims, o) + group_offset(p.inner_dims, j);
      for (std::int64_t d = threadIdx.y; d < p.n; d += blockDim.y)
        acc = P::combine(acc, P::take(load(xc[d * p.n_stride]), d));
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < p.inner) {
      Acc r = part[0][threadIdx.x];
      for (int y = 1; y < static_cast<int>(blockDim.y); ++y)
        r = P::combine(r, part[y][threadIdx.x]);
      w(o * p.inner + j, r);
    }
    __syncthreads();  // part[] is rewritten by the next tile
  }
}

template <typename Acc>
__device__ __forceinline__ Acc* partial_buffer();
template <>
__device__ __forceinline__ float* partial_buffer<float>() {
  return g_partial_f;
}
template <>
__device__ __forceinline__ double* partial_buffer<double>() {
  return g_partial_d;
}

// Whole-tensor pass 1: x has n logical elements at group_offset(g, d) (d itself when kDense).
// gridDim.x <= kMaxPartials blocks of kPass1Threads.
template <typename T, typename P, bool kDense>
__global__ void pass1_kernel(std::int64_t n, DimGroup g, const T* __restrict__ x) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  typename P::Acc acc = P::identity();
  for (std::int64_t d = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; d < n;
       d += step) {
    const std::int64_t off = kDense ? d : group_offset(g, d);
    acc = P::combine(acc, P::take(load(x[off]), d));
  }
  acc = block_reduce<P>(acc);
  if (threadIdx.x == 0) partial_buffer<typename P::Acc>()[blockIdx.x] = acc;
}

// Pass 2: one block of kMaxPartials threads combines the `parts` slots and writes w(0, result).
template <typename P, typename W>
__global__ void pass2_kernel(int parts, W w) {
  typename P::Acc v = P::identity();
  if (static_cast<int>(threadIdx.x) < parts) v = partial_buffer<typename P::Acc>()[threadIdx.x];
  v = block_reduce<P>(v);
  if (threadIdx.x == 0) w(0, v);
}

// ---- host-side launch helpers -----------------------------------------------------------------

unsigned capped_grid(std::int64_t blocks) {
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxGrid ? kMaxGrid : blocks));
}

// The (outer, n, inner) layouts; P::Acc is what W receives.
template <typename T, typename P, typename W>
void launch_plan(const ReducePlan& p, const T* x, W w, StreamHandle stream) {
  if (p.inner == 1) {
    if (p.n < 1024) {
      rows_warp_kernel<T, P, W>
          <<<capped_grid(ceil_div(p.outer, kWarpRows)), dim3(32, kWarpRows), 0, stream>>>(p, x, w);
    } else {
      const int threads = p.n >= 16384 ? 1024 : 256;
      rows_block_kernel<T, P, W><<<capped_grid(p.outer), threads, 0, stream>>>(p, x, w);
    }
  } else {
    const std::int64_t tiles = p.outer * ceil_div(p.inner, 32);
    // Few tiles: more lanes along n so the GPU fills up; many tiles: smaller blocks.
    const int ty = tiles < 264 ? 32 : 8;
    cols_kernel<T, P, W><<<capped_grid(tiles), dim3(32, ty), 0, stream>>>(p, x, w);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

int pass1_blocks(std::int64_t n) {
  const std::int64_t b = ceil_div(n, kPass1Threads * 8);
  return static_cast<int>(b < 1 ? 1 : (b > kMaxPartials ? kMaxPartials : b));
}

// Two passes over n elements at group_offset(g, d) (dense when g is null).
template <typename T, typename P, typename W>
void launch_two_pass(std::int64_t n, const DimGroup* g, const T* x, W w, StreamHandle stream) {
  const int blocks = pass1_blocks(n);
  if (g == nullptr) {
    pass1_kernel<T, P, true><<<blocks, kPass1Threads, 0, stream>>>(n, DimGroup{}, x);
  } else {
    pass1_kernel<T, P, false><<<blocks, kPass1Threads, 0, stream>>>(n, *g, x);
  }
  KILN_CUDA_CHECK_LAUNCH();
  pass2_kernel<P, W><<<1, kMaxPartials, 0, stream>>>(blocks, w);
  KILN_CUDA_CHECK_LAUNCH();
}

// x's whole-tensor walk: null when dense, else its dims as one group.
bool whole_group(const StridedPlan& plan, DimGroup& g) {
  if (plan_is_dense(plan, 0)) return false;
  g.ndim = plan.ndim;
  for (int d = 0; d < plan.ndim; ++d) {
    g.shape[d] = plan.shape[d];
    g.stride[d] = plan.stride[0][d];
  }
  return true;
}

void check_plan(const char* op, const ReducePlan& p) {
  KILN_CHECK(p.outer >= 0 && p.n >= 0 && p.inner >= 0, "[{}] negative size ({}, {}, {})", op,
             p.outer, p.n, p.inner);
  std::int64_t tiles = 0;
  KILN_CHECK(!__builtin_mul_overflow(p.outer, ceil_div(p.inner, 32), &tiles),
             "[{}] ({}, {}, {}) is too large", op, p.outer, p.n, p.inner);
}

}  // namespace

template <typename T>
void reduce(ReduceOp op, const ReducePlan& p, const T* x, T* out, StreamHandle stream) {
  check_plan("reduce", p);
  if (p.outer == 0 || p.inner == 0) return;
  if (p.n == 0) {
    KILN_CHECK(op == ReduceOp::Sum, "[reduce] mean/max/min over an empty dim");
    memset_async(out, 0, static_cast<std::size_t>(p.outer * p.inner) * sizeof(T), stream);
    return;
  }
  const ValueW<T> w{out, static_cast<float>(p.n), op == ReduceOp::Mean};
  const bool whole = p.outer == 1 && p.inner == 1 && p.n >= kTwoPassMinN;
  const DimGroup g{1, {p.n}, {p.n_stride}};
  const DimGroup* gp = p.n_stride == 1 ? nullptr : &g;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      return whole ? launch_two_pass<T, SumP>(p.n, gp, x, w, stream)
                   : launch_plan<T, SumP>(p, x, w, stream);
    case ReduceOp::Max:
      return whole ? launch_two_pass<T, MaxP>(p.n, gp, x, w, stream)
                   : launch_plan<T, MaxP>(p, x, w, stream);
    case ReduceOp::Min:
      return whole ? launch_two_pass<T, MinP>(p.n, gp, x, w, stream)
                   : launch_plan<T, MinP>(p, x, w, stream);
  }
  fail("[reduce] unknown op {}", static_cast<int>(op));
}

template <typename T>
void argmax(const ReducePlan& p, const T* x, std::int64_t* out, StreamHandle stream) {
  check_plan("argmax", p);
  if (p.outer == 0 || p.inner == 0) return;
  KILN_CHECK(p.n > 0, "[argmax] empty dim");
  launch_plan<T, ArgMaxP>(p, x, IndexW{out}, stream);
}

template <typename T>
void sum_all(const StridedPlan& plan, const T* x, T* out, StreamHandle stream) {
  if (plan.numel == 0) {  // the sum of nothing
    memset_async(out, 0, sizeof(T), stream);
    return;
  }
  DimGroup g;
  const bool strided = whole_group(plan, g);
  launch_two_pass<T, SumP>(plan.numel, strided ? &g : nullptr, x, ValueW<T>{out, 1.f, false},
                           stream);
}

template <typename T>
double sum_squares(const StridedPlan& plan, const T* x, StreamHandle stream) {
  if (plan.numel == 0) return 0.0;
  DimGroup g;
  const bool strided = whole_group(plan, g);
  launch_two_pass<T, SumSqP>(plan.numel, strided ? &g : nullptr, x, SumSqW{}, stream);
  double result = 0.0;
  KILN_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&result, g_sum_squares, sizeof(double), 0,
                                            cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

#define KILN_CUDA_REDUCE_INST(T)                                                     \
  template void reduce<T>(ReduceOp, const ReducePlan&, const T*, T*, StreamHandle);  \
  template void argmax<T>(const ReducePlan&, const T*, std::int64_t*, StreamHandle); \
  template void sum_all<T>(const StridedPlan&, const T*, T*, StreamHandle);          \
  template double sum_squares<T>(const StridedPlan&, const T*, StreamHandle);
KILN_CUDA_REDUCE_INST(float)
KILN_CUDA_REDUCE_INST(bf16)
KILN_CUDA_REDUCE_INST(f16)
#undef KILN_CUDA_REDUCE_INST

}  // namespace kiln::cuda
