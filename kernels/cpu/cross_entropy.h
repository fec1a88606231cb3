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
#pragma once

#include <cstdint>

namespace kiln::cpu {

template <typename T>
void cross_entropy_forward(int64_t N, int64_t V, const T* logits, const int32_t* targets,
                           int32_t ignore_index, T* loss, T* lse);
template <typename T>
void cross_entropy_backward(int64_t N, int64_t V, const T* logits, const T* lse,
                            const int32_t* targets, int32_t ignore_index, const T* dloss,
                            T* dlogits);

}  // namespace kiln::cpu
