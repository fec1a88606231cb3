// Causal attention over a paged KV cache; the math and layouts are in paged_attention.h.
#include "kernels/cpu/paged_attention.h"

#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kiln::cpu {
namespace {

// q_i . k_j over D dims, widened to C, in index order.
template <typename T, typename C>
C dot_row(int64_t D, const C* q, const T* k) {
  C s = 0;
  for (int64_t d = 0; d < D; ++d) s += q[d] * to_compute(k[d]);
  return s;
}

}  // namespace

template <typename T>
void paged_attention_forward(int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t block_size,
                             int64_t max_blocks, double scale, const T* q, const T* k_pool,
                             const T* v_pool, const int32_t* block_tables, const int32_t* token_seq,
                             const int32_t* token_pos, T* out) {
  using C = compute_t<T>;
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
          p[j] = dot_row<T, C>(D, qc.data(), k_pool + row * slot_stride + kvh * D) *
                 static_cast<C>(scale);
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
          const T* vj = v_pool + row * slot_stride + kvh * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += p[j] * to_compute(vj[d]);
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
