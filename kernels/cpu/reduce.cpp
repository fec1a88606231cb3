// Reductions; see reduce.h for the math.
// Layout cases for an (outer, dim, inner) view:
//   inner == 1: each output reduces a contiguous run of dim values (row reductions).
//   inner > 1:  each output row is built by sweeping d and updating a tile of inner values, so
//               the inner loop is contiguous and vectorizes. When outer is small and dim large
//               (bias gradients: outer 1, dim B*T, inner C) the dim axis is split into fixed
//               chunks whose partials are added in order, so threads help and results stay
//               independent of the thread count.
#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common/error.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 32768;
constexpr int64_t kTile = 256;        // inner values per tile
constexpr int64_t kSumChunk = 16384;  // elements per partial sum in sum_all / sum_squares
constexpr int64_t kDimChunk = 512;    // rows of dim per partial in the split-dim path

template <typename T>
inline T max_nan(T a, T b) {
  return (a != a || a > b) ? a : b;
}
template <typename T>
inline T min_nan(T a, T b) {
  return (a != a || a < b) ? a : b;
}

// Sum (in double) of a contiguous run.
template <typename T>
inline double run_sum(int64_t n, const T* __restrict x) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(to_compute(x[i]));
  return s;
}

template <typename T>
inline compute_t<T> run_max(int64_t n, const T* __restrict x) {
  compute_t<T> m = to_compute(x[0]);
  for (int64_t i = 1; i < n; ++i) m = max_nan(m, to_compute(x[i]));
  return m;
}
template <typename T>
inline compute_t<T> run_min(int64_t n, const T* __restrict x) {
  compute_t<T> m = to_compute(x[0]);
  for (int64_t i = 1; i < n; ++i) m = min_nan(m, to_compute(x[i]));
  return m;
}

// Sum over d in [d0, d1) of x[d, j] for j in [0, w) of a tile with row stride `inner`.
template <typename T>
inline void tile_sum(int64_t d0, int64_t d1, int64_t inner, int64_t w, const T* __restrict x,
                     double* __restrict acc) {
  for (int64_t j = 0; j < w; ++j) acc[j] = 0;
  for (int64_t d = d0; d < d1; ++d) {
    const T* __restrict row = x + d * inner;
    for (int64_t j = 0; j < w; ++j) acc[j] += static_cast<double>(to_compute(row[j]));
  }
}

template <typename T>
void reduce_inner(ReduceOp op, int64_t outer, int64_t dim, int64_t inner, const T* x, T* out) {
  const int64_t ntiles = (inner + kTile - 1) / kTile;
  const int64_t work = outer * dim * inner;
  const bool is_sum = op == ReduceOp::Sum || op == ReduceOp::Mean;
  const double scale = op == ReduceOp::Mean ? 1.0 / double(dim) : 1.0;
  // Few output tiles but a long dim: split dim into fixed chunks (sum/mean only).
  if (is_sum && outer * ntiles < 8 && work > kParallelMin && dim >= 2 * kDimChunk) {
    const int64_t nchunks = (dim + kDimChunk - 1) / kDimChunk;
    std::vector<double> partial(static_cast<size_t>(nchunks * inner));
    for (int64_t o = 0; o < outer; ++o) {
      const T* xo = x + o * dim * inner;
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t c = 0; c < nchunks; ++c)
        for (int64_t t = 0; t < ntiles; ++t) {
          const int64_t j0 = t * kTile, w = std::min(kTile, inner - j0);
          tile_sum(c * kDimChunk, std::min(dim, (c + 1) * kDimChunk), inner, w, xo + j0,
                   partial.data() + c * inner + j0);
        }
      for (int64_t j = 0; j < inner; ++j) {
        double s = 0;
        for (int64_t c = 0; c < nchunks; ++c) s += partial[c * inner + j];
        out[o * inner + j] = from_compute<T>(s * scale);
      }
    }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static) if (work > kParallelMin)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t j0 = t * kTile, w = std::min(kTile, inner - j0);
      const T* xo = x + o * dim * inner + j0;
      T* oo = out + o * inner + j0;
      if (is_sum) {
        double acc[kTile];
        tile_sum<T>(0, dim, inner, w, xo, acc);
        for (int64_t j = 0; j < w; ++j) oo[j] = from_compute<T>(acc[j] * scale);
      } else {
        compute_t<T> acc[kTile];
        for (int64_t j = 0; j < w; ++j) acc[j] = to_compute(xo[j]);
        for (int64_t d = 1; d < dim; ++d) {
          const T* row = xo + d * inner;
          if (op == ReduceOp::Max)
            for (int64_t j = 0; j < w; ++j) acc[j] = max_nan(acc[j], to_compute(row[j]));
          else
            for (int64_t j = 0; j < w; ++j) acc[j] = min_nan(acc[j], to_compute(row[j]));
        }
        for (int64_t j = 0; j < w; ++j) oo[j] = from_compute<T>(acc[j]);
      }
    }
}

// Deterministic parallel sum of f(x[i]) over fixed chunks.
template <typename T, typename F>
double chunked_sum(int64_t n, const T* x, F chunk_fn) {
  const int64_t nchunks = (n + kSumChunk - 1) / kSumChunk;
  if (nchunks <= 1) return n > 0 ? chunk_fn(n, x) : 0.0;
  std::vector<double> partial(static_cast<size_t>(nchunks));
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t i0 = c * kSumChunk;
    partial[c] = chunk_fn(std::min(kSumChunk, n - i0), x + i0);
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

}  // namespace

template <typename T>
void reduce(ReduceOp op, int64_t outer, int64_t dim, int64_t inner, const T* x, T* out) {
  KILN_CHECK(outer >= 0 && dim >= 0 && inner >= 0, "[reduce] negative size ({}, {}, {})", outer,
             dim, inner);
  if (outer == 0 || inner == 0) return;
  if (dim == 0) {
    KILN_CHECK(op == ReduceOp::Sum || op == ReduceOp::Mean, "[reduce] max/min over an empty dim");
    const T v = from_compute<T>(
        op == ReduceOp::Sum ? compute_t<T>(0) : std::numeric_limits<compute_t<T>>::quiet_NaN());
    for (int64_t i = 0; i < outer * inner; ++i) out[i] = v;
    return;
  }
  if (inner > 1) return reduce_inner(op, outer, dim, inner, x, out);
  if (outer == 1 && (op == ReduceOp::Sum || op == ReduceOp::Mean)) {
    const double s = chunked_sum(dim, x, [](int64_t n, const T* p) { return run_sum(n, p); });
    out[0] = from_compute<T>(op == ReduceOp::Mean ? s / double(dim) : s);
    return;
  }
  // Row reductions.
#pragma omp parallel for schedule(static) if (outer * dim > kParallelMin)
  for (int64_t o = 0; o < outer; ++o) {
    const T* row = x + o * dim;
    switch (op) {
      case ReduceOp::Sum:
        out[o] = from_compute<T>(run_sum(dim, row));
        break;
      case ReduceOp::Mean:
        out[o] = from_compute<T>(run_sum(dim, row) / double(dim));
        break;
      case ReduceOp::Max:
        out[o] = from_compute<T>(run_max(dim, row));
        break;
      case ReduceOp::Min:
        out[o] = from_compute<T>(run_min(dim, row));
        break;
    }
  }
}

template <typename T>
void argmax(int64_t outer, int64_t dim, int64_t inner, const T* x, int64_t* out) {
  KILN_CHECK(outer >= 0 && dim >= 0 && inner >= 0, "[argmax] negative size ({}, {}, {})", outer,
             dim, inner);
  if (outer == 0 || inner == 0) return;
  KILN_CHECK(dim > 0, "[argmax] empty dim");
#pragma omp parallel for collapse(2) schedule(static) if (outer * dim * inner > kParallelMin)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const T* p = x + o * dim * inner + i;
      compute_t<T> best = to_compute(p[0]);
      int64_t bi = 0;
      if (best == best) {  // stop at the first NaN: it is the maximum
        for (int64_t d = 1; d < dim; ++d) {
          const compute_t<T> v = to_compute(p[d * inner]);
          if (v != v) {
            bi = d;
            break;
          }
          if (v > best) best = v, bi = d;
        }
      }
      out[o * inner + i] = bi;
    }
}

template <typename T>
void sum_all(int64_t n, const T* x, T* out) {
  KILN_CHECK(n >= 0, "[sum_all] negative size {}", n);
  out[0] = from_compute<T>(chunked_sum(n, x, [](int64_t m, const T* p) { return run_sum(m, p); }));
}

template <typename T>
double sum_squares(int64_t n, const T* x) {
  KILN_CHECK(n >= 0, "[sum_squares] negative size {}", n);
  return chunked_sum(n, x, [](int64_t m, const T* __restrict p) {
    double s = 0;
    if constexpr (is_half_v<T>) {
      // Widened to f32 in blocks by the vectorized conversions (a per-element scalar
      // conversion kept this loop from vectorizing: 1 ns per element, the gradient norm's
      // whole cost in training); the squares still add up in double.
      constexpr int64_t kBlock = 512;
      float buf[kBlock];
      for (int64_t i0 = 0; i0 < m; i0 += kBlock) {
        const int64_t len = std::min(kBlock, m - i0);
        const float* __restrict w = widen(len, p + i0, buf);
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < len; ++i) {
          const double v = static_cast<double>(w[i]);
          s += v * v;
        }
      }
      return s;
    }
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < m; ++i) {
      const double v = static_cast<double>(to_compute(p[i]));
      s += v * v;
    }
    return s;
  });
}

#define KILN_REDUCE_INST(T)                                                   \
  template void reduce<T>(ReduceOp, int64_t, int64_t, int64_t, const T*, T*); \
  template void argmax<T>(int64_t, int64_t, int64_t, const T*, int64_t*);     \
  template void sum_all<T>(int64_t, const T*, T*);                            \
  template double sum_squares<T>(int64_t, const T*);
KILN_REDUCE_INST(float)
KILN_REDUCE_INST(double)
KILN_REDUCE_INST(bf16)
KILN_REDUCE_INST(f16)
#undef KILN_REDUCE_INST

}  // namespace kiln::cpu
