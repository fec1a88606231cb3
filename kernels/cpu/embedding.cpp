// Embedding gather / scatter-add; see embedding.h.
#include "kernels/cpu/embedding.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/common/error.h"
#include "kernels/common/half.h"

namespace kiln::cpu {

void check_token_ids(int64_t n_tokens, int64_t vocab, const int32_t* ids) {
  KILN_CHECK(n_tokens >= 0 && vocab >= 0, "[embedding] negative size (tokens {}, vocab {})",
             n_tokens, vocab);
  for (int64_t t = 0; t < n_tokens; ++t)
    if (ids[t] < 0 || ids[t] >= vocab)
      fail("[embedding] token id {} out of range [0, {})", ids[t], vocab);
}

template <typename T>
void embedding_forward(int64_t n_tokens, int64_t vocab, int64_t dim, const int32_t* ids,
                       const T* table, T* out) {
  KILN_CHECK(dim >= 0, "[embedding] negative dim {}", dim);
  check_token_ids(n_tokens, vocab, ids);
#pragma omp parallel for schedule(static) if (n_tokens * dim > 65536)
  for (int64_t t = 0; t < n_tokens; ++t)
    std::memcpy(out + t * dim, table + static_cast<int64_t>(ids[t]) * dim,
                static_cast<size_t>(dim) * sizeof(T));
}

template <typename T>
void embedding_backward(int64_t n_tokens, int64_t vocab, int64_t dim, const int32_t* ids,
                        const T* dout, T* dtable) {
  KILN_CHECK(dim >= 0, "[embedding_backward] negative dim {}", dim);
  check_token_ids(n_tokens, vocab, ids);
  // Column blocks of at least 16 values (a cache line of floats) so threads never share lines.
  const bool par = n_tokens * dim > 65536 && dim >= 32;
#pragma omp parallel if (par)
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t blocks = (dim + 15) / 16;
    const int64_t c0 = std::min(dim, blocks * tid / nt * 16);
    const int64_t c1 = std::min(dim, blocks * (tid + 1) / nt * 16);
    if (c0 < c1) {
      for (int64_t t = 0; t < n_tokens; ++t) {
        T* __restrict dst = dtable + static_cast<int64_t>(ids[t]) * dim;
        const T* __restrict src = dout + t * dim;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }
}

#define KILN_EMBEDDING_INST(T)                                                                 \
  template void embedding_forward<T>(int64_t, int64_t, int64_t, const int32_t*, const T*, T*); \
  template void embedding_backward<T>(int64_t, int64_t, int64_t, const int32_t*, const T*, T*);
KILN_EMBEDDING_INST(float)
KILN_EMBEDDING_INST(double)
#undef KILN_EMBEDDING_INST
// The gather copies rows as they are stored: bf16 tables are read in place (decode would
// otherwise widen the whole table to f32 for one row).
template void embedding_forward<bf16>(int64_t, int64_t, int64_t, const int32_t*, const bf16*,
                                      bf16*);

}  // namespace kiln::cpu
