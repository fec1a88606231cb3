// Causal scaled-dot-product attention with grouped-query heads, CPU.
//
// Layouts are those of the linear projections, no transposes:
//   q, out, dq:  (B, Tq, Hq, D) contiguous
//   k, v:        (B, Tk, Hkv, D) with batch b starting at b * kv_batch_stride elements, so a KV
//                cache of capacity Tmax >= Tk (kv_batch_stride = Tmax * Hkv * D) can be passed
//   lse:         (B, Hq, Tq), log-sum-exp of the scaled scores of each query row, in compute_t<T>
//                (f32 for bf16)
//   dk, dv:      (B, T, Hkv, D) contiguous (training layout)
// Query head h reads kv head h / (Hq / Hkv). Query i (0-based) sits at absolute position
// q_offset + i and sees keys j <= q_offset + i (q_offset = Tk - Tq when decoding with a cache,
// 0 in training); q_offset + Tq <= Tk.
//
// forward:  S = scale * q k^T (masked),  P = softmax(S),  out = P v                (out, lse =)
// backward (Tq == Tk = T, q_offset 0, k/v contiguous):
//           P = exp(S - lse),  dv = P^T dout,  dP = dout v^T,  Di = rowsum(dout * out),
//           dS = P * (dP - Di),  dq = scale * dS k,  dk = scale * dS^T q     (dq, dk, dv =)
//           GQA: dk, dv of a kv head sum over its Hq/Hkv query heads.
//
// Work is split in query blocks of at most 64 rows; a block of scores (<= 64 x Tk) lives in a
// per-thread buffer, never the whole T x T matrix. Score and value products go to OpenBLAS
// (single-threaded inside our OpenMP region). Backward runs one task per (b, kv head), so the
// gradient sums over a group of query heads have a fixed order: results are deterministic and
// independent of the thread count. With Tq == 1 (decode) the query heads of one kv head form
// one block, so the cache is read once per kv head.
//
// T is float, double or bf16 (storage; bf16 computes in f32: attention_bf16.cpp).
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

template <typename T>
void attention_forward(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                       int64_t q_offset, double scale, const T* q, const T* k, const T* v,
                       int64_t kv_batch_stride, T* out, compute_t<T>* lse);

template <typename T>
void attention_backward(int64_t B, int64_t T_, int64_t Hq, int64_t Hkv, int64_t D, double scale,
                        const T* q, const T* k, const T* v, const T* out, const compute_t<T>* lse,
                        const T* dout, T* dq, T* dk, T* dv);

template <>
void attention_forward<bf16>(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t q_offset, double scale, const bf16* q, const bf16* k,
                             const bf16* v, int64_t kv_batch_stride, bf16* out, float* lse);
// f16 storage (an f16 model's prefill and KV-cache decode): attention_bf16.cpp's forward with f16
// rows widened by F16C (no AMX tiles, no vdpbf16ps). The backward has no f16 kernel.
template <>
void attention_forward<f16>(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                            int64_t q_offset, double scale, const f16* q, const f16* k,
                            const f16* v, int64_t kv_batch_stride, f16* out, float* lse);
template <>
void attention_backward<bf16>(int64_t B, int64_t T_, int64_t Hq, int64_t Hkv, int64_t D,
                              double scale, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* out, const float* lse, const bf16* dout, bf16* dq,
                              bf16* dk, bf16* dv);

}  // namespace kiln::cpu
