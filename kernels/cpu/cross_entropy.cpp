// Fused cross-entropy (math in cross_entropy.h). One row per task; a row (V up to ~150k) is
// read twice in forward (max, then sum of exp) and once in backward. exp is exp_fast (float,
// vectorized); sums are carried in double.
#include "kernels/cpu/cross_entropy.h"

#include <omp.h>

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

// Returns sum_v exp(row[v] - max) and sets mx = max_v row[v].
template <typename T>
KILN_SIMD_CLONES double row_max_sumexp(int64_t V, const T* row, T& mx_out) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; ++v) mx = row[v] > mx ? row[v] : mx;
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < V; ++v) sum += double(detail::exp_fast(T(row[v] - mx)));
  mx_out = mx;
  return sum;
}

// drow[v] = g * exp(row[v] - l); drow may alias row.
template <typename T>
KILN_SIMD_CLONES void row_grad(int64_t V, const T* row, T l, T g, T* drow) {
#pragma omp simd
  for (int64_t v = 0; v < V; ++v) drow[v] = g * detail::exp_fast(T(row[v] - l));
}

}  // namespace

template <typename T>
void cross_entropy_forward(int64_t N, int64_t V, const T* logits, const int32_t* targets,
                           int32_t ignore_index, T* loss, T* lse) {
  check_targets(N, V, targets, ignore_index);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    T mx;
    const double sum = row_max_sumexp(V, row, mx);
    const double log_sum = std::log(sum);
    // A row of all -inf has no finite max: its lse is -inf, as log(0) would be.
    lse[n] = std::isfinite(mx) ? T(double(mx) + log_sum) : mx;
    // (max - target) + log(sum) rather than lse - target: keeps the digits of a small loss when
    // the logits are large (lse rounded to T would lose them).
    loss[n] = targets[n] == ignore_index ? T(0)
                                         : T((double(mx) - double(row[targets[n]])) + log_sum);
  }
}

template <typename T>
void cross_entropy_backward(int64_t N, int64_t V, const T* logits, const T* lse,
                            const int32_t* targets, int32_t ignore_index, const T* dloss,
                            T* dlogits) {
  check_targets(N, V, targets, ignore_index);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    T* drow = dlogits + n * V;
    const int32_t t = targets[n];
    if (t == ignore_index) {
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) drow[v] = T(0);
      continue;
    }
    const T l = lse[n], g = dloss[n];
    const T target_logit = row[t];  // read before the row is overwritten when aliased
    row_grad(V, row, l, g, drow);
    drow[t] = g * (detail::exp_fast(T(target_logit - l)) - T(1));
  }
}

#define KILN_INSTANTIATE(T)                                                                    \
  template void cross_entropy_forward<T>(int64_t, int64_t, const T*, const int32_t*, int32_t, \
                                         T*, T*);                                              \
  template void cross_entropy_backward<T>(int64_t, int64_t, const T*, const T*,               \
                                          const int32_t*, int32_t, const T*, T*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
