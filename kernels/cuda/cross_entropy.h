// Fused log-softmax + negative log-likelihood on CUDA (kernels in cross_entropy.cu). Plain C++
// header (compiled by g++ too). Same math as kernels/cpu/cross_entropy.h:
//
//   forward:  lse[n]  = log sum_v exp(logits[n, v])                                     (=)
//             loss[n] = (max_n - logits[n, t_n]) + log sum_v exp(logits[n, v] - max_n),
//                       0 when t_n == ignore_index                                         (=)
//   backward: dlogits[n, v] = dloss[n] * (exp(logits[n, v] - lse[n]) - [v == t_n])         (=)
//             rows with t_n == ignore_index get 0.
//
// logits: (N, V) in T (f32, bf16, f16), rows `ld` elements apart (ld >= V), unit stride inside
// a row; targets: (N) i32 dense; loss, lse: (N) f32 dense; dloss, lse in the backward: (N) f32
// with element strides (0 allowed: a broadcast upstream gradient); dlogits: (N, V) in T, dense.
// All arithmetic is f32 (exp through exp2f). Never materializes (N, V) in f32: one block per row
// makes one pass in the forward (online max and sum of exp per thread, vector loads, merged
// across the block) and one read-modify-write pass in the backward. No scratch memory, so the
// meta dry run (which allocates only the outputs) stays exact.
//
// dlogits may alias logits (in place, then ld == V): every element is read and then written by
// the same thread, and the one-hot term comes from the index, not from a re-read of the target
// logit.
//
// Bad targets (outside [0, V) and != ignore_index): the CPU kernel throws before writing. On the
// GPU the kernels cannot throw, so
//   - the forward writes loss[n] = NaN for such a row (so a mean loss is NaN, and the
//     trainer's finite-loss check stops), and the backward writes a NaN row of dlogits;
//   - both record the smallest bad row (and its target) in a sticky device word;
//   - cross_entropy_take_bad_target() reads and clears it (a device sync). The op front end
//     (tensor/kernels_cuda_loss.cpp) calls it before every backward launch and throws the CPU's
//     message ("[cross_entropy] target ... out of range"), before the gradient is written.
// So a bad batch never trains silently: its loss is NaN and its backward fails.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/common/half.h"  // KILN_HOST_DEVICE
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

template <typename T>
void cross_entropy_forward(std::int64_t N, std::int64_t V, std::int64_t ld, const T* logits,
                           const std::int32_t* targets, std::int32_t ignore_index, float* loss,
                           float* lse, StreamHandle stream = nullptr);

template <typename T>
void cross_entropy_backward(std::int64_t N, std::int64_t V, std::int64_t ld, const T* logits,
                            const float* lse, std::int64_t lse_stride, const std::int32_t* targets,
                            std::int32_t ignore_index, const float* dloss,
                            std::int64_t dloss_stride, T* dlogits, StreamHandle stream = nullptr);

// ---- bad-target flag ----------------------------------------------------------------------------
// The device word holds encode_bad_target(row, target) of the smallest bad row seen since the last
// take (atomicMin: the row sits in the high 32 bits), or kNoBadTarget. Rows must be < 2^31 (the
// launchers check N).
inline constexpr std::uint64_t kNoBadTarget = ~std::uint64_t{0};
KILN_HOST_DEVICE constexpr std::uint64_t encode_bad_target(std::int64_t row, std::int32_t target) {
  return (static_cast<std::uint64_t>(row) << 32) | static_cast<std::uint32_t>(target);
}
struct BadTarget {
  std::int64_t row;
  std::int32_t target;
};
constexpr std::optional<BadTarget> decode_bad_target(std::uint64_t code) {
  if (code == kNoBadTarget) return std::nullopt;
  return BadTarget{static_cast<std::int64_t>(code >> 32),
                   static_cast<std::int32_t>(static_cast<std::uint32_t>(code & 0xffffffffu))};
}

// Reads the word of the current device and resets it (synchronizes `stream`).
#if defined(KILN_CUDA)
std::uint64_t cross_entropy_take_bad_target(StreamHandle stream = nullptr);
#else
// CPU-only build: tests/tensor/test_cuda_loss.cpp names it after its no-GPU skip, which only an
// optimizing compiler drops; at -O0 (the sanitizer job's test binaries) the call must link.
inline std::uint64_t cross_entropy_take_bad_target(StreamHandle = nullptr) {
  no_cuda("cross_entropy_take_bad_target");
}
#endif

}  // namespace kiln::cuda
