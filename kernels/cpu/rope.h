// Rotary position embedding, CPU.
//
// x, y: (B, T, H, D) contiguous, D even; y may alias x (in place). cos, sin: (max_pos, D/2)
// row-major; pair i (0 <= i < D/2) of a token at position p is rotated by the angle whose cosine
// and sine are cos[p, i], sin[p, i]:
//   Interleaved (llama2.c): pair i = (x[2i], x[2i+1])
//   RotateHalf  (HF):       pair i = (x[i], x[i + D/2])
//   (a, b) -> (a cos - b sin, a sin + b cos)                                 (y =)
// The position of token (b, t) is pos[b*T + t] when pos is given, else pos_offset + t.
// Positions must lie in [0, max_pos) of the tables; negative ones are rejected here, the upper
// bound is the caller's to check (the tables' length is not passed).
// rope_backward rotates by the negative angle (the rotation's transpose): dx = R(-theta) dy (=).
//
// rope_tables: inv_freq_i = 1 / theta^(2i/D), angle(p, i) = p * inv_freq_i, (cos, sin) =.
//   T = float computes in float32 like HF's rotary embedding: the exponent 2i/D, the power
//   theta^(2i/D), the reciprocal, the product p * inv_freq and cos/sin each rounded to float.
//   llama2.c takes the same float steps (1.0f / powf(theta, 2i/(float)D), cosf(p * freq)); the
//   only differences are in the last ulp of cos/sin (libm cosf versus torch's vectorized cos).
//   T = double computes every step in double.
//
// T is the storage type of x/y (float, double, bf16, f16); the tables and the math are
// compute_t<T> (f32 tables for bf16, as rope_tables makes them; kernels/cpu/bf16_util.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {

enum class RopeStyle {
  Interleaved,  // llama2.c: pairs (2i, 2i+1)
  RotateHalf,   // Hugging Face: pairs (i, i + D/2)
};

template <typename T>
void rope_forward(RopeStyle style, int64_t B, int64_t T_, int64_t H, int64_t D,
                  const compute_t<T>* cos, const compute_t<T>* sin, const int64_t* pos,
                  int64_t pos_offset, const T* x, T* y);
template <typename T>
void rope_backward(RopeStyle style, int64_t B, int64_t T_, int64_t H, int64_t D,
                   const compute_t<T>* cos, const compute_t<T>* sin, const int64_t* pos,
                   int64_t pos_offset, const T* dy, T* dx);

// cos, sin: (max_pos, D/2), written (=).
template <typename T>
void rope_tables(int64_t max_pos, int64_t D, double theta, T* cos, T* sin);

}  // namespace kiln::cpu
