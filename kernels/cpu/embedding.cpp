// Embedding gather / scatter-add; see embedding.h.
#include "kernels/cpu/embedding.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/bf16_util.h"

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

namespace {

// f32/f64: threads own column blocks and add token by token.
template <typename T>
void embedding_backward_columns(int64_t n_tokens, int64_t dim, const int32_t* ids, const T* dout,
                                T* dtable) {
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

}  // namespace

template <typename T>
void embedding_backward(int64_t n_tokens, int64_t vocab, int64_t dim, const int32_t* ids,
                        const T* dout, T* dtable) {
  KILN_CHECK(dim >= 0, "[embedding_backward] negative dim {}", dim);
  check_token_ids(n_tokens, vocab, ids);
  if constexpr (is_half_v<T>) {
    // 16-bit storage: adding token by token would round dtable once per occurrence. Group the
    // tokens by id (stable, so each id's rows sum in token order), sum each id's rows in f32 and
    // add to its dtable row with one rounding. Different ids own different rows: no races.
    std::vector<int64_t> order(static_cast<size_t>(n_tokens));
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [ids](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    std::vector<int64_t> starts;  // first position in `order` of each distinct id
    for (int64_t k = 0; k < n_tokens; ++k)
      if (k == 0 || ids[order[k]] != ids[order[k - 1]]) starts.push_back(k);
    const int64_t groups = static_cast<int64_t>(starts.size());
    starts.push_back(n_tokens);
#pragma omp parallel if (n_tokens * dim > 65536)
    {
      std::vector<float> acc(static_cast<size_t>(dim)), row(static_cast<size_t>(dim));
#pragma omp for schedule(static)
      for (int64_t g = 0; g < groups; ++g) {
        T* dst = dtable + static_cast<int64_t>(ids[order[starts[g]]]) * dim;
        to_compute_n(dim, dst, acc.data());
        for (int64_t k = starts[g]; k < starts[g + 1]; ++k) {
          to_compute_n(dim, dout + order[k] * dim, row.data());
          for (int64_t c = 0; c < dim; ++c) acc[c] += row[c];
        }
        from_compute_n(dim, acc.data(), dst);
      }
    }
  } else {
    embedding_backward_columns(n_tokens, dim, ids, dout, dtable);
  }
}

#define KILN_EMBEDDING_INST(T)                                                                 \
  template void embedding_forward<T>(int64_t, int64_t, int64_t, const int32_t*, const T*, T*); \
  template void embedding_backward<T>(int64_t, int64_t, int64_t, const int32_t*, const T*, T*);
KILN_EMBEDDING_INST(float)
KILN_EMBEDDING_INST(double)
KILN_EMBEDDING_INST(bf16)
KILN_EMBEDDING_INST(f16)
#undef KILN_EMBEDDING_INST

}  // namespace kiln::cpu
