// Strided copy with dtype conversion, and fill, on CUDA; plus the host-side iteration plans the
// basic-family kernels share (copy, elementwise, reduce).
//
//   copy_strided: dst[off1(i)] = convert(src[off0(i)])   (=) for every logical index i of a shape
//   fill_bits:    dst[i] = bits                (=) n contiguous elements of 1, 2, 4 or 8 bytes
// Conversions follow kernels/cpu/copy.h exactly: float <-> bf16/f16 round to nearest even, double
// to a 16-bit float goes through float, floats to integers truncate toward zero (NaN and out of
// range are unspecified: the GPU saturates where x86 gives INT_MIN), anything to uint8_t (the bool
// dtype) is x != 0, and uint8_t -> uint8_t copies bytes.
//
// Plans. A StridedPlan describes a row-major walk over a shape with up to two strided operands
// (a source and a destination, or the two inputs of a binary op; a contiguous output is addressed
// by the logical index itself). plan_strided() drops size-1 dims and merges neighbouring dims that
// every operand can walk as one (stride[d] == stride[d+1] * shape[d+1]), so a contiguous tensor
// becomes one dim, a transpose two and a bias broadcast (rows, C) + (C) two. Kernels then turn
// the logical index into element offsets with plan_offsets() (div/mod over at most
// kMaxStridedDims dims), in 32-bit arithmetic when plan_fits_u32() says every index and offset
// fits, else 64-bit.
//
// This header is plain C++ (compiled by g++ too); plan_offsets() is also compiled for the device.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"  // KILN_HOST_DEVICE, bf16, f16
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

// Dims a strided kernel handles after collapsing (tensors up to 8-d always fit).
inline constexpr int kMaxStridedDims = 8;

struct StridedPlan {
  int ndim = 0;  // after collapsing; 0 means a single element (when numel == 1)
  int nops = 1;  // operands with strides (1 or 2)
  std::int64_t numel = 0;
  std::int64_t shape[kMaxStridedDims] = {};
  std::int64_t stride[2][kMaxStridedDims] = {};  // in elements, >= 0 (0 = broadcast)
};

// Plans a walk over shape[ndim] for one operand or two. The overload called sets the operand
// count, never the pointers' values: a 0-d tensor's strides are an empty vector whose data() may
// be null, and its plan must still have the operands the kernel expects. Strides must be >= 0.
// Fails with "[op] ..." when more than kMaxStridedDims dims remain after collapsing.
StridedPlan plan_strided(const char* op, int ndim, const std::int64_t* shape,
                         const std::int64_t* stride0);
StridedPlan plan_strided(const char* op, int ndim, const std::int64_t* shape,
                         const std::int64_t* stride0, const std::int64_t* stride1);

// Largest element offset operand k reaches (0 for an empty or one-element plan).
std::int64_t plan_max_offset(const StridedPlan& p, int k);
// True when numel and every offset fit in 31 bits, so kernels may index with uint32_t.
bool plan_fits_u32(const StridedPlan& p);
// True when operand k walks memory densely in logical order (offset(i) == i).
bool plan_is_dense(const StridedPlan& p, int k);

// Elements a strided view touches, from its first element to its last: 1 + sum (shape-1)*stride,
// or 0 when it is empty. A view that skips elements (a narrowed column) covers more than numel;
// a broadcast one covers fewer.
std::int64_t covering_span(int ndim, const std::int64_t* shape, const std::int64_t* strides);

// The plan in the index type a kernel uses (uint32_t or int64_t). Host only.
template <typename Idx>
struct IndexPlan {
  int ndim = 0;
  Idx numel = 0;
  Idx shape[kMaxStridedDims] = {};
  Idx stride[2][kMaxStridedDims] = {};
};
template <typename Idx>
IndexPlan<Idx> to_index_plan(const StridedPlan& p) {
  IndexPlan<Idx> q;
  q.ndim = p.ndim;
  q.numel = static_cast<Idx>(p.numel);
  for (int d = 0; d < kMaxStridedDims; ++d) {
    q.shape[d] = static_cast<Idx>(p.shape[d]);
    q.stride[0][d] = static_cast<Idx>(p.stride[0][d]);
    q.stride[1][d] = static_cast<Idx>(p.stride[1][d]);
  }
  return q;
}

// Offsets of logical index i (row-major over the collapsed shape) for the first NOPS operands.
// The loop is unrolled over all kMaxStridedDims dims with a guard, so on the device the plan
// stays in kernel-parameter space instead of being copied to local memory.
#if defined(__CUDACC__)
#define KILN_UNROLL _Pragma("unroll")
#else
#define KILN_UNROLL
#endif
template <int NOPS, typename Idx>
KILN_HOST_DEVICE inline void plan_offsets(const IndexPlan<Idx>& p, Idx i, Idx (&off)[NOPS]) {
  KILN_UNROLL
  for (int k = 0; k < NOPS; ++k) off[k] = 0;
  KILN_UNROLL
  for (int d = kMaxStridedDims - 1; d >= 0; --d) {
    if (d < p.ndim) {
      const Idx c = i % p.shape[d];
      i /= p.shape[d];
      KILN_UNROLL
      for (int k = 0; k < NOPS; ++k) off[k] += c * p.stride[k][d];
    }
  }
}

// ---- launchers ----------------------------------------------------------------------------------

// dst[offset of operand 1] = convert(src[offset of operand 0]) over the plan (plan.nops == 2).
// Src, Dst: float, double, bf16, f16, int32_t, int64_t, uint8_t (every pair is instantiated).
// src and dst must not overlap unless they are the same view.
template <typename Src, typename Dst>
void copy_strided(const StridedPlan& plan, const Src* src, Dst* dst, StreamHandle stream);

// n contiguous elements of elem_bytes (1, 2, 4 or 8) set to the low bytes of `bits`.
void fill_bits(void* dst, std::int64_t n, int elem_bytes, std::uint64_t bits, StreamHandle stream);

// Same-dtype contiguous copy between two devices (cudaMemcpyPeerAsync).
void memcpy_peer(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                 StreamHandle stream);

}  // namespace kiln::cuda
