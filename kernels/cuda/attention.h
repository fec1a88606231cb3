// kiln's causal GQA attention on CUDA: planning (plain C++, tested on the CPU)
// and launchers.
//
// Math, layouts and the (=) semantics are those of kernels/cpu/attention.h:
//   q, out, dq: (B, Tq, Hq, D) contiguous; k, v: (B, Tk, Hkv, D), dense T/H/D,
//   batch b at b * kv_batch_stride (a KV cache view); lse: (B, Hq, Tq) f32,
//   natural log of sum_j exp(scale q.k_j); dk, dv: (B, T, Hkv, D) contiguous.
//   Query i sits at q_offset + i and sees keys j <= q_offset + i; query head h
//   reads kv head h / (Hq / Hkv).
//
// Two implementations, chosen by the plan:
//   Flash (bf16, D in {64, 128}, 16-byte aligned rows; forward needs Tq >
//   kDecodeRows):
//     FlashAttention-2 on mma.sync m16n8k16 bf16 tensor cores, f32
//     accumulation, online softmax in registers; nothing of size T x T is ever
//     stored. forward: one CTA per (block of 64 or 128 query rows, query head,
//     batch), 16 rows per warp,
//       key blocks of 64 up to the causal limit, K/V loads (cp.async)
//       overlapped with compute.
//     backward: Di = rowsum(dout * out) first; then one CTA per (64 keys, kv
//     head, batch) that
//       loops over the G = Hq/Hkv query heads of its group and their query
//       blocks, keeping dK and dV in registers (so the GQA sum is formed inside
//       the CTA in a fixed order: dK and dV are deterministic), and adds its
//       share of dQ into an f32 scratch with atomics (dQ is therefore not
//       bitwise deterministic: the order of the f32 additions varies run to
//       run, which moves the last bits); a last kernel rounds dQ to bf16.
//   Decode (Tq == 1, D in {32, 64, 128}, or 256 in bf16; 16-byte aligned): one CTA per
//     (split of the keys, query head, batch); each lane holds D / 32 values of q, of its output
//     and of every K/V row it reads, each warp takes every 4th key of the split with 4 keys in
//     flight and its own online softmax, and the CTA merges its 4 warps (then
//     combine_splits_kernel merges the splits). A key costs one coalesced row load and a warp
//     sum, so a short cache is a few memory latencies: the generic kernel took 44 us per layer
//     of Qwen3-8B at about 70 keys (ncu, H200, 2026-11-27), 20% of a decode step.
//   Generic (any dtype, any D <= kGenericMaxD, and short prefills): SIMT kernels in
//   f32, one warp per
//     (query, head) item at a time, K/V tiles of 32 keys in shared memory
//     shared by the G heads of a kv head. The forward splits the keys over
//     several CTAs (split-K, combined by a second kernel) when there are too
//     few CTAs to fill the GPU, as in decoding (Tq = 1). The backward computes
//     dQ and (dK, dV) in two kernels without atomics: deterministic.
//
// Scratch (f32, the caller allocates it as Temporaries and passes
// plan.scratch_floats):
//   forward, generic with splits > 1: splits x B x Hq x Tq x (D + 2) partial
//   results; backward: B x Hq x T for Di, plus B x T x Hq x D for the dQ
//   accumulator on the flash path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/error.h"
#include "kernels/common/half.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

struct AttentionShape {
  int64_t B = 0, Tq = 0, Tk = 0, Hq = 0, Hkv = 0, D = 0;
  int64_t q_offset = 0;
  int64_t kv_batch_stride = 0;  // elements from one batch of k/v to the next (>= Tk * Hkv * D)
};

// Training's shape (Tq == Tk == T, q_offset 0, dense k/v): what the backward runs on.
inline AttentionShape training_attention_shape(int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                               int64_t D) {
  return {.B = B,
          .Tq = T,
          .Tk = T,
          .Hq = Hq,
          .Hkv = Hkv,
          .D = D,
          .q_offset = 0,
          .kv_batch_stride = T * Hkv * D};
}

// The automatic attention choice (ops::AttentionImpl::Auto, the default) for a bf16/f16 shape:
// cuDNN's fused attention for training's shape (Tq == Tk, q_offset 0, dense k/v: training and a
// prompt without a KV cache) when cuDNN takes it (head dim a multiple of 8 and at most 256, every
// buffer within 2^31 elements, Hq a multiple of Hkv); kiln's kernels for everything else (decode
// and prefill over a KV cache, where cuDNN compiles a plan per KV length, and other head dims).
// The choice depends on the shape alone, so a backward takes the forward's implementation, and
// the dry run (which declares the chosen entry's scratch) sees what a GPU runs. Measured on an
// H200 (2026-11-27, one call): cuDNN's step trains stories15M (D 48) 2.79x and stories42M (D 64)
// 1.12x as fast as kiln's kernels; kiln's decode of Qwen3-8B runs 5x as fast as cuDNN's.
inline bool auto_attention_uses_cudnn(const AttentionShape &s) {
  constexpr int64_t kMax = 2147483647;  // cuDNN sizes bound buffers with int32
  const bool training_shape =
      s.Tq == s.Tk && s.q_offset == 0 && s.kv_batch_stride == s.Tk * s.Hkv * s.D;
  return training_shape && s.B > 0 && s.Tq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0 && s.D % 8 == 0 &&
         s.D > 0 && s.D <= 256 && s.B * s.Tq * s.Hq * s.D <= kMax &&
         s.B * s.Tk * s.Hkv * s.D <= kMax;
}

enum class AttentionPath { Flash, Generic, Decode };

struct AttentionPlan {
  AttentionPath path = AttentionPath::Generic;
  int threads = 0;     // per CTA
  int block_q = 0;     // flash: query rows per CTA (fwd) or per inner step (bwd);
                       // generic: items
  int block_k = 0;     // keys per tile (flash bwd: keys per CTA)
  int64_t splits = 1;  // generic forward: CTAs over the keys of one item block (split-K)
  int64_t keys_per_split = 0;
  int64_t grid[3] = {1, 1, 1};  // main kernel
  size_t smem_bytes = 0;        // dynamic shared memory of the main kernel
  int64_t scratch_floats = 0;   // f32 scratch the launcher needs
};

// Tuning constants (also used by the kernels).
inline constexpr int kDecodeRows = 16;    // forward with Tq <= this goes to the generic kernel
inline constexpr int kGenericMaxD = 256;  // generic kernels keep D / 32 values per lane
inline constexpr int kGenericItems = 8;   // generic: items per CTA (4 warps x 2)
inline constexpr int kGenericThreads = 128;
inline constexpr int kGenericTile = 32;  // generic: keys (or queries) per shared tile
// split-K: at least this many keys (one tile) per CTA. Decode has 1 query row per head, so
// without splits a cache is 8 CTAs (one per kv head of Qwen3-8B) walking every tile in turn;
// 32 spreads even a 64-key context over twice the CTAs, merged by combine_splits_kernel.
inline constexpr int kMinKeysPerSplit = 32;
inline constexpr int kMaxSplits = 64;
// Decode (one query row per head): a CTA of kDecodeThreads per (split, query head, batch), each
// warp taking every 4th key of the split, 4 keys in flight per warp. Splits of at least
// kDecodeMinKeys keys, aiming at kDecodeCtasPerSm CTAs per SM.
inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeMinKeys = 16;
inline constexpr int kDecodeCtasPerSm = 4;

inline size_t generic_smem_bytes(int64_t D) {
  // q (and dout) rows of the items, K and V (or Q and dO) tiles padded to D + 1
  // floats, per-warp probability buffers (2 x 32 floats per warp), 2 x 32
  // floats of per-row statistics.
  return sizeof(float) * static_cast<size_t>(2 * kGenericItems * D + 2 * kGenericTile * (D + 1) +
                                             2 * (kGenericThreads / 32) * 32 + 2 * kGenericTile);
}
inline size_t flash_fwd_smem_bytes(int64_t block_q, int64_t D) {
  return static_cast<size_t>((block_q + 2 * 64) * D * 2);  // Q, K, V tiles in bf16
}
inline size_t flash_bwd_smem_bytes(int64_t block_q, int64_t D) {
  // K, V (64 rows); Q, dO double-buffered (block_q rows); lse, Di
  // double-buffered; dS^T (64 x (block_q + 8) bf16, padded).
  return static_cast<size_t>(2 * 64 * D * 2 + 2 * 2 * block_q * D * 2 + 2 * 2 * block_q * 4 +
                             64 * (block_q + 8) * 2);
}

namespace detail {
inline void check_attention_shape(const AttentionShape &s, const char *op) {
  KILN_CHECK(s.B > 0 && s.Tq > 0 && s.Tk > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0,
             "[{}] empty shape B {} Tq {} Tk {} Hq {} Hkv {} D {}", op, s.B, s.Tq, s.Tk, s.Hq,
             s.Hkv, s.D);
  KILN_CHECK(s.Hq % s.Hkv == 0, "[{}] {} query heads not divisible by {} kv heads", op, s.Hq,
             s.Hkv);
  KILN_CHECK(s.q_offset >= 0 && s.q_offset + s.Tq <= s.Tk,
             "[{}] queries at [{}, {}) need keys up to {}, have {}", op, s.q_offset,
             s.q_offset + s.Tq, s.q_offset + s.Tq, s.Tk);
  KILN_CHECK(s.kv_batch_stride >= s.Tk * s.Hkv * s.D,
             "[{}] kv batch stride {} is smaller than Tk * Hkv * D = {}", op, s.kv_batch_stride,
             s.Tk * s.Hkv * s.D);
  // Grid y/z limits, and row indices that the kernels keep in int.
  KILN_CHECK(s.B <= 65535 && s.Hq <= 65535, "[{}] B {} and Hq {} must be <= 65535 (grid limits)",
             op, s.B, s.Hq);
  KILN_CHECK(s.Tk <= (int64_t(1) << 30) && s.Hq * s.Tq <= (int64_t(1) << 30),
             "[{}] Tk {} or Hq * Tq {} too large for the kernels' int row indices", op, s.Tk,
             s.Hq * s.Tq);
}
}  // namespace detail

// Forward plan. tensor_cores: the dtype is bf16. aligned16: q, k, v, out start
// on 16-byte boundaries and kv_batch_stride is a multiple of 8 elements.
// num_sms: the device's SM count.
// decode_kernel: false keeps Tq == 1 on the generic kernel (decode_attention_enabled()).
inline AttentionPlan plan_attention_forward(const AttentionShape &s, bool tensor_cores,
                                            bool aligned16, int num_sms,
                                            bool decode_kernel = true) {
  detail::check_attention_shape(s, "attention");
  AttentionPlan p;
  if (num_sms < 1) num_sms = 1;
  if (tensor_cores && aligned16 && (s.D == 64 || s.D == 128) && s.Tq > kDecodeRows) {
    p.path = AttentionPath::Flash;
    p.block_k = 64;
    // 128-row blocks share each K/V tile among 8 warps (half the shared-memory
    // traffic per FLOP); 64-row blocks make twice the CTAs when 128 would leave
    // SMs idle.
    const int64_t ctas128 = (s.Tq + 127) / 128 * s.Hq * s.B;
    p.block_q = ctas128 >= num_sms ? 128 : 64;
    p.threads = p.block_q * 2;  // one warp per 16 rows
    p.grid[0] = (s.Tq + p.block_q - 1) / p.block_q;
    p.grid[1] = s.Hq;
    p.grid[2] = s.B;
    p.smem_bytes = flash_fwd_smem_bytes(p.block_q, s.D);
    return p;
  }
  // Decode: D / 32 values per lane in one load of at most 16 bytes (D 256 only in bf16).
  if (decode_kernel && s.Tq == 1 && aligned16 &&
      (s.D == 32 || s.D == 64 || s.D == 128 || (s.D == 256 && tensor_cores))) {
    p.path = AttentionPath::Decode;
    p.threads = kDecodeThreads;
    p.block_q = 1;
    const int64_t keys = s.q_offset + 1;
    const int64_t ctas = s.Hq * s.B;
    int64_t want = (int64_t{kDecodeCtasPerSm} * num_sms + ctas - 1) / ctas;
    const int64_t by_keys = (keys + kDecodeMinKeys - 1) / kDecodeMinKeys;
    if (want > by_keys) want = by_keys;
    if (want > kMaxSplits) want = kMaxSplits;
    if (want < 1) want = 1;
    p.keys_per_split = (keys + want - 1) / want;
    p.splits = (keys + p.keys_per_split - 1) / p.keys_per_split;  // none empty
    p.block_k = static_cast<int>(p.keys_per_split);
    p.scratch_floats = p.splits > 1 ? p.splits * s.B * s.Hq * (s.D + 2) : 0;
    p.grid[0] = p.splits;
    p.grid[1] = s.Hq;
    p.grid[2] = s.B;
    KILN_CHECK(s.Hq <= 65535 && s.B <= 65535, "[attention] {} heads x {} batch exceed the grid",
               s.Hq, s.B);
    p.smem_bytes = 0;
    return p;
  }
  KILN_CHECK(s.D <= kGenericMaxD,
             "[attention] head dim {} is not supported on CUDA (the "
             "tensor-core kernel takes bf16 "
             "with D 64 or 128, the generic kernel D <= {})",
             s.D, kGenericMaxD);
  p.path = AttentionPath::Generic;
  p.threads = kGenericThreads;
  p.block_q = kGenericItems;
  p.block_k = kGenericTile;
  const int64_t G = s.Hq / s.Hkv;
  const int64_t item_blocks = (s.Tq * G + kGenericItems - 1) / kGenericItems;
  const int64_t ctas = item_blocks * s.Hkv * s.B;
  const int64_t keys = s.q_offset + s.Tq;  // the most keys any item sees
  p.splits = 1;
  if (ctas < 2 * num_sms && keys >= 2 * kMinKeysPerSplit) {
    int64_t want = (2 * num_sms + ctas - 1) / ctas;
    const int64_t by_keys = keys / kMinKeysPerSplit;
    if (want > by_keys) want = by_keys;
    if (want > kMaxSplits) want = kMaxSplits;
    p.splits = want < 1 ? 1 : want;
  }
  if (p.splits > 1) {
    // Whole tiles per split; recount so that no split is empty.
    const int64_t per = (keys + p.splits - 1) / p.splits;
    p.keys_per_split = (per + kGenericTile - 1) / kGenericTile * kGenericTile;
    p.splits = (keys + p.keys_per_split - 1) / p.keys_per_split;
  }
  if (p.splits > 1) {
    p.scratch_floats = p.splits * s.B * s.Hq * s.Tq * (s.D + 2);
  } else {
    p.keys_per_split = keys;
    p.scratch_floats = 0;
  }
  p.grid[0] = item_blocks * p.splits;
  p.grid[1] = s.Hkv;
  p.grid[2] = s.B;
  KILN_CHECK(p.grid[0] <= 0x7fffffff, "[attention] grid of {} blocks is too large", p.grid[0]);
  p.smem_bytes = generic_smem_bytes(s.D);
  return p;
}

// Backward plan (Tq == Tk, q_offset 0, k/v contiguous). Flags as for the
// forward.
inline AttentionPlan plan_attention_backward(const AttentionShape &s, bool tensor_cores,
                                             bool aligned16) {
  detail::check_attention_shape(s, "attention_backward");
  KILN_CHECK(s.Tq == s.Tk && s.q_offset == 0 && s.kv_batch_stride == s.Tk * s.Hkv * s.D,
             "[attention_backward] needs Tq == Tk, q_offset 0 and contiguous "
             "k/v (Tq {} Tk {} "
             "q_offset {} kv batch stride {})",
             s.Tq, s.Tk, s.q_offset, s.kv_batch_stride);
  AttentionPlan p;
  const int64_t T = s.Tq;
  const int64_t di_floats = s.B * s.Hq * T;
  if (tensor_cores && aligned16 && (s.D == 64 || s.D == 128)) {
    p.path = AttentionPath::Flash;
    p.threads = 128;  // 4 warps x 16 keys
    p.block_k = 64;
    // D = 128 keeps dK and dV (64 + 64 floats per thread) in registers:
    // 32-query steps keep the transposed scores small enough to stay clear of
    // spills.
    p.block_q = s.D == 128 ? 32 : 64;
    p.grid[0] = (T + p.block_k - 1) / p.block_k;
    p.grid[1] = s.Hkv;
    p.grid[2] = s.B;
    p.smem_bytes = flash_bwd_smem_bytes(p.block_q, s.D);
    p.scratch_floats = di_floats + s.B * T * s.Hq * s.D;
    return p;
  }
  KILN_CHECK(s.D <= kGenericMaxD,
             "[attention_backward] head dim {} is not supported on CUDA (the "
             "tensor-core kernel "
             "takes bf16 with D 64 or 128, the generic kernel D <= {})",
             s.D, kGenericMaxD);
  p.path = AttentionPath::Generic;
  p.threads = kGenericThreads;
  p.block_q = kGenericItems;
  p.block_k = kGenericTile;
  const int64_t G = s.Hq / s.Hkv;
  p.grid[0] = (T * G + kGenericItems - 1) / kGenericItems;  // dQ kernel; dK/dV: ceil(T / 8)
  p.grid[1] = s.Hkv;
  p.grid[2] = s.B;
  p.smem_bytes = generic_smem_bytes(s.D);
  p.scratch_floats = di_floats;
  return p;
}

// Whether the front end plans Tq == 1 onto the decode kernel: KILN_CUDA_DECODE_ATTENTION=0 at
// start-up keeps it on the generic kernel (the A/B of the GPU check); set_... overrides.
#if defined(KILN_CUDA)
bool decode_attention_enabled();
void set_decode_attention_enabled(bool on);
#else
// Without CUDA no kernel runs; a dry run simulating CUDA plans as a GPU does by default.
inline bool decode_attention_enabled() { return true; }
inline void set_decode_attention_enabled(bool) {}
#endif

// ---- launchers
// ---------------------------------------------------------------------------------
// T: float, bf16 or f16 (the flash path needs bf16). scale multiplies q.k.
// scratch: at least plan.scratch_floats f32 elements (may be null when that is
// 0). Writes out and lse (=).
template <typename T>
void attention_forward(const AttentionPlan &plan, const AttentionShape &s, float scale, const T *q,
                       const T *k, const T *v, T *out, float *lse, float *scratch,
                       StreamHandle stream);

// Writes dq, dk, dv (=). lse as saved by the forward.
template <typename T>
void attention_backward(const AttentionPlan &plan, const AttentionShape &s, float scale, const T *q,
                        const T *k, const T *v, const T *out, const float *lse, const T *dout,
                        T *dq, T *dk, T *dv, float *scratch, StreamHandle stream);

}  // namespace kiln::cuda
