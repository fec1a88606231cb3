// Fused log-softmax + negative log-likelihood, CPU. Log-probabilities are never stored.
// logits, dlogits: (N, V) contiguous; targets, loss, lse, dloss: (N).
//
// forward:  lse[n] = log sum_v exp(logits[n, v])                                      (=)
//           loss[n] = lse[n] - logits[n, targets[n]], or 0 when targets[n] == ignore_index (=)
// backward: dlogits[n, v] = dloss[n] * (exp(logits[n, v] - lse[n]) - [v == targets[n]])  (=)
//           rows with targets[n] == ignore_index get 0.
// Reductions (mean over non-ignored rows, etc.) belong to the caller through loss/dloss.
// dlogits may alias logits (the gradient overwrites the logits in place, saving an N x V
// buffer). Targets outside [0, V) other than ignore_index throw kiln::Error before any write.
// The forward lse of ignored rows is still computed (harmless, and useful for perplexity).
//
// T is float, double or bf16; loss, lse and dloss are in compute_t<T> (f32 for bf16). A bf16 row
// is read in chunks widened to f32 on the stack (kComputeChunk elements), never as an N x V f32
// copy; backward writes each chunk's gradient rounded once to bf16.
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

template <typename T>
void cross_entropy_forward(int64_t N, int64_t V, const T* logits, const int32_t* targets,
                           int32_t ignore_index, compute_t<T>* loss, compute_t<T>* lse);
template <typename T>
void cross_entropy_backward(int64_t N, int64_t V, const T* logits, const compute_t<T>* lse,
                            const int32_t* targets, int32_t ignore_index, const compute_t<T>* dloss,
                            T* dlogits);

}  // namespace kiln::cpu
