// Token embedding on CUDA, with the math of kernels/cpu/embedding.h:
//   embedding_forward:  out[t, :] = table[ids[t], :]                 (=)   out: (n_tokens, dim)
//   embedding_backward: dtable[ids[t], :] += dout[t, :]              (+=)  dtable: (vocab, dim)
// ids: (n_tokens) i32 contiguous; table, out, dout, dtable contiguous.
//
// Ids are validated by embedding_first_bad_token() (the front end calls it before either kernel,
// so a bad id leaves every output untouched, as on the CPU). The kernels themselves never read
// or write out of bounds: the forward writes a zero row for an id outside [0, vocab) and the
// backward skips it.
//
// The backward is deterministic (no float atomics): the (id, position) pairs are sorted by id
// with a stable radix sort (cub), so each id's positions come out in increasing order; then one
// block per run of equal ids (and per column slice) sums the run's dout rows in that order in
// f32 and adds the sum to the table row once, rounding once to dtable's type. Every id owns one
// run, so no two blocks touch the same dtable row. dout and dtable may have different types
// (bf16 activations into an f32 gradient, or bf16 into bf16).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/activation.h"  // pack_elems, aligned16
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

// ---- launch shape (plain C++, tested on the CPU) ------------------------------------------------

// Threads per block for rows of `dim` elements accessed `vec` at a time: one thread per access,
// rounded up to a warp, between 32 and 256.
inline int embedding_threads(std::int64_t dim, int vec) {
  const std::int64_t accesses = (dim + vec - 1) / vec;
  const std::int64_t t = (accesses + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

// ---- launchers
// -----------------------------------------------------------------------------------

template <typename T>
void embedding_forward(std::int64_t n_tokens, std::int64_t vocab, std::int64_t dim,
                       const std::int32_t* ids, const T* table, T* out, StreamHandle stream);

// Index of the first token whose id lies outside [0, vocab), or -1 when all are valid. Waits for
// `stream` (one 8-byte read back). Returns -1 without checking while `stream` is capturing a CUDA
// graph (a capture cannot synchronize); the kernels stay in bounds either way. Uses one
// device-global slot, so calls must not overlap on different streams.
std::int64_t embedding_first_bad_token(std::int64_t n_tokens, std::int64_t vocab,
                                       const std::int32_t* ids, StreamHandle stream);

// Bytes of device workspace embedding_backward needs for n_tokens (sorted keys and positions,
// cub's temporary storage), with room for 256-byte alignment of each part.
std::size_t embedding_backward_workspace_bytes(std::int64_t n_tokens);

// dtable += scatter(dout). G (dtable) and O (dout): float, bf16 or f16, any pair.
template <typename G, typename O>
void embedding_backward(std::int64_t n_tokens, std::int64_t vocab, std::int64_t dim,
                        const std::int32_t* ids, const O* dout, G* dtable, void* workspace,
                        std::size_t workspace_bytes, StreamHandle stream);

}  // namespace kiln::cuda
