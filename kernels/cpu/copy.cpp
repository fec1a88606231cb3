// Strided copy with dtype conversion, and fill. See copy.h for the conversion rules.
// Strategy: drop size-1 dims and merge dims that are contiguous with each other in src, so a
// contiguous source becomes one flat loop and a permuted one becomes (rows, inner) loops, or
// blocks of (mid, inner) loop nests for 3+ dims.
// A 2-D transpose-like case (inner stride > 1, other dim contiguous) is tiled for cache use.
// Contiguous bf16 <-> f32 and f16 <-> f32 runs use the vectorized conversions of
// kernels/cpu/bf16_util.h.
#include "kernels/cpu/copy.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/common/error.h"
#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {
namespace {

constexpr int kMaxDims = 16;
constexpr int64_t kParallelMin = 32768;  // elements below which threads cost more than they save

template <typename Src, typename Dst>
inline void convert_run(int64_t n, const Src* __restrict src, int64_t stride, Dst* __restrict dst) {
  if (stride == 1) {
    if constexpr (std::is_same_v<Src, Dst>) {
      if (n >= 64) {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(Src));
      } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
      }
    } else if constexpr (std::is_same_v<Src, bf16> && std::is_same_v<Dst, float>) {
      bf16_to_f32(n, src, dst);  // vectorized, dispatched on cpu_isa() (bf16_util.h)
    } else if constexpr (std::is_same_v<Src, float> && std::is_same_v<Dst, bf16>) {
      f32_to_bf16(n, src, dst);  // same bits as convert_scalar at every ISA level
    } else if constexpr (std::is_same_v<Src, f16> && std::is_same_v<Dst, float>) {
      f16_to_f32(n, src, dst);  // F16C at AVX2 and above
    } else if constexpr (std::is_same_v<Src, float> && std::is_same_v<Dst, f16>) {
      f32_to_f16(n, src, dst);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = convert_scalar<Dst>(src[i]);
    }
  } else if (stride == 0) {
    const Dst v = convert_scalar<Dst>(src[0]);
    for (int64_t i = 0; i < n; ++i) dst[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = convert_scalar<Dst>(src[i * stride]);
  }
}

}  // namespace

template <typename Src, typename Dst>
void copy_strided(int ndim, const int64_t* shape, const Src* src, const int64_t* src_strides,
                  Dst* dst) {
  KILN_CHECK(ndim >= 0 && ndim <= kMaxDims, "[copy] ndim {} out of range [0, {}]", ndim, kMaxDims);
  // Collapse: keep dims with size > 1, merge a dim into the next when stride[d] ==
  // stride[d+1] * shape[d+1].
  int64_t sh[kMaxDims], st[kMaxDims];
  int nd = 0;
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    KILN_CHECK(shape[d] >= 0, "[copy] negative size {} in dim {}", shape[d], d);
    KILN_CHECK(src_strides[d] >= 0, "[copy] negative stride {} in dim {}", src_strides[d], d);
    total *= shape[d];
    if (shape[d] == 1) continue;
    if (nd > 0 && st[nd - 1] == src_strides[d] * shape[d]) {
      sh[nd - 1] *= shape[d];
      st[nd - 1] = src_strides[d];
    } else {
      sh[nd] = shape[d];
      st[nd] = src_strides[d];
      ++nd;
    }
  }
  if (total == 0) return;
  if (nd == 0) {  // one element
    dst[0] = convert_scalar<Dst>(src[0]);
    return;
  }
  if (nd == 1) {
    const int64_t n = sh[0], s = st[0];
    const int64_t chunk = 16384;
    const int64_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t b = c * chunk, e = std::min(n, b + chunk);
      convert_run(e - b, src + b * s, s, dst + b);
    }
    return;
  }
  // 2-D with a strided inner dim and a contiguous outer dim (a transpose): tile it so both reads
  // and writes stay in cache.
  if (nd == 2 && st[1] > 1 && st[0] == 1) {
    const int64_t R = sh[0], C = sh[1], sc = st[1];
    constexpr int64_t kTile = 32;
    const int64_t tr = (R + kTile - 1) / kTile, tc = (C + kTile - 1) / kTile;
#pragma omp parallel for collapse(2) schedule(static) if (total > kParallelMin)
    for (int64_t bi = 0; bi < tr; ++bi)
      for (int64_t bj = 0; bj < tc; ++bj) {
        const int64_t i1 = std::min(R, (bi + 1) * kTile), j1 = std::min(C, (bj + 1) * kTile);
        for (int64_t i = bi * kTile; i < i1; ++i)
          for (int64_t j = bj * kTile; j < j1; ++j)
            dst[i * C + j] = convert_scalar<Dst>(src[i + j * sc]);
      }
    return;
  }
  const int64_t inner = sh[nd - 1], inner_stride = st[nd - 1];
  if (nd == 2) {
    const int64_t rows = sh[0], row_stride = st[0];
#pragma omp parallel for schedule(static) if (total > kParallelMin)
    for (int64_t r = 0; r < rows; ++r)
      convert_run(inner, src + r * row_stride, inner_stride, dst + r * inner);
    return;
  }
  // General: blocks over the leading nd-2 dims (odometer), each a (mid, inner) loop nest, so
  // index arithmetic happens once per block rather than once per short run.
  const int64_t mid = sh[nd - 2], mid_stride = st[nd - 2];
  const int64_t blocks = total / (mid * inner);
#pragma omp parallel if (total > kParallelMin)
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t b0 = blocks * tid / nt, b1 = blocks * (tid + 1) / nt;
    if (b0 < b1) {
      // Multi-index of block b0, then step it like an odometer.
      int64_t idx[kMaxDims];
      int64_t rem = b0, off = 0;
      for (int d = nd - 3; d >= 0; --d) {
        idx[d] = rem % sh[d];
        rem /= sh[d];
        off += idx[d] * st[d];
      }
      for (int64_t b = b0; b < b1; ++b) {
        Dst* out = dst + b * mid * inner;
        for (int64_t k = 0; k < mid; ++k)
          convert_run(inner, src + off + k * mid_stride, inner_stride, out + k * inner);
        for (int d = nd - 3; d >= 0; --d) {
          off += st[d];
          if (++idx[d] < sh[d]) break;
          off -= st[d] * sh[d];
          idx[d] = 0;
        }
      }
    }
  }
}

template <typename T>
void fill(int64_t n, T value, T* dst) {
  KILN_CHECK(n >= 0, "[fill] negative size {}", n);
#pragma omp parallel for schedule(static) if (n > kParallelMin * 4)
  for (int64_t i = 0; i < n; ++i) dst[i] = value;
}

// ---- explicit instantiations: every (Src, Dst) pair of the 7 element types ----------------------
#define KILN_COPY_INST(S, D) \
  template void copy_strided<S, D>(int, const int64_t*, const S*, const int64_t*, D*);
#define KILN_COPY_INST_FROM(S) \
  KILN_COPY_INST(S, float)     \
  KILN_COPY_INST(S, double)    \
  KILN_COPY_INST(S, bf16)      \
  KILN_COPY_INST(S, f16)       \
  KILN_COPY_INST(S, int32_t)   \
  KILN_COPY_INST(S, int64_t)   \
  KILN_COPY_INST(S, uint8_t)   \
  template void fill<S>(int64_t, S, S*);
KILN_COPY_INST_FROM(float)
KILN_COPY_INST_FROM(double)
KILN_COPY_INST_FROM(bf16)
KILN_COPY_INST_FROM(f16)
KILN_COPY_INST_FROM(int32_t)
KILN_COPY_INST_FROM(int64_t)
KILN_COPY_INST_FROM(uint8_t)
#undef KILN_COPY_INST_FROM
#undef KILN_COPY_INST

}  // namespace kiln::cpu
