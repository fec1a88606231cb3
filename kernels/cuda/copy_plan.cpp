// Host-side iteration plans for the basic-family CUDA kernels (see copy.h and reduce.h): which
// dims a strided kernel walks, with what strides, and whether 32-bit indexing is exact.
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/reduce.h"

namespace kiln::cuda {
namespace {

// Dims after dropping size-1 dims and merging neighbours that every operand walks as one.
struct Collapsed {
  std::vector<std::int64_t> shape;
  std::array<std::vector<std::int64_t>, 2> stride;
};

Collapsed collapse(const char* op, int ndim, const std::int64_t* shape,
                   const std::int64_t* const* strides, int nops) {
  Collapsed c;
  for (int d = 0; d < ndim; ++d) {
    KILN_CHECK(shape[d] >= 0, "[{}] negative size {} in dim {}", op, shape[d], d);
    for (int k = 0; k < nops; ++k)
      KILN_CHECK(strides[k][d] >= 0, "[{}] negative stride {} in dim {}", op, strides[k][d], d);
    if (shape[d] == 1) continue;
    bool merge = !c.shape.empty();
    for (int k = 0; k < nops && merge; ++k) merge = c.stride[k].back() == strides[k][d] * shape[d];
    if (merge) {
      c.shape.back() *= shape[d];
      for (int k = 0; k < nops; ++k) c.stride[k].back() = strides[k][d];
    } else {
      c.shape.push_back(shape[d]);
      for (int k = 0; k < nops; ++k) c.stride[k].push_back(strides[k][d]);
    }
  }
  return c;
}

std::int64_t checked_numel(const char* op, int ndim, const std::int64_t* shape) {
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    KILN_CHECK(shape[d] >= 0, "[{}] negative size {} in dim {}", op, shape[d], d);
    KILN_CHECK(!__builtin_mul_overflow(n, shape[d], &n), "[{}] element count overflows", op);
  }
  return n;
}

DimGroup make_group(const char* op, const char* which, int ndim, const std::int64_t* shape,
                    const std::int64_t* strides) {
  const std::int64_t* st[1] = {strides};
  Collapsed c = collapse(op, ndim, shape, st, 1);
  KILN_CHECK(c.shape.size() <= static_cast<std::size_t>(kMaxStridedDims),
             "[{}] the {} dims collapse to {} dims; CUDA kernels handle at most {}", op, which,
             c.shape.size(), kMaxStridedDims);
  DimGroup g;
  g.ndim = static_cast<int>(c.shape.size());
  for (int d = 0; d < g.ndim; ++d) {
    g.shape[d] = c.shape[d];
    g.stride[d] = c.stride[0][d];
  }
  return g;
}

}  // namespace

namespace {

// nops operands whose strides are st[0..nops); a pointer may be null only when ndim == 0.
StridedPlan plan_operands(const char* op, int ndim, const std::int64_t* shape,
                          const std::int64_t* const* st, int nops) {
  KILN_CHECK(ndim >= 0, "[{}] negative ndim {}", op, ndim);
  StridedPlan p;
  p.nops = nops;
  p.numel = checked_numel(op, ndim, shape);
  if (p.numel == 0) return p;
  Collapsed c = collapse(op, ndim, shape, st, p.nops);
  KILN_CHECK(c.shape.size() <= static_cast<std::size_t>(kMaxStridedDims),
             "[{}] a {}-d view that collapses to {} dims; CUDA kernels handle at most {}", op, ndim,
             c.shape.size(), kMaxStridedDims);
  p.ndim = static_cast<int>(c.shape.size());
  for (int d = 0; d < p.ndim; ++d) {
    p.shape[d] = c.shape[d];
    for (int k = 0; k < p.nops; ++k) p.stride[k][d] = c.stride[k][d];
  }
  return p;
}

}  // namespace

StridedPlan plan_strided(const char* op, int ndim, const std::int64_t* shape,
                         const std::int64_t* stride0) {
  const std::int64_t* st[1] = {stride0};
  return plan_operands(op, ndim, shape, st, 1);
}

StridedPlan plan_strided(const char* op, int ndim, const std::int64_t* shape,
                         const std::int64_t* stride0, const std::int64_t* stride1) {
  const std::int64_t* st[2] = {stride0, stride1};
  return plan_operands(op, ndim, shape, st, 2);
}

std::int64_t plan_max_offset(const StridedPlan& p, int k) {
  if (p.numel == 0) return 0;
  std::int64_t m = 0;
  for (int d = 0; d < p.ndim; ++d) m += (p.shape[d] - 1) * p.stride[k][d];
  return m;
}

bool plan_fits_u32(const StridedPlan& p) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  if (p.numel > kMax) return false;
  for (int k = 0; k < p.nops; ++k)
    if (plan_max_offset(p, k) > kMax) return false;
  return true;
}

bool plan_is_dense(const StridedPlan& p, int k) {
  return p.ndim == 0 || (p.ndim == 1 && p.stride[k][0] == 1);
}

std::int64_t covering_span(int ndim, const std::int64_t* shape, const std::int64_t* strides) {
  std::int64_t span = 1;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return 0;
    span += (shape[d] - 1) * strides[d];
  }
  return span;
}

ReducePlan plan_reduce(const char* op, int ndim, const std::int64_t* shape,
                       const std::int64_t* strides, std::int64_t outer, std::int64_t n,
                       std::int64_t inner) {
  KILN_CHECK(outer >= 0 && n >= 0 && inner >= 0, "[{}] negative size ({}, {}, {})", op, outer, n,
             inner);
  ReducePlan p;
  p.outer = outer;
  p.n = n;
  p.inner = inner;
  if (ndim == 0) {
    KILN_CHECK(outer == 1 && n == 1 && inner == 1, "[{}] a 0-d tensor viewed as ({}, {}, {})", op,
               outer, n, inner);
    return p;
  }
  // The reduced dim k: prod(shape[:k]) == outer, shape[k] == n, prod(shape[k+1:]) == inner. It
  // is unique when n > 1; for n == 1 any size-1 dim at the right place will do, or none at all
  // (a virtual dim of size 1 between the outer and inner dims).
  std::int64_t pre = 1;
  for (int k = 0; k <= ndim; ++k) {
    if (pre == outer) {
      const std::int64_t rest_from_k = checked_numel(op, ndim - k, shape + k);
      if (k < ndim && shape[k] == n && checked_numel(op, ndim - k - 1, shape + k + 1) == inner) {
        p.n_stride = strides[k];
        p.outer_dims = make_group(op, "outer", k, shape, strides);
        p.inner_dims = make_group(op, "inner", ndim - k - 1, shape + k + 1, strides + k + 1);
        return p;
      }
      if (n == 1 && rest_from_k == inner) {
        p.n_stride = 0;
        p.outer_dims = make_group(op, "outer", k, shape, strides);
        p.inner_dims = make_group(op, "inner", ndim - k, shape + k, strides + k);
        return p;
      }
    }
    if (k < ndim && __builtin_mul_overflow(pre, shape[k], &pre)) break;
  }
  std::string s;
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  fail("[{}] cannot view shape ({}) as (outer {}, n {}, inner {})", op, s, outer, n, inner);
}

}  // namespace kiln::cuda
