// Rotary position embedding (math in rope.h). One task per token row (b, t); every head of the
// row uses the same table row, so cos/sin are read once per row and stay in L1.
#include "kernels/cpu/rope.h"

#include <omp.h>

#include <cmath>

#include "kernels/common/error.h"
#include "kernels/cpu/isa.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements

#if KILN_CPU_X86
// One bf16 head of RotateHalf with AVX-512 (half % 16 == 0): the loop below's f32 products and
// difference/sum, 16 pairs at a time, rounded as half.h does (same bits, no FMA contraction).
// Both halves are read before either is written, so y may alias x. The generic loop runs at
// the baseline ISA with scalar conversions: about 2.5% of a Qwen3-0.6B bf16 prefill.
KILN_TARGET_AVX512 void rope_half_bf16(int64_t half, const float* c, const float* s, float sign,
                                       const bf16* x, bf16* y) {
  const __m512 vsign = _mm512_set1_ps(sign);
  for (int64_t i = 0; i < half; i += 16) {
    const __m512 a = load_bf16x16(x + i), b = load_bf16x16(x + i + half);
    const __m512 ci = _mm512_loadu_ps(c + i), si = _mm512_mul_ps(vsign, _mm512_loadu_ps(s + i));
    store_bf16x16(y + i, _mm512_sub_ps(_mm512_mul_ps(a, ci), _mm512_mul_ps(b, si)));
    store_bf16x16(y + i + half, _mm512_add_ps(_mm512_mul_ps(a, si), _mm512_mul_ps(b, ci)));
  }
}
#endif

// Whether rope_apply<T> runs its heads through rope_half_bf16.
template <typename T>
bool rope_heads_avx512(RopeStyle style, int64_t D) {
#if KILN_CPU_X86
  return std::is_same_v<T, bf16> && style == RopeStyle::RotateHalf && D % 32 == 0 &&
         cpu_has(CpuIsa::Avx512);
#else
  (void)style, (void)D;
  return false;
#endif
}

// sign = +1 rotates by +theta (forward), -1 by -theta (backward).
template <typename T, typename C = compute_t<T>>
void rope_apply(const char* op, RopeStyle style, int64_t B, int64_t T_, int64_t H, int64_t D,
                const C* cos, const C* sin, const int64_t* pos, int64_t pos_offset, C sign,
                const T* x, T* y) {
  KILN_CHECK(B >= 0 && T_ >= 0 && H >= 0 && D > 0 && D % 2 == 0,
             "[{}] bad sizes B={} T={} H={} D={} (D must be even)", op, B, T_, H, D);
  const int64_t rows = B * T_, half = D / 2;
  if (pos) {
    for (int64_t r = 0; r < rows; ++r)
      KILN_CHECK(pos[r] >= 0, "[{}] negative position {} at token {}", op, pos[r], r);
  } else {
    KILN_CHECK(pos_offset >= 0, "[{}] negative position offset {}", op, pos_offset);
  }
  [[maybe_unused]] const bool avx512_heads = rope_heads_avx512<T>(style, D);
#pragma omp parallel for schedule(static) if (rows * H * D >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = pos ? pos[r] : pos_offset + r % T_;
    const C* c = cos + p * half;
    const C* s = sin + p * half;
    for (int64_t h = 0; h < H; ++h) {
      const T* xr = x + (r * H + h) * D;
      T* yr = y + (r * H + h) * D;
#if KILN_CPU_X86
      if constexpr (std::is_same_v<T, bf16>) {
        if (avx512_heads) {
          rope_half_bf16(half, c, s, sign, xr, yr);
          continue;
        }
      }
#endif
      if (style == RopeStyle::Interleaved) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const C a = to_compute(xr[2 * i]), b = to_compute(xr[2 * i + 1]), si = sign * s[i];
          yr[2 * i] = from_compute<T>(a * c[i] - b * si);
          yr[2 * i + 1] = from_compute<T>(a * si + b * c[i]);
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const C a = to_compute(xr[i]), b = to_compute(xr[i + half]), si = sign * s[i];
          yr[i] = from_compute<T>(a * c[i] - b * si);
          yr[i + half] = from_compute<T>(a * si + b * c[i]);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward(RopeStyle style, int64_t B, int64_t T_, int64_t H, int64_t D,
                  const compute_t<T>* cos, const compute_t<T>* sin, const int64_t* pos,
                  int64_t pos_offset, const T* x, T* y) {
  rope_apply<T>("rope", style, B, T_, H, D, cos, sin, pos, pos_offset, compute_t<T>(1), x, y);
}

template <typename T>
void rope_backward(RopeStyle style, int64_t B, int64_t T_, int64_t H, int64_t D,
                   const compute_t<T>* cos, const compute_t<T>* sin, const int64_t* pos,
                   int64_t pos_offset, const T* dy, T* dx) {
  rope_apply<T>("rope", style, B, T_, H, D, cos, sin, pos, pos_offset, compute_t<T>(-1), dy, dx);
}

template <typename T>
void rope_tables(int64_t max_pos, int64_t D, double theta, T* cos, T* sin) {
  KILN_CHECK(max_pos >= 0 && D > 0 && D % 2 == 0, "[rope] bad table sizes max_pos={} D={}", max_pos,
             D);
  KILN_CHECK(theta > 0 && std::isfinite(theta), "[rope] bad theta {}", theta);
  const int64_t half = D / 2;
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      // T = float: every step rounded to float, as HF does in float32 (see rope.h).
      const T expo = T(2 * i) / T(D);
      const T inv_freq = T(1) / std::pow(T(theta), expo);
      const T angle = T(p) * inv_freq;
      cos[p * half + i] = std::cos(angle);
      sin[p * half + i] = std::sin(angle);
    }
  }
}

#define KILN_INSTANTIATE_APPLY(T)                                                                  \
  template void rope_forward<T>(RopeStyle, int64_t, int64_t, int64_t, int64_t,                     \
                                const compute_t<T>*, const compute_t<T>*, const int64_t*, int64_t, \
                                const T*, T*);                                                     \
  template void rope_backward<T>(RopeStyle, int64_t, int64_t, int64_t, int64_t,                    \
                                 const compute_t<T>*, const compute_t<T>*, const int64_t*,         \
                                 int64_t, const T*, T*);
KILN_INSTANTIATE_APPLY(float)
KILN_INSTANTIATE_APPLY(double)
KILN_INSTANTIATE_APPLY(bf16)
KILN_INSTANTIATE_APPLY(f16)
#undef KILN_INSTANTIATE_APPLY
template void rope_tables<float>(int64_t, int64_t, double, float*, float*);
template void rope_tables<double>(int64_t, int64_t, double, double*, double*);

}  // namespace kiln::cpu
