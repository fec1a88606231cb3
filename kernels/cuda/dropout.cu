// Dropout (math and RNG contract in dropout.h). The forward walks Philox blocks: thread k draws
// the block for counter offset + k and handles elements 4k .. 4k+3, exactly the CPU kernel's
// split, so the same bits decide the same elements. x, y, dy, dx: (n); mask: (n) u8.
#include "kernels/common/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dropout.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// drop_all: p >= 1 (scale 0, every element dropped); p == 0 never reaches here.
template <typename T>
__global__ void dropout_fwd_kernel(std::int64_t n, float p, float scale, std::uint64_t seed,
                                   std::uint64_t offset, const T* x, T* y, std::uint8_t* mask) {
  const std::int64_t nblocks = (n + 3) / 4;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t blk = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       blk < nblocks; blk += stride) {
    const Philox4 r = philox_block(seed, offset + static_cast<std::uint64_t>(blk));
    const std::int64_t i0 = blk * 4;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const std::int64_t i = i0 + l;
      if (i < n) {
        const bool keep = uniform01(r.v[l]) >= p;
        mask[i] = keep ? 1 : 0;
        y[i] = store<T>(keep ? load(x[i]) * scale : 0.f);
      }
    }
  }
}

// p == 0: y = x, mask = 1 (mask may be null).
template <typename T>
__global__ void dropout_copy_kernel(std::int64_t n, const T* x, T* y, std::uint8_t* mask) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = x[i];
    if (mask) mask[i] = 1;
  }
}

// mask == null only for p == 0 (then scale is 1 and every element passes).
template <typename T>
__global__ void dropout_bwd_kernel(std::int64_t n, float scale, const std::uint8_t* mask,
                                   const T* dy, T* dx) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const bool keep = mask ? mask[i] != 0 : true;
    dx[i] = store<T>(keep ? load(dy[i]) * scale : 0.f);
  }
}

void check_p(std::int64_t n, float p) {
  KILN_CHECK(n >= 0, "[dropout] negative size {}", n);
  KILN_CHECK(p >= 0.0f && p <= 1.0f, "[dropout] probability {} outside [0, 1]", p);
}

// 1 / (1 - p) in float as the CPU kernel's keep_scale; 0 when everything is dropped.
float keep_scale(float p) { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

}  // namespace

template <typename T>
void dropout_forward(std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset, const T* x,
                     T* y, std::uint8_t* mask, StreamHandle stream) {
  check_p(n, p);
  if (n == 0) return;
  if (p == 0.0f) {
    dropout_copy_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, x, y, mask);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  KILN_CHECK(mask != nullptr, "[dropout] mask is required when p > 0");
  dropout_fwd_kernel<T><<<grid_for(ceil_div(n, 4), kThreads), kThreads, 0, stream>>>(
      n, p, keep_scale(p), seed, offset, x, y, mask);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void dropout_backward(std::int64_t n, float p, const std::uint8_t* mask, const T* dy, T* dx,
                      StreamHandle stream) {
  check_p(n, p);
  if (n == 0) return;
  if (p == 0.0f) {
    if (dx != dy) {
      dropout_copy_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, dy, dx, nullptr);
      KILN_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  KILN_CHECK(mask != nullptr, "[dropout] mask is required when p > 0");
  dropout_bwd_kernel<T>
      <<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, keep_scale(p), mask, dy, dx);
  KILN_CUDA_CHECK_LAUNCH();
}

#define KILN_INSTANTIATE(T)                                                                     \
  template void dropout_forward<T>(std::int64_t, float, std::uint64_t, std::uint64_t, const T*, \
                                   T*, std::uint8_t*, StreamHandle);                            \
  template void dropout_backward<T>(std::int64_t, float, const std::uint8_t*, const T*, T*,     \
                                    StreamHandle);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(f16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
