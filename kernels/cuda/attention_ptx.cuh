// Inline PTX used by the flash attention kernels (nvcc only): cp.async global
// -> shared copies, ldmatrix, and the bf16 tensor-core mma.m16n8k16 with f32
// accumulators (sm_80+; we build sm_90). Fragment layouts and the lane
// addressing are documented and CPU-tested in attention_tile.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_tile.h"

namespace kiln::cuda::attn {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1. When !valid nothing is read and the
// 16 bytes are zero-filled (src-size 0), so out-of-range rows become zeros,
// never garbage; src must still be a mapped address, the callers pass the
// tensor's base then.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N committed groups of this thread are still in flight. A
// __syncthreads() must follow before other threads' copies are read.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; addr: this lane's row address (shared state space,
// 16-byte aligned).
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// d += a * b on one 16x8x16 tile (a: A fragment, b0/b1: B fragment, d: C/D
// fragment).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two adjacent 16x8 output tiles from one A fragment and an x4 B load (two 8-column B
// fragments): d0 += a * b[0..1], d1 += a * b[2..3].
__device__ __forceinline__ void mma_x2(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[4]) {
  mma_bf16(d0, a, b[0], b[1]);
  mma_bf16(d1, a, b[2], b[3]);
}

// Two floats to a bf16x2 register, lo in the low half (the lower column index
// of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&h);
}

// The A fragment (16 x 16 bf16) of two adjacent f32 accumulator tiles: c0 holds columns 0-7 and
// c1 columns 8-15 of the same 16 rows. An mma's C layout is the next mma's A layout
// (FlashAttention-2's register reuse), so P or dS feeds the next product with no trip through
// shared memory.
__device__ __forceinline__ void accumulators_to_a(const float (&c0)[4], const float (&c1)[4],
                                                  uint32_t (&a)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Copy rows [r0, r0 + rows) of a (row stride `stride` elements) bf16 matrix
// into a swizzled shared tile of rows x D; rows >= limit are zero-filled. All
// threads of the CTA take part; the caller commits the group.
template <int D, int kThreads>
__device__ __forceinline__ void load_tile_async(unsigned char *tile, const __nv_bfloat16 *g,
                                                int64_t stride, int r0, int rows, int limit) {
  constexpr int kChunks = D / 8;
  const uint32_t base = smem_addr(tile);
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    const int row = r0 + r;
    const bool valid = row < limit;
    const __nv_bfloat16 *src = valid ? g + static_cast<int64_t>(row) * stride + ch * 8 : g;
    cp_async_16(base + tile_byte_offset(r, ch, kChunks), src, valid);
  }
}

}  // namespace kiln::cuda::attn
