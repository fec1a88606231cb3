// AdamW (single and multi-tensor), SGD, and the multi-tensor sum of squares on CUDA. The math,
// the rounding and the launch layout are documented in optimizer.h; the block -> piece mapping
// in kernels/common/multi_tensor_plan.h.
//
// Every optimizer kernel writes (=) param, master, m, v, momentum_buf in place; each element is
// read and written by one thread, so nothing races.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "kernels/common/multi_tensor_plan.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optimizer.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSsqBlocks = 512;  // fixed grid of the sum of squares (partials below)
static_assert(kMultiChunk % (4 * kThreads) == 0, "a chunk is whole 4-element steps");

// kind byte of a slot: bits 0-1 param dtype, 2-3 grad dtype, 4 has master, 5 vector-aligned.
constexpr std::uint8_t kHasMaster = 1u << 4, kAligned = 1u << 5;
constexpr std::uint8_t kind_of(OptDType p, OptDType g, bool master) {
  return static_cast<std::uint8_t>(static_cast<unsigned>(p) | (static_cast<unsigned>(g) << 2) |
                                   (master ? kHasMaster : 0u));
}

// The kernel parameter block of one multi-tensor AdamW launch (structure of arrays).
struct AdamWLaunchArgs {
  void* param[kMultiSlots];
  const void* grad[kMultiSlots];
  float* master[kMultiSlots];
  float* m[kMultiSlots];
  float* v[kMultiSlots];
  std::int64_t numel[kMultiSlots];
  float decay[kMultiSlots];
  std::int32_t chunk_start[kMultiSlots + 1];
  std::uint8_t kind[kMultiSlots];
  int nslots;
  AdamWConsts c;
};
// CUDA 12.1+ allows 32764 bytes of kernel parameters on Volta and newer.
static_assert(sizeof(AdamWLaunchArgs) <= 32000, "AdamW launch table exceeds the parameter limit");

struct SsqLaunchArgs {
  const void* data[kMultiSlots];
  std::int64_t numel[kMultiSlots];
  std::int32_t chunk_start[kMultiSlots + 1];
  std::uint8_t dtype[kMultiSlots];
  int nslots;
  int accumulate;  // 0: the first launch of a call overwrites the partials
};
static_assert(sizeof(SsqLaunchArgs) <= 32000, "sum-of-squares table exceeds the parameter limit");

// Per-block partial sums and the total of sum_squares_multi (one copy per device).
__device__ double g_ssq_partials[kSsqBlocks];
__device__ double g_ssq_total;

// ---- 4-element loads/stores (f32: 16 bytes, bf16/f16: 8 bytes; aligned by the launcher) ----
template <typename T>
__device__ __forceinline__ void load4(const T* p, float (&out)[4]) {
  if constexpr (sizeof(T) == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    out[0] = q.x, out[1] = q.y, out[2] = q.z, out[3] = q.w;
  } else {
    static_assert(sizeof(T) == 2);
    union {
      uint2 raw;
      T e[4];
    } u;
    u.raw = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = load(u.e[k]);
  }
}
template <typename T>
__device__ __forceinline__ void store4(T* p, const float (&in)[4]) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  } else {
    union {
      uint2 raw;
      T e[4];
    } u;
#pragma unroll
    for (int k = 0; k < 4; ++k) u.e[k] = store<T>(in[k]);
    *reinterpret_cast<uint2*>(p) = u.raw;
  }
}

// Elements [begin, end) of slot s. P: param type, G: grad type; with kMaster the f32 master is
// updated and param gets it rounded to P.
template <typename P, typename G, bool kMaster>
__device__ __forceinline__ void adamw_piece(const AdamWLaunchArgs& a, int s, std::int64_t begin,
                                            std::int64_t end, bool vec, const AdamWConsts& c) {
  P* param = static_cast<P*>(a.param[s]);
  const G* grad = static_cast<const G*>(a.grad[s]);
  float* master = a.master[s];
  float* m = a.m[s];
  float* v = a.v[s];
  const float decay = a.decay[s];
  std::int64_t scalar_from = begin;
  if (vec) {
    const std::int64_t vec_end = begin + (end - begin) / 4 * 4;
    for (std::int64_t i = begin + 4 * static_cast<std::int64_t>(threadIdx.x); i < vec_end;
         i += 4 * static_cast<std::int64_t>(blockDim.x)) {
      float w[4], g[4], mm[4], vv[4];
      if constexpr (kMaster)
        load4(master + i, w);
      else
        load4(param + i, w);
      load4(grad + i, g);
      load4(m + i, mm);
      load4(v + i, vv);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = adamw_update(w[k], g[k], mm[k], vv[k], decay, c);
      store4(m + i, mm);
      store4(v + i, vv);
      if constexpr (kMaster) store4(master + i, w);
      store4(param + i, w);
    }
    scalar_from = vec_end;
  }
  for (std::int64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
    float mi = m[i], vi = v[i];
    float w;
    if constexpr (kMaster)
      w = master[i];
    else
      w = load(param[i]);
    w = adamw_update(w, load(grad[i]), mi, vi, decay, c);
    m[i] = mi;
    v[i] = vi;
    if constexpr (kMaster) master[i] = w;
    param[i] = store<P>(w);
  }
}

// grid.x = chunks of the launch; block c takes chunk c of its slot.
__global__ void __launch_bounds__(kThreads)
    adamw_multi_kernel(const __grid_constant__ AdamWLaunchArgs a) {
  const std::int64_t c = blockIdx.x;
  const int s = mt::find_slot(a.chunk_start, a.nslots, c);
  const std::int64_t begin = (c - a.chunk_start[s]) * kMultiChunk;
  const std::int64_t end = min(a.numel[s], begin + kMultiChunk);
  const AdamWConsts k = a.c;
  const std::uint8_t kind = a.kind[s];
  const bool vec = (kind & kAligned) != 0;
  constexpr auto F32 = OptDType::F32, BF16 = OptDType::BF16, F16 = OptDType::F16;
  switch (kind & ~kAligned) {
    case kind_of(F32, F32, false):
      adamw_piece<float, float, false>(a, s, begin, end, vec, k);
      break;
    case kind_of(F32, F32, true):
      adamw_piece<float, float, true>(a, s, begin, end, vec, k);
      break;
    case kind_of(BF16, BF16, true):
      adamw_piece<bf16, bf16, true>(a, s, begin, end, vec, k);
      break;
    case kind_of(BF16, F32, true):
      adamw_piece<bf16, float, true>(a, s, begin, end, vec, k);
      break;
    case kind_of(F16, F16, true):
      adamw_piece<f16, f16, true>(a, s, begin, end, vec, k);
      break;
    case kind_of(F16, F32, true):
      adamw_piece<f16, float, true>(a, s, begin, end, vec, k);
      break;
    default:
      break;  // the launcher rejects every other combination
  }
}

// ---- SGD ----------------------------------------------------------------------------------------
struct SgdArgs {
  float neg_lr, momentum, one_m_damp, wd;
  bool decay, has_momentum, first, nesterov;
};

// param, grad, buf: (n) f32; grid-stride over elements.
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(std::int64_t n, float* param, const float* grad, float* buf, SgdArgs a) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float d = grad[i];
    const float p = param[i];
    if (a.decay) d = __fadd_rn(d, __fmul_rn(a.wd, p));
    if (a.has_momentum) {
      const float b =
          a.first ? d : __fadd_rn(__fmul_rn(buf[i], a.momentum), __fmul_rn(a.one_m_damp, d));
      buf[i] = b;
      d = a.nesterov ? __fadd_rn(d, __fmul_rn(a.momentum, b)) : b;
    }
    param[i] = __fadd_rn(p, __fmul_rn(a.neg_lr, d));
  }
}

// ---- sum of squares -----------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ float ssq_range(const T* x, std::int64_t begin, std::int64_t end) {
  float acc = 0.f;
#pragma unroll 4
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = load(x[i]);
    acc = fmaf(v, v, acc);
  }
  return acc;
}

// grid.x = kSsqBlocks; block b sums chunks b, b + kSsqBlocks, ... (in that order) into
// g_ssq_partials[b].
__global__ void __launch_bounds__(kThreads)
    ssq_kernel(const __grid_constant__ SsqLaunchArgs a, std::int64_t chunks) {
  double acc = 0.0;
  for (std::int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {  // uniform over the block
    const int s = mt::find_slot(a.chunk_start, a.nslots, c);
    const std::int64_t begin = (c - a.chunk_start[s]) * kMultiChunk;
    const std::int64_t end = min(a.numel[s], begin + kMultiChunk);
    float part = 0.f;
    switch (static_cast<OptDType>(a.dtype[s])) {
      case OptDType::F32:
        part = ssq_range(static_cast<const float*>(a.data[s]), begin, end);
        break;
      case OptDType::BF16:
        part = ssq_range(static_cast<const bf16*>(a.data[s]), begin, end);
        break;
      case OptDType::F16:
        part = ssq_range(static_cast<const f16*>(a.data[s]), begin, end);
        break;
    }
    acc += static_cast<double>(block_sum(part));  // every thread gets the same block sum
  }
  if (threadIdx.x == 0)
    g_ssq_partials[blockIdx.x] = (a.accumulate ? g_ssq_partials[blockIdx.x] : 0.0) + acc;
}

// One block of kSsqBlocks threads: fixed-order tree over the partials.
__global__ void __launch_bounds__(kSsqBlocks) ssq_finish_kernel() {
  __shared__ double sh[kSsqBlocks];
  const int t = threadIdx.x;
  sh[t] = g_ssq_partials[t];
  __syncthreads();
  for (int w = kSsqBlocks / 2; w > 0; w /= 2) {
    if (t < w) sh[t] += sh[t + w];
    __syncthreads();
  }
  if (t == 0) g_ssq_total = sh[0];
}

constexpr std::size_t dsize(OptDType d) { return d == OptDType::F32 ? 4 : 2; }
bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}
template <typename T>
T* advance(T* p, std::int64_t elems, std::size_t elem_bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return p ? reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + elems * elem_bytes) : nullptr;
}

}  // namespace

void adamw_multi_step(std::span<const AdamWItem> items, const AdamWConsts& c, StreamHandle stream) {
  std::vector<std::int64_t> numels(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const AdamWItem& it = items[i];
    KILN_CHECK(it.numel >= 0, "[adamw] item {} has negative size {}", i, it.numel);
    numels[i] = it.numel;
    if (it.numel == 0) continue;
    KILN_CHECK(it.param && it.grad && it.m && it.v, "[adamw] item {} has a null pointer", i);
    KILN_CHECK(it.master || (it.param_dtype == OptDType::F32 && it.grad_dtype == OptDType::F32),
               "[adamw] item {}: a bf16/f16 parameter needs an f32 master", i);
    KILN_CHECK(it.grad_dtype == it.param_dtype || it.grad_dtype == OptDType::F32,
               "[adamw] item {}: the gradient must have the parameter's dtype or f32", i);
  }
  for (const mt::Launch& l : mt::plan(numels, kMultiChunk, kMultiSlots, INT_MAX)) {
    auto a = std::make_unique<AdamWLaunchArgs>();  // ~29 KB, zeroed, off the stack
    a->nslots = static_cast<int>(l.slots.size());
    a->c = c;
    for (int s = 0; s < a->nslots; ++s) {
      const mt::Slot& sl = l.slots[static_cast<std::size_t>(s)];
      const AdamWItem& it = items[static_cast<std::size_t>(sl.tensor)];
      const std::size_t ps = dsize(it.param_dtype), gs = dsize(it.grad_dtype);
      a->param[s] = advance(it.param, sl.first, ps);
      a->grad[s] = advance(it.grad, sl.first, gs);
      a->master[s] = advance(it.master, sl.first, 4);
      a->m[s] = advance(it.m, sl.first, 4);
      a->v[s] = advance(it.v, sl.first, 4);
      a->numel[s] = sl.count;
      a->decay[s] = it.decay;
      a->chunk_start[s] = static_cast<std::int32_t>(l.chunk_start[static_cast<std::size_t>(s)]);
      const bool vec = aligned(a->param[s], 4 * ps) && aligned(a->grad[s], 4 * gs) &&
                       (!a->master[s] || aligned(a->master[s], 16)) && aligned(a->m[s], 16) &&
                       aligned(a->v[s], 16);
      a->kind[s] = static_cast<std::uint8_t>(
          kind_of(it.param_dtype, it.grad_dtype, it.master != nullptr) | (vec ? kAligned : 0u));
    }
    a->chunk_start[a->nslots] = static_cast<std::int32_t>(l.chunks());
    adamw_multi_kernel<<<static_cast<unsigned>(l.chunks()), kThreads, 0, stream>>>(*a);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

void adamw_step(std::int64_t n, float* param, const float* grad, float* m, float* v, float lr,
                float beta1, float beta2, float eps, float weight_decay, std::int64_t step,
                StreamHandle stream) {
  KILN_CHECK(n >= 0, "[adamw] negative size {}", n);
  const AdamWConsts c = adamw_consts(lr, beta1, beta2, eps, step);  // checks step >= 1
  if (n == 0) return;
  AdamWItem it;
  it.param = param;
  it.grad = grad;
  it.m = m;
  it.v = v;
  it.numel = n;
  it.decay = adamw_decay(lr, weight_decay);
  adamw_multi_step(std::span<const AdamWItem>(&it, 1), c, stream);
}

void sgd_step(std::int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
              float momentum, float dampening, float weight_decay, bool nesterov, std::int64_t step,
              StreamHandle stream) {
  KILN_CHECK(n >= 0, "[sgd] negative size {}", n);
  KILN_CHECK(step >= 1, "[sgd] step {} must be >= 1 (counted from 1)", step);
  KILN_CHECK(momentum == 0.0f || momentum_buf != nullptr, "[sgd] momentum {} needs a buffer",
             momentum);
  KILN_CHECK(!nesterov || (momentum > 0.0f && dampening == 0.0f),
             "[sgd] nesterov needs momentum > 0 and dampening 0");
  if (n == 0) return;
  SgdArgs a{-lr,
            momentum,
            static_cast<float>(1.0 - double(dampening)),
            weight_decay,
            weight_decay != 0.0f,
            momentum != 0.0f,
            step == 1,
            nesterov};
  sgd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, param, grad, momentum_buf, a);
  KILN_CUDA_CHECK_LAUNCH();
}

double sum_squares_multi(std::span<const SumSquaresItem> items, StreamHandle stream) {
  std::vector<std::int64_t> numels(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    KILN_CHECK(items[i].numel >= 0, "[sum_squares] item {} has negative size {}", i,
               items[i].numel);
    KILN_CHECK(items[i].numel == 0 || items[i].data, "[sum_squares] item {} has no data", i);
    numels[i] = items[i].numel;
  }
  const std::vector<mt::Launch> plan = mt::plan(numels, kMultiChunk, kMultiSlots, INT_MAX);
  if (plan.empty()) return 0.0;
  bool first = true;
  for (const mt::Launch& l : plan) {
    auto a = std::make_unique<SsqLaunchArgs>();
    a->nslots = static_cast<int>(l.slots.size());
    a->accumulate = first ? 0 : 1;
    for (int s = 0; s < a->nslots; ++s) {
      const mt::Slot& sl = l.slots[static_cast<std::size_t>(s)];
      const SumSquaresItem& it = items[static_cast<std::size_t>(sl.tensor)];
      a->data[s] = advance(it.data, sl.first, dsize(it.dtype));
      a->numel[s] = sl.count;
      a->dtype[s] = static_cast<std::uint8_t>(it.dtype);
      a->chunk_start[s] = static_cast<std::int32_t>(l.chunk_start[static_cast<std::size_t>(s)]);
    }
    a->chunk_start[a->nslots] = static_cast<std::int32_t>(l.chunks());
    ssq_kernel<<<kSsqBlocks, kThreads, 0, stream>>>(*a, l.chunks());
    KILN_CUDA_CHECK_LAUNCH();
    first = false;
  }
  ssq_finish_kernel<<<1, kSsqBlocks, 0, stream>>>();
  KILN_CUDA_CHECK_LAUNCH();
  double total = 0.0;
  KILN_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&total, g_ssq_total, sizeof(double), 0,
                                            cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return total;
}

}  // namespace kiln::cuda
