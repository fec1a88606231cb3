// Fused cross-entropy (math in cross_entropy.h). One row per task; a row (V up to ~150k) is
// read twice in forward (max, then sum of exp) and once in backward. exp is exp_fast (float,
// vectorized); sums are carried in double. bf16 rows go through a stack chunk of f32.
#include "kernels/cpu/cross_entropy.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/error.h"
#include "kernels/cpu/activation.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements

void check_targets(int64_t N, int64_t V, const int32_t* targets, int32_t ignore_index) {
  KILN_CHECK(N >= 0 && V > 0, "[cross_entropy] bad sizes N={} V={}", N, V);
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    if (t == ignore_index) continue;
    KILN_CHECK(t >= 0 && t < V, "[cross_entropy] target {} out of range [0, {}) at row {}", t, V,
               n);
  }
}

template <typename T>
KILN_SIMD_CLONES T row_max(int64_t V, const T* row) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; ++v) mx = row[v] > mx ? row[v] : mx;
  return mx;
}

// sum_v exp(row[v] - mx), carried in double.
template <typename T>
KILN_SIMD_CLONES double row_sumexp(int64_t V, const T* row, T mx) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < V; ++v) sum += double(detail::exp_fast(T(row[v] - mx)));
  return sum;
}

// drow[v] = g * exp(row[v] - l); drow may alias row.
template <typename T>
KILN_SIMD_CLONES void row_grad(int64_t V, const T* row, T l, T g, T* drow) {
#pragma omp simd
  for (int64_t v = 0; v < V; ++v) drow[v] = g * detail::exp_fast(T(row[v] - l));
}

// Returns sum_v exp(row[v] - max) and sets mx = max_v row[v]. A bf16 row is widened a chunk at
// a time into buf (two passes: max, then the sum).
template <typename T>
double row_max_sumexp(int64_t V, const T* row, compute_t<T>& mx, compute_t<T>* buf) {
  if constexpr (!is_half_v<T>) {
    (void)buf;
    mx = row_max(V, row);
    return row_sumexp(V, row, mx);
  } else {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v0 = 0; v0 < V; v0 += kComputeChunk) {
      const int64_t n = std::min(kComputeChunk, V - v0);
      m = std::max(m, row_max(n, widen(n, row + v0, buf)));
    }
    double sum = 0;
    for (int64_t v0 = 0; v0 < V; v0 += kComputeChunk) {
      const int64_t n = std::min(kComputeChunk, V - v0);
      sum += row_sumexp(n, widen(n, row + v0, buf), m);
    }
    mx = m;
    return sum;
  }
}

}  // namespace

template <typename T>
void cross_entropy_forward(int64_t N, int64_t V, const T* logits, const int32_t* targets,
                           int32_t ignore_index, compute_t<T>* loss, compute_t<T>* lse) {
  using C = compute_t<T>;
  check_targets(N, V, targets, ignore_index);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    C buf[is_half_v<T> ? kComputeChunk : 1];
    const T* row = logits + n * V;
    C mx;
    const double sum = row_max_sumexp(V, row, mx, buf);
    const double log_sum = std::log(sum);
    // A row of all -inf has no finite max: its lse is -inf, as log(0) would be.
    lse[n] = std::isfinite(mx) ? C(double(mx) + log_sum) : mx;
    // (max - target) + log(sum) rather than lse - target: keeps the digits of a small loss when
    // the logits are large (lse rounded to C would lose them).
    loss[n] = targets[n] == ignore_index
                  ? C(0)
                  : C((double(mx) - double(to_compute(row[targets[n]]))) + log_sum);
  }
}

template <typename T>
void cross_entropy_backward(int64_t N, int64_t V, const T* logits, const compute_t<T>* lse,
                            const int32_t* targets, int32_t ignore_index, const compute_t<T>* dloss,
                            T* dlogits) {
  using C = compute_t<T>;
  check_targets(N, V, targets, ignore_index);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    T* drow = dlogits + n * V;
    const int32_t t = targets[n];
    if (t == ignore_index) {
      std::fill(drow, drow + V, from_compute<T>(0.0f));
      continue;
    }
    const C l = lse[n], g = dloss[n];
    const C target_logit = to_compute(row[t]);  // read before the row is overwritten (aliased)
    if constexpr (!is_half_v<T>) {
      row_grad(V, row, l, g, drow);
    } else {
      // Each chunk is widened before its gradient overwrites it, so drow may alias row.
      C buf[kComputeChunk];
      for (int64_t v0 = 0; v0 < V; v0 += kComputeChunk) {
        const int64_t c = std::min(kComputeChunk, V - v0);
        to_compute_n(c, row + v0, buf);
        row_grad(c, buf, l, g, buf);
        from_compute_n(c, buf, drow + v0);
      }
    }
    drow[t] = from_compute<T>(g * (detail::exp_fast(C(target_logit - l)) - C(1)));
  }
}

#define KILN_INSTANTIATE(T)                                                                   \
  template void cross_entropy_forward<T>(int64_t, int64_t, const T*, const int32_t*, int32_t, \
                                         compute_t<T>*, compute_t<T>*);                       \
  template void cross_entropy_backward<T>(int64_t, int64_t, const T*, const compute_t<T>*,    \
                                          const int32_t*, int32_t, const compute_t<T>*, T*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
KILN_INSTANTIATE(bf16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
