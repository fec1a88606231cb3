// Token embedding.
//   embedding_forward:  out[t, :] = table[ids[t], :]           (=)    out: (n_tokens, dim)
//   embedding_backward: dtable[ids[t], :] += dout[t, :]        (+=)   dtable: (vocab, dim)
// Every id is checked against [0, vocab) before anything is written, so a bad id leaves the
// outputs untouched. The backward is deterministic: threads split the dim columns, and each
// column adds tokens in order, exactly as a serial loop would.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// Throws kiln::Error "[embedding] token id X out of range [0, V)" for a bad id.
void check_token_ids(int64_t n_tokens, int64_t vocab, const int32_t* ids);

template <typename T>
void embedding_forward(int64_t n_tokens, int64_t vocab, int64_t dim, const int32_t* ids,
                       const T* table, T* out);

template <typename T>
void embedding_backward(int64_t n_tokens, int64_t vocab, int64_t dim, const int32_t* ids,
                        const T* dout, T* dtable);

}  // namespace kiln::cpu
