// Rotary position embedding, its tables, and the fused QK-norm + RoPE (math in rope.h).
//
// rope_kernel: grid (B * T tokens, ceil(H * half / threads)), one thread per pair (h, i) of one
// token; consecutive threads take consecutive pairs of a head, so both halves of RotateHalf pairs
// are coalesced (interleaved pairs are two adjacent elements). The token's (b, t) is one division
// per thread and (h, i) one 32-bit division: the earlier grid-stride loop over (b, t, h, i) paid
// four 64-bit divisions per pair and ran at 400 GB/s in the H200's ncu of a training step (8.6%
// of stories15M's kernel time). A thread reads its pair before writing it, so y may be x.
// qk_norm_rope_*: one warp per head vector (b, t, h); lane l holds pairs l, l + 32, ... in
// registers (D/2 <= 256, so at most 8 pairs per lane).
#include <cmath>
#include <type_traits>

#include "kernels/cuda/activation.h"  // Pack
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPairsPerLane = static_cast<int>(kQkNormMaxDim / 2 / 32);  // 8

struct InvFreq {
  float v[kRopeTableMaxDim / 2];
};

// cos, sin: (max_pos, half), element p * half + i.
__global__ void rope_tables_kernel(std::int64_t max_pos, std::int64_t half, InvFreq inv, float* cos,
                                   float* sin) {
  const std::int64_t n = max_pos * half;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const std::int64_t p = idx / half, i = idx % half;
    const float angle = static_cast<float>(p) * inv.v[i];  // the CPU's f32 product
    double s, c;
    ::sincos(static_cast<double>(angle), &s, &c);
    cos[idx] = static_cast<float>(c);
    sin[idx] = static_cast<float>(s);
  }
}

// Element offsets of pair i within a head: (first, second) along D.
__device__ __forceinline__ void pair_cols(bool interleaved, std::int64_t i, std::int64_t half,
                                          std::int64_t& ia, std::int64_t& ib) {
  ia = interleaved ? 2 * i : i;
  ib = interleaved ? 2 * i + 1 : i + half;
}

// sign = +1: forward rotation; -1: backward (rotation by -angle). pairs = H * half (< 2^31).
template <typename T>
__global__ void rope_kernel(bool interleaved, float sign, std::int64_t T_, int half, int pairs,
                            const float* cos, const float* sin, std::int64_t pos_offset, const T* x,
                            Strides4 xs, T* y, Strides4 ys) {
  const int j = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (j >= pairs) return;
  const std::int64_t token = blockIdx.x;
  const std::int64_t b = token / T_, t = token - b * T_;
  const int h = j / half, i = j - h * half;
  const std::int64_t p = pos_offset + t;
  const float c = cos[p * half + i], s = sign * sin[p * half + i];
  std::int64_t ia, ib;
  pair_cols(interleaved, i, half, ia, ib);
  const std::int64_t xo = b * xs.s[0] + t * xs.s[1] + h * xs.s[2];
  const std::int64_t yo = b * ys.s[0] + t * ys.s[1] + h * ys.s[2];
  const float va = load(x[xo + ia * xs.s[3]]), vb = load(x[xo + ib * xs.s[3]]);
  y[yo + ia * ys.s[3]] = store<T>(va * c - vb * s);
  y[yo + ib * ys.s[3]] = store<T>(va * s + vb * c);
}

// The packed path (rope_vec_pairs): flat thread g over tokens x (H * half / V) packs; the pack
// j of a token is head h = j / (half / V), pairs [i, i + V) with i = (j % (half / V)) * V.
template <typename T, bool kInterleaved, int V>
__device__ __forceinline__ void rope_vec_one(std::int64_t g, float sign, std::int64_t T_, int half,
                                             int packs, const float* cos, const float* sin,
                                             std::int64_t pos_offset, const T* x,
                                             const Strides4& xs, T* y, const Strides4& ys) {
  const std::int64_t token = g / packs;
  const int j = static_cast<int>(g - token * packs);
  const std::int64_t b = token / T_, t = token - b * T_;
  const int per_head = half / V;
  const int h = j / per_head, i = (j - h * per_head) * V;
  const std::int64_t p = pos_offset + t;
  float c[V], sn[V];
  const float* cr = cos + p * half + i;
  const float* sr = sin + p * half + i;
  if constexpr (V % 4 == 0) {  // 16-byte table loads (i and half are multiples of V)
#pragma unroll
    for (int q = 0; q < V; q += 4) {
      const float4 c4 = *reinterpret_cast<const float4*>(cr + q);
      const float4 s4 = *reinterpret_cast<const float4*>(sr + q);
      c[q] = c4.x, c[q + 1] = c4.y, c[q + 2] = c4.z, c[q + 3] = c4.w;
      sn[q] = sign * s4.x, sn[q + 1] = sign * s4.y, sn[q + 2] = sign * s4.z;
      sn[q + 3] = sign * s4.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      c[e] = cr[e];
      sn[e] = sign * sr[e];
    }
  }
  const std::int64_t xo = b * xs.s[0] + t * xs.s[1] + h * xs.s[2];
  const std::int64_t yo = b * ys.s[0] + t * ys.s[1] + h * ys.s[2];
  if constexpr (kInterleaved) {
    const Pack<T, 2 * V> in = *reinterpret_cast<const Pack<T, 2 * V>*>(x + xo + 2 * i);
    Pack<T, 2 * V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float va = load(in.v[2 * e]), vb = load(in.v[2 * e + 1]);
      out.v[2 * e] = store<T>(va * c[e] - vb * sn[e]);
      out.v[2 * e + 1] = store<T>(va * sn[e] + vb * c[e]);
    }
    *reinterpret_cast<Pack<T, 2 * V>*>(y + yo + 2 * i) = out;
  } else {
    const Pack<T, V> a = *reinterpret_cast<const Pack<T, V>*>(x + xo + i);
    const Pack<T, V> bv = *reinterpret_cast<const Pack<T, V>*>(x + xo + i + half);
    Pack<T, V> oa, ob;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float va = load(a.v[e]), vb = load(bv.v[e]);
      oa.v[e] = store<T>(va * c[e] - vb * sn[e]);
      ob.v[e] = store<T>(va * sn[e] + vb * c[e]);
    }
    *reinterpret_cast<Pack<T, V>*>(y + yo + i) = oa;
    *reinterpret_cast<Pack<T, V>*>(y + yo + i + half) = ob;
  }
}

template <typename T, bool kInterleaved, int V>
__global__ void __launch_bounds__(kThreads)
    rope_vec_kernel(float sign, std::int64_t T_, int half, int packs, std::int64_t n,
                    const float* cos, const float* sin, std::int64_t pos_offset, const T* x,
                    Strides4 xs, T* y, Strides4 ys) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < n;
       g += stride)
    rope_vec_one<T, kInterleaved, V>(g, sign, T_, half, packs, cos, sin, pos_offset, x, xs, y, ys);
}

// One warp per head vector `row` = (b * T + t) * H + h.
template <typename T>
__global__ void __launch_bounds__(128)
    qk_norm_rope_fwd_kernel(bool interleaved, std::int64_t B, std::int64_t T_, std::int64_t H,
                            std::int64_t D, float eps, const float* cos, const float* sin,
                            std::int64_t pos_offset, const T* x, Strides4 xs, const T* w, T* y,
                            Strides4 ys, float* rstd) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= B * T_ * H) return;  // whole warps
  const std::int64_t h = row % H, bt = row / H, t = bt % T_, b = bt / T_;
  const std::int64_t half = D / 2, p = pos_offset + t;
  const std::int64_t xo = b * xs.s[0] + t * xs.s[1] + h * xs.s[2];
  const std::int64_t yo = b * ys.s[0] + t * ys.s[1] + h * ys.s[2];
  float va[kMaxPairsPerLane], vb[kMaxPairsPerLane];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPairsPerLane; ++k) {
    const std::int64_t i = lane + 32 * k;
    va[k] = vb[k] = 0.f;
    if (i < half) {
      std::int64_t ia, ib;
      pair_cols(interleaved, i, half, ia, ib);
      va[k] = load(x[xo + ia * xs.s[3]]);
      vb[k] = load(x[xo + ib * xs.s[3]]);
      ss += va[k] * va[k] + vb[k] * vb[k];
    }
  }
  ss = warp_sum(ss);  // also orders all reads of x before the writes (y may be x)
  const float r = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (lane == 0) rstd[row] = r;
#pragma unroll
  for (int k = 0; k < kMaxPairsPerLane; ++k) {
    const std::int64_t i = lane + 32 * k;
    if (i < half) {
      std::int64_t ia, ib;
      pair_cols(interleaved, i, half, ia, ib);
      const float na = va[k] * r * load(w[ia]), nb = vb[k] * r * load(w[ib]);
      const float c = cos[p * half + i], s = sin[p * half + i];
      y[yo + ia * ys.s[3]] = store<T>(na * c - nb * s);
      y[yo + ib * ys.s[3]] = store<T>(na * s + nb * c);
    }
  }
}

// One warp per chunk of head vectors [chunk * per, min(rows, (chunk + 1) * per)); dy, dx dense.
// part: (nchunks, D) f32 or null; each lane writes its own columns of its chunk's row once.
template <typename T>
__global__ void __launch_bounds__(128)
    qk_norm_rope_bwd_kernel(bool interleaved, std::int64_t B, std::int64_t T_, std::int64_t H,
                            std::int64_t D, std::int64_t nchunks, std::int64_t per,
                            const float* cos, const float* sin, std::int64_t pos_offset, const T* x,
                            Strides4 xs, const T* w, const float* rstd, const T* dy, T* dx,
                            float* part) {
  const int lane = threadIdx.x % 32;
  const std::int64_t chunk =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (chunk >= nchunks) return;
  const std::int64_t rows = B * T_ * H, half = D / 2;
  const std::int64_t r0 = chunk * per, r1 = r0 + per < rows ? r0 + per : rows;
  const float inv_dim = 1.0f / static_cast<float>(D);
  float pa[kMaxPairsPerLane], pb[kMaxPairsPerLane];
#pragma unroll
  for (int k = 0; k < kMaxPairsPerLane; ++k) pa[k] = pb[k] = 0.f;
  for (std::int64_t row = r0; row < r1; ++row) {
    const std::int64_t h = row % H, bt = row / H, t = bt % T_, b = bt / T_;
    const std::int64_t p = pos_offset + t;
    const std::int64_t xo = b * xs.s[0] + t * xs.s[1] + h * xs.s[2];
    const std::int64_t d0 = row * D;
    const float rs = rstd[row];
    float va[kMaxPairsPerLane], vb[kMaxPairsPerLane], ga[kMaxPairsPerLane], gb[kMaxPairsPerLane];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxPairsPerLane; ++k) {
      const std::int64_t i = lane + 32 * k;
      va[k] = vb[k] = ga[k] = gb[k] = 0.f;
      if (i < half) {
        std::int64_t ia, ib;
        pair_cols(interleaved, i, half, ia, ib);
        va[k] = load(x[xo + ia * xs.s[3]]);
        vb[k] = load(x[xo + ib * xs.s[3]]);
        const float da = load(dy[d0 + ia]), db = load(dy[d0 + ib]);
        const float c = cos[p * half + i], s = sin[p * half + i];
        ga[k] = da * c + db * s;  // R(-theta) dy: the gradient w.r.t. the normalized vector
        gb[k] = db * c - da * s;
        dot += load(w[ia]) * ga[k] * va[k] + load(w[ib]) * gb[k] * vb[k];
      }
    }
    dot = warp_sum(dot);  // orders the reads of dy before the writes (dx may be dy)
    const float coef = rs * rs * rs * dot * inv_dim;
#pragma unroll
    for (int k = 0; k < kMaxPairsPerLane; ++k) {
      const std::int64_t i = lane + 32 * k;
      if (i < half) {
        std::int64_t ia, ib;
        pair_cols(interleaved, i, half, ia, ib);
        dx[d0 + ia] = store<T>(rs * load(w[ia]) * ga[k] - va[k] * coef);
        dx[d0 + ib] = store<T>(rs * load(w[ib]) * gb[k] - vb[k] * coef);
        pa[k] += ga[k] * va[k] * rs;
        pb[k] += gb[k] * vb[k] * rs;
      }
    }
  }
  if (!part) return;
#pragma unroll
  for (int k = 0; k < kMaxPairsPerLane; ++k) {
    const std::int64_t i = lane + 32 * k;
    if (i < half) {
      std::int64_t ia, ib;
      pair_cols(interleaved, i, half, ia, ib);
      part[chunk * D + ia] = pa[k];
      part[chunk * D + ib] = pb[k];
    }
  }
}

void check_shape(const char* op, std::int64_t B, std::int64_t T_, std::int64_t H, std::int64_t D,
                 std::int64_t pos_offset) {
  KILN_CHECK(B >= 0 && T_ >= 0 && H >= 0 && D > 0 && D % 2 == 0,
             "[{}] bad sizes B={} T={} H={} D={} (D must be even)", op, B, T_, H, D);
  KILN_CHECK(pos_offset >= 0, "[{}] negative position offset {}", op, pos_offset);
}

void check_alias(const char* op, const void* x, const Strides4& xs, const void* y,
                 const Strides4& ys) {
  if (x != y) return;
  for (int d = 0; d < 4; ++d)
    KILN_CHECK(xs.s[d] == ys.s[d], "[{}] in-place output must have the input's strides", op);
}

}  // namespace

void rope_tables(std::int64_t max_pos, std::int64_t D, double theta, float* cos, float* sin,
                 StreamHandle stream) {
  KILN_CHECK(max_pos >= 0 && D > 0 && D % 2 == 0, "[rope] bad table sizes max_pos={} D={}", max_pos,
             D);
  KILN_CHECK(D <= kRopeTableMaxDim, "[rope] head_dim {} exceeds the CUDA table limit {}", D,
             kRopeTableMaxDim);
  KILN_CHECK(theta > 0 && std::isfinite(theta), "[rope] bad theta {}", theta);
  const std::int64_t half = D / 2;
  if (max_pos == 0) return;
  InvFreq inv{};
  for (std::int64_t i = 0; i < half; ++i) inv.v[i] = rope_inv_freq(D, theta, i);
  rope_tables_kernel<<<grid_for(max_pos * half, kThreads), kThreads, 0, stream>>>(max_pos, half,
                                                                                  inv, cos, sin);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void rope_apply(RopeStyle style, bool backward, std::int64_t B, std::int64_t T_, std::int64_t H,
                std::int64_t D, const float* cos, const float* sin, std::int64_t pos_offset,
                const T* x, Strides4 x_strides, T* y, Strides4 y_strides, StreamHandle stream) {
  check_shape("rope", B, T_, H, D, pos_offset);
  check_alias("rope", x, x_strides, y, y_strides);
  const RopeLaunch l = rope_launch(B, T_, H, D);
  if (l.tokens == 0 || l.pairs == 0) return;
  const bool interleaved = style == RopeStyle::Interleaved;
  const int V = rope_vec_pairs(style, sizeof(T), D, x, x_strides, y, y_strides);
  if (V > 0 && aligned16({cos, sin})) {  // float4 table loads
    const int packs = static_cast<int>(l.pairs / V);
    const std::int64_t n = l.tokens * packs;
    auto go = [&](auto inter, auto vc) {
      rope_vec_kernel<T, decltype(inter)::value, decltype(vc)::value>
          <<<grid_for(n, kThreads), kThreads, 0, stream>>>(
              backward ? -1.0f : 1.0f, T_, static_cast<int>(D / 2), packs, n, cos, sin, pos_offset,
              x, x_strides, y, y_strides);
      KILN_CUDA_CHECK_LAUNCH();
    };
    constexpr int P = static_cast<int>(16 / sizeof(T));  // elements per 16-byte load
    if (interleaved)
      go(std::true_type{}, std::integral_constant<int, P / 2>{});
    else
      go(std::false_type{}, std::integral_constant<int, P>{});
    return;
  }
  rope_kernel<T><<<dim3(static_cast<unsigned>(l.tokens), static_cast<unsigned>(l.blocks_y)),
                   l.threads, 0, stream>>>(style == RopeStyle::Interleaved, backward ? -1.0f : 1.0f,
                                           T_, static_cast<int>(D / 2), static_cast<int>(l.pairs),
                                           cos, sin, pos_offset, x, x_strides, y, y_strides);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void qk_norm_rope_forward(RopeStyle style, std::int64_t B, std::int64_t T_, std::int64_t H,
                          std::int64_t D, float eps, const float* cos, const float* sin,
                          std::int64_t pos_offset, const T* x, Strides4 x_strides, const T* w, T* y,
                          Strides4 y_strides, float* rstd, StreamHandle stream) {
  check_shape("qk_norm_rope", B, T_, H, D, pos_offset);
  KILN_CHECK(D <= kQkNormMaxDim, "[qk_norm_rope] head_dim {} exceeds {}", D, kQkNormMaxDim);
  check_alias("qk_norm_rope", x, x_strides, y, y_strides);
  const std::int64_t rows = B * T_ * H;
  if (rows == 0) return;
  const std::int64_t blocks = ceil_div(rows, 4);
  KILN_CHECK(blocks <= 0x7fffffffLL, "[qk_norm_rope] {} head vectors exceed the grid", rows);
  qk_norm_rope_fwd_kernel<T><<<static_cast<unsigned>(blocks), 128, 0, stream>>>(
      style == RopeStyle::Interleaved, B, T_, H, D, eps, cos, sin, pos_offset, x, x_strides, w, y,
      y_strides, rstd);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T, typename W>
void qk_norm_rope_backward(RopeStyle style, std::int64_t B, std::int64_t T_, std::int64_t H,
                           std::int64_t D, const float* cos, const float* sin,
                           std::int64_t pos_offset, const T* x, Strides4 x_strides, const T* w,
                           const float* rstd, const T* dy, T* dx, float* dw_partial, W* dw,
                           StreamHandle stream) {
  check_shape("qk_norm_rope_backward", B, T_, H, D, pos_offset);
  KILN_CHECK(D <= kQkNormMaxDim, "[qk_norm_rope_backward] head_dim {} exceeds {}", D,
             kQkNormMaxDim);
  KILN_CHECK(!dw || dw_partial, "[qk_norm_rope_backward] dw needs a partial buffer");
  const std::int64_t rows = B * T_ * H;
  if (rows == 0) return;
  const NormChunks ch = norm_chunks(rows);
  qk_norm_rope_bwd_kernel<T><<<static_cast<unsigned>(ceil_div(ch.count, 4)), 128, 0, stream>>>(
      style == RopeStyle::Interleaved, B, T_, H, D, ch.count, ch.rows_per, cos, sin, pos_offset, x,
      x_strides, w, rstd, dy, dx, dw ? dw_partial : nullptr);
  KILN_CUDA_CHECK_LAUNCH();
  if (dw) reduce_partials<W>(ch.count, D, dw_partial, dw, stream);
}

#define KILN_INSTANTIATE(T)                                                                       \
  template void rope_apply<T>(RopeStyle, bool, std::int64_t, std::int64_t, std::int64_t,          \
                              std::int64_t, const float*, const float*, std::int64_t, const T*,   \
                              Strides4, T*, Strides4, StreamHandle);                              \
  template void qk_norm_rope_forward<T>(RopeStyle, std::int64_t, std::int64_t, std::int64_t,      \
                                        std::int64_t, float, const float*, const float*,          \
                                        std::int64_t, const T*, Strides4, const T*, T*, Strides4, \
                                        float*, StreamHandle);                                    \
  template void qk_norm_rope_backward<T, float>(                                                  \
      RopeStyle, std::int64_t, std::int64_t, std::int64_t, std::int64_t, const float*,            \
      const float*, std::int64_t, const T*, Strides4, const T*, const float*, const T*, T*,       \
      float*, float*, StreamHandle);                                                              \
  template void qk_norm_rope_backward<T, T>(RopeStyle, std::int64_t, std::int64_t, std::int64_t,  \
                                            std::int64_t, const float*, const float*,             \
                                            std::int64_t, const T*, Strides4, const T*,           \
                                            const float*, const T*, T*, float*, T*, StreamHandle);
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(f16)
#undef KILN_INSTANTIATE

template void rope_apply<float>(RopeStyle, bool, std::int64_t, std::int64_t, std::int64_t,
                                std::int64_t, const float*, const float*, std::int64_t,
                                const float*, Strides4, float*, Strides4, StreamHandle);
template void qk_norm_rope_forward<float>(RopeStyle, std::int64_t, std::int64_t, std::int64_t,
                                          std::int64_t, float, const float*, const float*,
                                          std::int64_t, const float*, Strides4, const float*,
                                          float*, Strides4, float*, StreamHandle);
template void qk_norm_rope_backward<float, float>(RopeStyle, std::int64_t, std::int64_t,
                                                  std::int64_t, std::int64_t, const float*,
                                                  const float*, std::int64_t, const float*,
                                                  Strides4, const float*, const float*,
                                                  const float*, float*, float*, float*,
                                                  StreamHandle);

}  // namespace kiln::cuda
