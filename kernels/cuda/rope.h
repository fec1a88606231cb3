// Rotary position embedding on CUDA, with the math of kernels/cpu/rope.h.
//
// x, y: (B, T, H, D), D even, addressed through element strides (any layout; y may be x itself
// with the same strides, for in place). cos, sin: (max_pos, D/2) f32 row-major. Token (b, t) sits
// at position p = pos_offset + t, and pair i (0 <= i < D/2) is
//   Interleaved (llama2.c): (x[2i], x[2i+1])        RotateHalf (HF): (x[i], x[i + D/2])
//   forward:  (a, b) -> (a cos - b sin, a sin + b cos)                  (y =)
//   backward: the rotation by -angle (its transpose): dx = R(-theta) dy (dx =)
// with cos = cos[p, i], sin = sin[p, i]. T is float, bf16 or f16; math in f32.
//
// rope_tables: inv_freq_i = 1 / theta^(2i/D) computed on the host in float exactly as the CPU
// kernel does (rope_inv_freq below), angle = float(p) * inv_freq_i in f32 (the same product as
// the CPU), and cos/sin of that f32 angle evaluated in double and rounded to f32, so the tables
// agree with the CPU's (glibc cosf/sinf) to the last ulp or better. (cos, sin =)
//
// ---- Fused QK-norm + RoPE (for the attention block; the op front end does not call it yet) ----
// Qwen3 normalizes each head vector of q and k with RMSNorm over head_dim (weight w: (D), eps)
// and then applies RoPE. qk_norm_rope_forward does both in one pass over x (B, T, H, D):
//   rstd[b,t,h] = 1 / sqrt(mean_d x[b,t,h,d]^2 + eps)                       (rstd =, f32)
//   n = x * rstd * w;   y = R(theta_{p,i}) n  pairwise as above            (y =)
// qk_norm_rope_backward, from dy = dL/dy (dense (B, T, H, D)):
//   dn = R(-theta) dy                                  (RoPE backward; R is orthogonal)
//   dx = rstd * w dn - x * rstd^3 * mean_d(w_d dn_d x_d)                    (dx =)
//   dw += sum over (b, t, h) of dn * x * rstd                               (+=, deterministic)
// The dw sum goes through an f32 partial buffer of norm_chunks(B*T*H).count rows of D (the
// caller allocates it: qk_norm_rope_scratch_floats) and reduce_partials (norm.h), so it is
// reproducible bit for bit. One warp handles one head vector; D <= kQkNormMaxDim.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/activation.h"  // row_vec_width
#include "kernels/cuda/norm.h"        // norm_chunks
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

enum class RopeStyle {
  Interleaved,  // llama2.c: pairs (2i, 2i+1)
  RotateHalf,   // Hugging Face: pairs (i, i + D/2)
};

// Element strides of a (B, T, H, D) tensor.
struct Strides4 {
  std::int64_t s[4];
};

constexpr std::int64_t kRopeTableMaxDim = 1024;  // head_dim limit of rope_tables (by-value table)
constexpr std::int64_t kQkNormMaxDim = 512;      // head_dim limit of the fused kernel

// inv_freq_i = 1 / theta^(2i/D), every step rounded to float as kernels/cpu/rope.cpp does.
inline float rope_inv_freq(std::int64_t D, double theta, std::int64_t i) {
  const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
  return 1.0f / std::pow(static_cast<float>(theta), expo);
}

void rope_tables(std::int64_t max_pos, std::int64_t D, double theta, float* cos, float* sin,
                 StreamHandle stream);

// rope_apply's grid: x over the B * T tokens, y over the token's H * D/2 pairs in blocks of
// `threads` (a multiple of 32, at most 256: 160 for stories15M's 6 heads of 24 pairs, so few
// threads idle). Fails by name beyond what a grid holds (2^31 - 1 tokens, 65535 y-blocks).
struct RopeLaunch {
  std::int64_t tokens = 0, pairs = 0;
  int threads = 32;
  std::int64_t blocks_y = 0;
};
inline RopeLaunch rope_launch(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) {
  RopeLaunch l;
  l.tokens = B * T;
  l.pairs = H * (D / 2);
  if (l.tokens == 0 || l.pairs == 0) return l;
  l.threads = static_cast<int>(std::min<std::int64_t>(256, (l.pairs + 31) / 32 * 32));
  l.blocks_y = (l.pairs + l.threads - 1) / l.threads;
  KILN_CHECK(l.tokens <= 0x7fffffffLL && l.blocks_y <= 65535,
             "[rope] {} tokens of {} pairs exceed the CUDA grid", l.tokens, l.pairs);
  return l;
}

// The packed path of rope_apply: V consecutive pairs per thread in 16-byte loads (Interleaved:
// the 2V elements of the pairs; RotateHalf: V elements from each half), V = 16 / elem_bytes / 2
// resp. 16 / elem_bytes. It needs dense pairs (stride 1 along D), x and y on 16-byte boundaries,
// and every (b, t, h) row start and D/2 a multiple of the pack; returns V, or 0 for the scalar
// kernel. The scalar kernel's 2-byte accesses ran at 460-540 GB/s in the training profile
// (H200, 2026-11-27: 6-8% of the step's kernel time).
inline int rope_vec_pairs(RopeStyle style, std::size_t elem_bytes, std::int64_t D, const void* x,
                          const Strides4& xs, const void* y, const Strides4& ys) {
  if (D % 2 != 0 || xs.s[3] != 1 || ys.s[3] != 1) return 0;
  // Interleaved packs cover whole rows (D), rotate-half packs one half (D/2).
  const bool interleaved = style == RopeStyle::Interleaved;
  const int pack = row_vec_width(static_cast<int>(elem_bytes), interleaved ? D : D / 2, {x, y},
                                 {xs.s[0], xs.s[1], xs.s[2], ys.s[0], ys.s[1], ys.s[2]});
  if (pack <= 1) return 0;
  return interleaved ? pack / 2 : pack;
}

template <typename T>
void rope_apply(RopeStyle style, bool backward, std::int64_t B, std::int64_t T_, std::int64_t H,
                std::int64_t D, const float* cos, const float* sin, std::int64_t pos_offset,
                const T* x, Strides4 x_strides, T* y, Strides4 y_strides, StreamHandle stream);

// f32 elements of the dw partial buffer qk_norm_rope_backward needs.
inline std::int64_t qk_norm_rope_scratch_floats(std::int64_t B, std::int64_t T_, std::int64_t H,
                                                std::int64_t D) {
  return norm_chunks(B * T_ * H).count * D;
}

// x: strided (B, T, H, D); w: (D); y: dense (B, T, H, D) or x itself (same strides as x);
// rstd: (B*T*H) f32.
template <typename T>
void qk_norm_rope_forward(RopeStyle style, std::int64_t B, std::int64_t T_, std::int64_t H,
                          std::int64_t D, float eps, const float* cos, const float* sin,
                          std::int64_t pos_offset, const T* x, Strides4 x_strides, const T* w, T* y,
                          Strides4 y_strides, float* rstd, StreamHandle stream);

// dy, dx: dense (B, T, H, D) (dx may be dy); x strided as in the forward; dw (D) of type W
// (float, bf16 or f16) or null; dw_partial: qk_norm_rope_scratch_floats() floats when dw is set.
template <typename T, typename W>
void qk_norm_rope_backward(RopeStyle style, std::int64_t B, std::int64_t T_, std::int64_t H,
                           std::int64_t D, const float* cos, const float* sin,
                           std::int64_t pos_offset, const T* x, Strides4 x_strides, const T* w,
                           const float* rstd, const T* dy, T* dx, float* dw_partial, W* dw,
                           StreamHandle stream);

}  // namespace kiln::cuda
