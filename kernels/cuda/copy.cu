// Strided copy with dtype conversion, and fill (math and conversion rules in copy.h).
//
// copy_strided: one thread per element in a grid-stride loop. Dense-to-dense (both operands
// walk memory in logical order) is a flat loop; anything else turns the logical index into a
// source and a destination offset through the collapsed plan (div/mod per dim), in uint32_t
// when the plan fits, else int64_t.
//   src: any strides (0 for broadcast dims), dst: any strides without overlap.
// fill_bits: a 16-byte pattern per store for the aligned bulk, then the tail element by element;
// a pattern whose bytes are all equal (zeros above all) is a cudaMemsetAsync.
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/copy.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// The device twin of cpu::convert_scalar (kernels/cpu/copy.h).
template <typename Dst, typename Src>
__device__ __forceinline__ Dst convert(Src x) {
  if constexpr (std::is_same_v<Src, Dst>) {
    return x;
  } else if constexpr (is_half_v<Src>) {
    return convert<Dst>(load(x));  // exact widening to float
  } else if constexpr (is_half_v<Dst>) {
    return store<Dst>(static_cast<float>(x));  // double rounds to float first, as on the CPU
  } else if constexpr (std::is_same_v<Dst, std::uint8_t>) {
    return static_cast<std::uint8_t>(x != Src(0) ? 1 : 0);
  } else {
    return static_cast<Dst>(x);
  }
}

// src, dst: (n) dense.
template <typename Src, typename Dst>
__global__ void copy_flat_kernel(std::int64_t n, const Src* __restrict__ src,
                                 Dst* __restrict__ dst) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = convert<Dst>(src[i]);
}

// Logical index i -> src offset (operand 0), dst offset (operand 1).
template <typename Src, typename Dst, typename Idx>
__global__ void copy_strided_kernel(IndexPlan<Idx> p, const Src* __restrict__ src,
                                    Dst* __restrict__ dst) {
  const Idx stride = static_cast<Idx>(gridDim.x) * blockDim.x;
  for (Idx i = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel; i += stride) {
    Idx off[2];
    plan_offsets<2>(p, i, off);
    dst[off[1]] = convert<Dst>(src[off[0]]);
  }
}

// dst: (n16) 16-byte words.
__global__ void fill16_kernel(std::int64_t n16, uint4 pattern, uint4* __restrict__ dst) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n16;
       i += stride)
    dst[i] = pattern;
}

// dst: (n) elements of U.
template <typename U>
__global__ void fill_kernel(std::int64_t n, U value, U* __restrict__ dst) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = value;
}

template <typename U>
void fill_typed(void* dst, std::int64_t n, std::uint64_t bits, StreamHandle stream) {
  U value;
  std::memcpy(&value, &bits, sizeof(U));  // the low bytes (little-endian)
  U* p = static_cast<U*>(dst);
  std::int64_t done = 0;
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 == 0) {
    constexpr std::int64_t per16 = 16 / sizeof(U);
    const std::int64_t n16 = n / per16;
    if (n16 > 0) {
      uint4 pattern;
      U* pp = reinterpret_cast<U*>(&pattern);
      for (std::int64_t k = 0; k < per16; ++k) pp[k] = value;
      fill16_kernel<<<grid_for(n16, kThreads), kThreads, 0, stream>>>(
          n16, pattern, reinterpret_cast<uint4*>(dst));
      KILN_CUDA_CHECK_LAUNCH();
      done = n16 * per16;
    }
  }
  if (done < n) {
    fill_kernel<U>
        <<<grid_for(n - done, kThreads), kThreads, 0, stream>>>(n - done, value, p + done);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

template <typename Src, typename Dst>
void copy_strided(const StridedPlan& plan, const Src* src, Dst* dst, StreamHandle stream) {
  KILN_CHECK(plan.nops == 2, "[copy] the plan needs a source and a destination operand");
  if (plan.numel == 0) return;
  if (plan_is_dense(plan, 0) && plan_is_dense(plan, 1)) {
    copy_flat_kernel<Src, Dst>
        <<<grid_for(plan.numel, kThreads), kThreads, 0, stream>>>(plan.numel, src, dst);
    KILN_CUDA_CHECK_LAUNCH();
  } else if (plan_fits_u32(plan)) {
    copy_strided_kernel<Src, Dst, std::uint32_t>
        <<<grid_for(plan.numel, kThreads), kThreads, 0, stream>>>(
            to_index_plan<std::uint32_t>(plan), src, dst);
    KILN_CUDA_CHECK_LAUNCH();
  } else {
    copy_strided_kernel<Src, Dst, std::int64_t>
        <<<grid_for(plan.numel, kThreads), kThreads, 0, stream>>>(to_index_plan<std::int64_t>(plan),
                                                                  src, dst);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

void fill_bits(void* dst, std::int64_t n, int elem_bytes, std::uint64_t bits, StreamHandle stream) {
  KILN_CHECK(n >= 0, "[fill] negative size {}", n);
  KILN_CHECK(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8,
             "[fill] element size {} is not 1, 2, 4 or 8 bytes", elem_bytes);
  if (n == 0) return;
  // All bytes equal (0, or a u8 value): a memset.
  const std::uint8_t b0 = static_cast<std::uint8_t>(bits);
  bool uniform = true;
  for (int k = 1; k < elem_bytes; ++k)
    uniform = uniform && static_cast<std::uint8_t>(bits >> (8 * k)) == b0;
  if (uniform) {
    memset_async(dst, b0, static_cast<std::size_t>(n) * elem_bytes, stream);
    return;
  }
  switch (elem_bytes) {
    case 2:
      return fill_typed<std::uint16_t>(dst, n, bits, stream);
    case 4:
      return fill_typed<std::uint32_t>(dst, n, bits, stream);
    case 8:
      return fill_typed<std::uint64_t>(dst, n, bits, stream);
    default:
      return fill_typed<std::uint8_t>(dst, n, bits, stream);
  }
}

void memcpy_peer(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                 StreamHandle stream) {
  if (bytes == 0) return;
  KILN_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream));
}

// ---- explicit instantiations: every (Src, Dst) pair of the 7 element types ----------------------
#define KILN_CUDA_COPY_INST(S, D) \
  template void copy_strided<S, D>(const StridedPlan&, const S*, D*, StreamHandle);
#define KILN_CUDA_COPY_INST_FROM(S)    \
  KILN_CUDA_COPY_INST(S, float)        \
  KILN_CUDA_COPY_INST(S, double)       \
  KILN_CUDA_COPY_INST(S, bf16)         \
  KILN_CUDA_COPY_INST(S, f16)          \
  KILN_CUDA_COPY_INST(S, std::int32_t) \
  KILN_CUDA_COPY_INST(S, std::int64_t) \
  KILN_CUDA_COPY_INST(S, std::uint8_t)
KILN_CUDA_COPY_INST_FROM(float)
KILN_CUDA_COPY_INST_FROM(double)
KILN_CUDA_COPY_INST_FROM(bf16)
KILN_CUDA_COPY_INST_FROM(f16)
KILN_CUDA_COPY_INST_FROM(std::int32_t)
KILN_CUDA_COPY_INST_FROM(std::int64_t)
KILN_CUDA_COPY_INST_FROM(std::uint8_t)
#undef KILN_CUDA_COPY_INST_FROM
#undef KILN_CUDA_COPY_INST

}  // namespace kiln::cuda
