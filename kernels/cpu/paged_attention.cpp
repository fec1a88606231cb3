// Causal attention over a paged KV cache; the math and layouts are in paged_attention.h.
#include "kernels/cpu/paged_attention.h"

#include <omp.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/isa.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

// The two sums per key, for float math (f32 and bf16 caches), in an order that vectorizes and is
// the same at every ISA level, so a row's bits depend only on its own data:
//   score: 16 lanes, lane l adds q_d * k_d for d = l (mod 16) with one fma each, d ascending;
//          then the lanes as a fixed tree: l + (l + 8), then + 4, then + 2, then + 1.
//   output: acc_d = fma(p_j, v_d, acc_d), keys in position order.
// Scalar code (std::fma) and the AVX2 / AVX-512 paths below compute the same bits.

template <typename T>
float load_f32(const T* p) {
  return static_cast<float>(to_compute(*p));
}

// Finishes a score: the dims past the last whole 16 into their lanes, then the tree.
template <typename T>
float finish_lanes(float* lane, const float* q, const T* k, int64_t d0, int64_t D) {
  for (int64_t d = d0; d < D; ++d) lane[d % 16] = std::fma(q[d], load_f32(k + d), lane[d % 16]);
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

template <typename T>
float dot_lanes_scalar(int64_t D, const float* q, const T* k) {
  float lane[16] = {};
  return finish_lanes(lane, q, k, 0, D);
}

template <typename T>
void axpy_scalar(int64_t D, float p, const T* v, float* acc) {
  for (int64_t d = 0; d < D; ++d) acc[d] = std::fma(p, load_f32(v + d), acc[d]);
}

#if KILN_CPU_X86
template <typename T>
KILN_TARGET_AVX2 float dot_lanes_avx2(int64_t D, const float* q, const T* k) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();  // lanes 0-7 and 8-15
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_f32x8(k + d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load_f32x8(k + d + 8), a1);
  }
  alignas(32) float lane[16];
  _mm256_store_ps(lane, a0);
  _mm256_store_ps(lane + 8, a1);
  return finish_lanes(lane, q, k, d, D);
}

template <typename T>
KILN_TARGET_AVX2 void axpy_avx2(int64_t D, float p, const T* v, float* acc) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t d = 0;
  for (; d + 8 <= D; d += 8)
    _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pv, load_f32x8(v + d), _mm256_loadu_ps(acc + d)));
  for (; d < D; ++d) acc[d] = std::fma(p, load_f32(v + d), acc[d]);
}

template <typename T>
KILN_TARGET_AVX512 float dot_lanes_avx512(int64_t D, const float* q, const T* k) {
  __m512 a = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load_f32x16(k + d), a);
  alignas(64) float lane[16];
  _mm512_store_ps(lane, a);
  return finish_lanes(lane, q, k, d, D);
}

template <typename T>
KILN_TARGET_AVX512 void axpy_avx512(int64_t D, float p, const T* v, float* acc) {
  const __m512 pv = _mm512_set1_ps(p);
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(pv, load_f32x16(v + d), _mm512_loadu_ps(acc + d)));
  for (; d < D; ++d) acc[d] = std::fma(p, load_f32(v + d), acc[d]);
}
#endif

// The float-math sums at the current ISA level.
template <typename T>
struct FloatSums {
  float (*dot)(int64_t, const float*, const T*) = dot_lanes_scalar<T>;
  void (*axpy)(int64_t, float, const T*, float*) = axpy_scalar<T>;
  FloatSums() {
#if KILN_CPU_X86
    if (cpu_has(CpuIsa::Avx512)) {
      dot = dot_lanes_avx512<T>;
      axpy = axpy_avx512<T>;
    } else if (cpu_has(CpuIsa::Avx2)) {
      dot = dot_lanes_avx2<T>;
      axpy = axpy_avx2<T>;
    }
#endif
  }
};

// Doubles (the f64 cache, for tests): plain sums in index order.
struct DoubleSums {
  static double dot(int64_t D, const double* q, const double* k) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
    return s;
  }
  static void axpy(int64_t D, double p, const double* v, double* acc) {
    for (int64_t d = 0; d < D; ++d) acc[d] += p * v[d];
  }
};

}  // namespace

template <typename T>
void paged_attention_forward(int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t block_size,
                             int64_t max_blocks, double scale, const T* q, const T* k_pool,
                             const T* v_pool, const int32_t* block_tables, const int32_t* token_seq,
                             const int32_t* token_pos, T* out) {
  using C = compute_t<T>;
  using Sums = std::conditional_t<std::is_same_v<C, double>, DoubleSums, FloatSums<T>>;
  const Sums sums;
  const int64_t group = Hq / Hkv;
  const int64_t slot_stride = Hkv * D;  // elements between consecutive positions in a block
#pragma omp parallel
  {
    std::vector<C> qc(static_cast<size_t>(D)), acc(static_cast<size_t>(D)), p;
#pragma omp for collapse(2) schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t pos = token_pos[i], kvh = h / group;
        const int32_t* table = block_tables + static_cast<int64_t>(token_seq[i]) * max_blocks;
        const T* qi = q + (i * Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) qc[d] = to_compute(qi[d]);
        p.resize(static_cast<size_t>(pos + 1));
        // Scores, then the max and the exponentials: one pass each, keys in position order.
        C m = -std::numeric_limits<C>::infinity();
        for (int64_t j = 0; j <= pos; ++j) {
          const int64_t row =
              static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
          p[j] =
              sums.dot(D, qc.data(), k_pool + row * slot_stride + kvh * D) * static_cast<C>(scale);
          m = p[j] > m ? p[j] : m;
        }
        C sum = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          p[j] = std::exp(p[j] - m);
          sum += p[j];
        }
        for (int64_t d = 0; d < D; ++d) acc[d] = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          const int64_t row =
              static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
          sums.axpy(D, p[j], v_pool + row * slot_stride + kvh * D, acc.data());
        }
        T* oi = out + (i * Hq + h) * D;
        const C inv = C(1) / sum;
        for (int64_t d = 0; d < D; ++d) oi[d] = from_compute<T>(acc[d] * inv);
      }
    }
  }
}

template void paged_attention_forward<float>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                             double, const float*, const float*, const float*,
                                             const int32_t*, const int32_t*, const int32_t*,
                                             float*);
template void paged_attention_forward<double>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                              double, const double*, const double*, const double*,
                                              const int32_t*, const int32_t*, const int32_t*,
                                              double*);
template void paged_attention_forward<bf16>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                            double, const bf16*, const bf16*, const bf16*,
                                            const int32_t*, const int32_t*, const int32_t*, bf16*);

}  // namespace kiln::cpu
