// RMSNorm and LayerNorm, forward and backward (math in norm.h). Row statistics are summed in
// double (vectorized), outputs stored in T. Rows are independent in forward; in backward the
// weight gradients go through per-chunk partial buffers so the result does not depend on
// scheduling or thread count.
#include "kernels/cpu/norm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/isa.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; below this stay on one thread
constexpr int64_t kMaxChunks = 64;         // dw/db partial buffers (fixed, not per thread)

struct Chunks {
  int64_t count, rows_per;
};
Chunks row_chunks(int64_t rows) {
  const int64_t want = std::min<int64_t>(rows, kMaxChunks);
  const int64_t per = want > 0 ? (rows + want - 1) / want : 1;
  return {want > 0 ? (rows + per - 1) / per : 0, per};
}

void check_sizes(const char* op, int64_t rows, int64_t dim) {
  KILN_CHECK(rows >= 0 && dim > 0, "[{}] bad sizes rows={} dim={}", op, rows, dim);
}

// dst[j] += sum_c part[c * dim + j], chunks added in order c = 0, 1, ...
template <typename T>
void reduce_chunks(int64_t nchunks, int64_t dim, const std::vector<T>& part, T* dst) {
#pragma omp parallel for schedule(static) if (nchunks * dim >= kParallelMin)
  for (int64_t j = 0; j < dim; ++j) {
    T acc = 0;
    for (int64_t c = 0; c < nchunks; ++c) acc += part[c * dim + j];
    dst[j] += acc;
  }
}

// Per-thread row buffers in compute type for 16-bit storage (empty for f32/f64, whose rows are
// used in place): one row of dim values each, a few KiB for model widths.
template <typename T>
struct RowBuffers {
  std::vector<compute_t<T>> a, b, c;
  explicit RowBuffers(int64_t dim) {
    if constexpr (is_half_v<T>) {
      a.resize(static_cast<size_t>(dim));
      b.resize(static_cast<size_t>(dim));
      c.resize(static_cast<size_t>(dim));
    }
  }
};

#if KILN_CPU_X86
// One bf16 RMSNorm row with AVX-512 (dim % 16 == 0), w already widened: the sum of squares in
// double (8-lane FMAs), y = (x rs) w in f32 rounded once, as the loop below does (same products,
// same rounding bits as half.h); only the order of the double sum differs. The bf16 prefill
// normalizes 12k rows of q/k heads per layer: the generic loop (baseline SSE2, widen, double
// sum, narrow) took about 7% of a Qwen3-0.6B prefill.
KILN_TARGET_AVX512 void rmsnorm_row_bf16(int64_t dim, double eps, const bf16* x, const float* w,
                                         bf16* y, float* rstd) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  for (int64_t j = 0; j < dim; j += 16) {
    const __m512 v = load_bf16x16(x + j);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    acc0 = _mm512_fmadd_pd(lo, lo, acc0);
    acc1 = _mm512_fmadd_pd(hi, hi, acc1);
  }
  const double ss = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
  const float rs = float(1.0 / std::sqrt(ss / double(dim) + eps));
  *rstd = rs;
  const __m512 vrs = _mm512_set1_ps(rs);
  for (int64_t j = 0; j < dim; j += 16)
    store_bf16x16(y + j,
                  _mm512_mul_ps(_mm512_mul_ps(load_bf16x16(x + j), vrs), _mm512_loadu_ps(w + j)));
}
#endif

// Whether rmsnorm_forward<T> runs its rows through rmsnorm_row_bf16.
template <typename T>
bool rmsnorm_rows_avx512(int64_t dim) {
#if KILN_CPU_X86
  return std::is_same_v<T, bf16> && dim % 16 == 0 && cpu_has(CpuIsa::Avx512);
#else
  (void)dim;
  return false;
#endif
}

}  // namespace

// Each row is read through a compute buffer (widen: in place for f32/f64, a per-thread row of
// compute values for 16-bit storage), so the loops below run on C only.
template <typename T>
void rmsnorm_forward(int64_t rows, int64_t dim, double eps, const T* x, const T* w, T* y,
                     compute_t<T>* rstd) {
  using C = compute_t<T>;
  check_sizes("rmsnorm", rows, dim);
  RowBuffers<T> wb(dim);
  const C* wc = widen(dim, w, wb.a.data());
  [[maybe_unused]] const bool avx512_rows = rmsnorm_rows_avx512<T>(dim);
#pragma omp parallel if (rows * dim >= kParallelMin)
  {
    RowBuffers<T> buf(dim);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
#if KILN_CPU_X86
      if constexpr (std::is_same_v<T, bf16>) {
        if (avx512_rows) {
          rmsnorm_row_bf16(dim, eps, x + r * dim, wc, y + r * dim, rstd + r);
          continue;
        }
      }
#endif
      const C* xr = widen(dim, x + r * dim, buf.a.data());
      C* yr = out_row(y + r * dim, buf.b.data());
      double ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < dim; ++j) ss += double(xr[j]) * double(xr[j]);
      const C rs = C(1.0 / std::sqrt(ss / double(dim) + eps));
      rstd[r] = rs;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * rs * wc[j];
      narrow(dim, yr, y + r * dim);
    }
  }
}

template <typename T>
void rmsnorm_backward(int64_t rows, int64_t dim, const T* x, const T* w, const compute_t<T>* rstd,
                      const T* dy, T* dx, compute_t<T>* dw) {
  using C = compute_t<T>;
  check_sizes("rmsnorm", rows, dim);
  const Chunks ch = row_chunks(rows);
  std::vector<C> part(static_cast<size_t>(ch.count * dim), C(0));
  RowBuffers<T> wb(dim);
  const C* wc = widen(dim, w, wb.a.data());
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMin)
  for (int64_t c = 0; c < ch.count; ++c) {
    C* pw = part.data() + c * dim;
    RowBuffers<T> buf(dim);
    const int64_t r1 = std::min(rows, (c + 1) * ch.rows_per);
    for (int64_t r = c * ch.rows_per; r < r1; ++r) {
      const C* xr = widen(dim, x + r * dim, buf.a.data());
      const C* dyr = widen(dim, dy + r * dim, buf.b.data());
      C* dxr = out_row(dx + r * dim, buf.c.data());
      const C rs = rstd[r];
      double dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < dim; ++j) dot += double(wc[j]) * double(dyr[j]) * double(xr[j]);
      const C coef = C(double(rs) * double(rs) * double(rs) * dot / double(dim));
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        const C xj = xr[j], dyj = dyr[j];  // read before writing: dx may alias dy
        pw[j] += dyj * xj * rs;
        dxr[j] = rs * wc[j] * dyj - xj * coef;
      }
      narrow(dim, dxr, dx + r * dim);
    }
  }
  reduce_chunks(ch.count, dim, part, dw);
}

template <typename T>
void layernorm_forward(int64_t rows, int64_t dim, double eps, const T* x, const T* w, const T* b,
                       T* y, compute_t<T>* mean, compute_t<T>* rstd) {
  using C = compute_t<T>;
  check_sizes("layernorm", rows, dim);
  RowBuffers<T> wb(dim);
  const C* wc = widen(dim, w, wb.a.data());
  const C* bc = b ? widen(dim, b, wb.b.data()) : nullptr;
#pragma omp parallel if (rows * dim >= kParallelMin)
  {
    RowBuffers<T> buf(dim);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const C* xr = widen(dim, x + r * dim, buf.a.data());
      C* yr = out_row(y + r * dim, buf.b.data());
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < dim; ++j) s += double(xr[j]);
      const double mu = s / double(dim);
      double ss = 0;  // two-pass variance: no cancellation for rows with a large mean
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < dim; ++j) ss += (double(xr[j]) - mu) * (double(xr[j]) - mu);
      const C rs = C(1.0 / std::sqrt(ss / double(dim) + eps));
      const C m = C(mu);
      mean[r] = m;
      rstd[r] = rs;
      if (bc) {
#pragma omp simd
        for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * rs * wc[j] + bc[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * rs * wc[j];
      }
      narrow(dim, yr, y + r * dim);
    }
  }
}

template <typename T>
void layernorm_backward(int64_t rows, int64_t dim, const T* x, const T* w, const compute_t<T>* mean,
                        const compute_t<T>* rstd, const T* dy, T* dx, compute_t<T>* dw,
                        compute_t<T>* db) {
  using C = compute_t<T>;
  check_sizes("layernorm", rows, dim);
  const Chunks ch = row_chunks(rows);
  const bool with_db = db != nullptr;
  std::vector<C> part(static_cast<size_t>(ch.count * dim * (with_db ? 2 : 1)), C(0));
  RowBuffers<T> wb(dim);
  const C* wc = widen(dim, w, wb.a.data());
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMin)
  for (int64_t c = 0; c < ch.count; ++c) {
    C* pw = part.data() + c * dim;
    C* pb = with_db ? part.data() + (ch.count + c) * dim : nullptr;
    RowBuffers<T> buf(dim);
    const int64_t r1 = std::min(rows, (c + 1) * ch.rows_per);
    for (int64_t r = c * ch.rows_per; r < r1; ++r) {
      const C* xr = widen(dim, x + r * dim, buf.a.data());
      const C* dyr = widen(dim, dy + r * dim, buf.b.data());
      C* dxr = out_row(dx + r * dim, buf.c.data());
      const C m = mean[r], rs = rstd[r];
      double sg = 0, sgx = 0;  // sum_j g_j, sum_j g_j xhat_j with g = w dy
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < dim; ++j) {
        const double g = double(wc[j]) * double(dyr[j]);
        sg += g;
        sgx += g * (double(xr[j]) - double(m)) * double(rs);
      }
      const C mg = C(sg / double(dim)), mgx = C(sgx / double(dim));
      if (pb) {
#pragma omp simd
        for (int64_t j = 0; j < dim; ++j) pb[j] += dyr[j];
      }
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        const C xhat = (xr[j] - m) * rs, dyj = dyr[j];  // read before writing (dx may alias dy)
        pw[j] += dyj * xhat;
        dxr[j] = rs * (wc[j] * dyj - mg - xhat * mgx);
      }
      narrow(dim, dxr, dx + r * dim);
    }
  }
  reduce_chunks(ch.count, dim, part, dw);
  if (with_db) {
    std::vector<C> pb(part.begin() + ch.count * dim, part.end());
    reduce_chunks(ch.count, dim, pb, db);
  }
}

#define KILN_INSTANTIATE(T)                                                                      \
  template void rmsnorm_forward<T>(int64_t, int64_t, double, const T*, const T*, T*,             \
                                   compute_t<T>*);                                               \
  template void rmsnorm_backward<T>(int64_t, int64_t, const T*, const T*, const compute_t<T>*,   \
                                    const T*, T*, compute_t<T>*);                                \
  template void layernorm_forward<T>(int64_t, int64_t, double, const T*, const T*, const T*, T*, \
                                     compute_t<T>*, compute_t<T>*);                              \
  template void layernorm_backward<T>(int64_t, int64_t, const T*, const T*, const compute_t<T>*, \
                                      const compute_t<T>*, const T*, T*, compute_t<T>*,          \
                                      compute_t<T>*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(f16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
