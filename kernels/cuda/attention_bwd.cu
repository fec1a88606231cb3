// Causal GQA attention backward on CUDA (plans, layouts and the choice of
// kernel: attention.h).
//
// Training shapes: Tq == Tk == T, q_offset 0; q, out, dout, dq: (B, T, Hq, D);
// k, v, dk, dv: (B, T, Hkv, D), all contiguous; lse: (B, Hq, T) f32 from the
// forward.
//   P = exp(scale q k^T - lse) (causal), dv = P^T dout, dP = dout v^T, Di =
//   rowsum(dout * out), dS = P * (dP - Di), dq = scale dS k, dk = scale dS^T q
//   (dq, dk, dv =) GQA: dk, dv of kv head hk sum over query heads hk * G .. hk
//   * G + G - 1.
//
// di_kernel<T>: Di (B, Hq, T) f32 into scratch, one warp per row (both paths).
//
// flash_bwd_kernel<D, Bq> (bf16, D in {64, 128}): one CTA of 4 warps per (64
// keys, kv head, batch); warp w owns keys 16w..16w+15 and keeps their dK, dV
// rows in f32 registers. It walks the G query heads of the group and, for each,
// the query blocks of Bq rows from the diagonal on (Q, dO, lse, Di
// double-buffered with cp.async):
//   S^T = K Q^T and dP^T = V dO^T (K, V rows as A fragments, Q, dO as col-major
//   B fragments), P^T = exp2(S^T scale log2e - lse log2e) masked, dS^T = scale
//   P^T (dP^T - Di), dV += P^T dO, dK += dS^T Q (P^T, dS^T re-packed as A
//   fragments; dO, Q read transposed), dS^T -> shared memory, then dQ(block) +=
//   dS K split over the warps and added with f32 atomics into the dQ
//   accumulator (scratch); dq_convert_kernel rounds it to bf16 at the end.
// Because the group's heads are summed inside the CTA in a fixed order, dK and
// dV are deterministic. dQ is not bitwise deterministic: several CTAs add into
// each element and the order of the f32 atomics varies between runs (last-bit
// differences).
//
// generic_dq_kernel<T> / generic_dkdv_kernel<T> (any dtype, D <= 256): f32
// SIMT, no atomics. dQ: items are (query, head of the group), lanes score the
// 32 keys of a shared K/V tile. dK/dV: items are keys, lanes score the 32
// queries of a shared Q/dO tile, looping over the group's heads. Both
// deterministic.
#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_ptx.cuh"
#include "kernels/cuda/attention_tile.h"
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {
namespace {

using attn::acc_col;
using attn::acc_row;
using attn::ldsm_pattern_x;
using attn::ldsm_pattern_y;
using attn::tile_byte_offset;

constexpr float kLog2e = 1.4426950408889634f;

// ---- Di = rowsum(dout * out)
// -------------------------------------------------------------------- Rows in
// (b, i, h) order (contiguous in out); di: (B, Hq, T).
template <typename T>
__global__ void __launch_bounds__(128)
    di_kernel(const T *out, const T *dout, float *di, int64_t rows, int Tn, int Hq, int D) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5); row < rows;
       row += warps) {
    const T *o = out + row * D;
    const T *g = dout + row * D;
    float acc = 0.f;
    for (int d = lane; d < D; d += 32) acc = fmaf(load(o[d]), load(g[d]), acc);
    acc = warp_sum(acc);
    const int h = static_cast<int>(row % Hq);
    const int64_t bi = row / Hq;
    const int i = static_cast<int>(bi % Tn);
    const int64_t b = bi / Tn;
    if (lane == 0) di[(b * Hq + h) * Tn + i] = acc;
  }
}

// ---- flash backward
// -----------------------------------------------------------------------------

struct FlashBwdParams {
  const __nv_bfloat16 *q;
  const __nv_bfloat16 *k;
  const __nv_bfloat16 *v;
  const __nv_bfloat16 *dout;
  const float *lse;
  const float *di;
  float *dq_acc;  // (B, T, Hq, D) f32, zeroed
  __nv_bfloat16 *dk;
  __nv_bfloat16 *dv;
  int T, Hq, Hkv, G;
  float scale, scale_log2;
};

template <int D, int kBq>
__global__ void __launch_bounds__(128) flash_bwd_kernel(const FlashBwdParams p) {
  constexpr int kBc = 64, kThreads = 128, kChunks = D / 8;
  constexpr int kNq = kBq / 8;        // n-tiles of S^T (8 queries each)
  constexpr int kDt = D / 8;          // n-tiles of dK / dV rows (8 columns each)
  constexpr int kDsStride = kBq + 8;  // bf16 per dS^T row: padding spreads ldmatrix rows
  constexpr int kTileBytes = kBq * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char *sK = smem;                                               // [64][D]
  unsigned char *sV = sK + kBc * D * 2;                                   // [64][D]
  unsigned char *sQ = sV + kBc * D * 2;                                   // 2 x [kBq][D]
  unsigned char *sdO = sQ + 2 * kTileBytes;                               // 2 x [kBq][D]
  float *sL = reinterpret_cast<float *>(sdO + 2 * kTileBytes);            // 2 x [kBq] lse log2e
  float *sDi = sL + 2 * kBq;                                              // 2 x [kBq]
  unsigned char *sdS = reinterpret_cast<unsigned char *>(sDi + 2 * kBq);  // [64][kDsStride]
  const uint32_t aK = attn::smem_addr(sK), aV = attn::smem_addr(sV);
  const uint32_t aQ0 = attn::smem_addr(sQ), adO0 = attn::smem_addr(sdO);
  const uint32_t adS = attn::smem_addr(sdS);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * kBc;
  const int Tn = p.T;
  const int64_t q_stride = static_cast<int64_t>(p.Hq) * D;
  const int64_t kv_stride = static_cast<int64_t>(p.Hkv) * D;
  const __nv_bfloat16 *kg = p.k + (static_cast<int64_t>(b) * Tn * p.Hkv + hk) * D;
  const __nv_bfloat16 *vg = p.v + (static_cast<int64_t>(b) * Tn * p.Hkv + hk) * D;
  attn::load_tile_async<D, kThreads>(sK, kg, kv_stride, k0, kBc, Tn);
  attn::load_tile_async<D, kThreads>(sV, vg, kv_stride, k0, kBc, Tn);
  attn::cp_async_commit();

  const int qb0 = static_cast<int>(attn::bwd_first_query_block(k0, kBq));
  const int per_head = (Tn + kBq - 1) / kBq - qb0;
  const int n_iter = p.G * per_head;

  // Iteration it: query head hk * G + it / per_head, query block qb0 + it %
  // per_head.
  auto issue_tile = [&](int it, int buf) {
    const int h = hk * p.G + it / per_head;
    const int q0 = (qb0 + it % per_head) * kBq;
    const int64_t head0 = (static_cast<int64_t>(b) * Tn * p.Hq + h) * D;
    attn::load_tile_async<D, kThreads>(sQ + buf * kTileBytes, p.q + head0, q_stride, q0, kBq, Tn);
    attn::load_tile_async<D, kThreads>(sdO + buf * kTileBytes, p.dout + head0, q_stride, q0, kBq,
                                       Tn);
    for (int i = threadIdx.x; i < kBq; i += kThreads) {
      const int row = q0 + i;
      const int64_t li = (static_cast<int64_t>(b) * p.Hq + h) * Tn + row;
      // Rows past T: P = exp2(-inf) = 0 and Di = 0, so they contribute nothing.
      sL[buf * kBq + i] = row < Tn ? p.lse[li] * kLog2e : INFINITY;
      sDi[buf * kBq + i] = row < Tn ? p.di[li] : 0.f;
    }
  };
  issue_tile(0, 0);
  attn::cp_async_commit();

  float dk[kDt][4], dv[kDt][4];
#pragma unroll
  for (int i = 0; i < kDt; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;

  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    if (it + 1 < n_iter) {
      issue_tile(it + 1,
                 buf ^ 1);  // that buffer was released by the last __syncthreads
      attn::cp_async_commit();
      attn::cp_async_wait<1>();
    } else {
      attn::cp_async_wait<0>();
    }
    __syncthreads();  // tile `it` (and, first time, K and V) visible to all
                      // threads
    const int h = hk * p.G + it / per_head;
    const int q0 = (qb0 + it % per_head) * kBq;
    const uint32_t aQ = aQ0 + buf * kTileBytes, adO = adO0 + buf * kTileBytes;
    const float *L = sL + buf * kBq;
    const float *Di = sDi + buf * kBq;

    // S^T = K Q^T and dP^T = V dO^T: 16 keys x kBq queries per warp.
    float st[kNq][4], dpt[kNq][4];
#pragma unroll
    for (int i = 0; i < kNq; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const attn::RowChunk ra = ldsm_pattern_x(lane, warp * 16, ks * 2);
      uint32_t ak[4], av[4];
      attn::ldsm_x4(aK + tile_byte_offset(ra.row, ra.chunk, kChunks), ak);
      attn::ldsm_x4(aV + tile_byte_offset(ra.row, ra.chunk, kChunks), av);
#pragma unroll
      for (int np = 0; np < kNq / 2; ++np) {
        const attn::RowChunk rb = ldsm_pattern_y(lane, np * 16, ks * 2);
        uint32_t bq[4], bo[4];
        attn::ldsm_x4(aQ + tile_byte_offset(rb.row, rb.chunk, kChunks), bq);
        attn::ldsm_x4(adO + tile_byte_offset(rb.row, rb.chunk, kChunks), bo);
        attn::mma_x2(st[2 * np], st[2 * np + 1], ak, bq);
        attn::mma_x2(dpt[2 * np], dpt[2 * np + 1], av, bo);
      }
    }

    // P^T (in st) and dS^T (in dpt, scaled). Accumulator rows are keys, columns
    // queries.
    const bool need_mask = attn::bwd_block_needs_mask(q0, kBq, k0, kBc, Tn);
#pragma unroll
    for (int nt = 0; nt < kNq; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + acc_col(lane, e);
        float pe = exp2f(st[nt][e] * p.scale_log2 - L[qi]);
        if (need_mask) {
          const int key = k0 + warp * 16 + acc_row(lane, e);
          const int query = q0 + qi;
          if (key > query || query >= Tn) pe = 0.f;
        }
        st[nt][e] = pe;
        dpt[nt][e] = pe * (dpt[nt][e] - Di[qi]) * p.scale;
      }
    }

    // dV += P^T dO and dK += dS^T Q (k = queries).
#pragma unroll
    for (int kk = 0; kk < kBq / 16; ++kk) {
      uint32_t ap[4], ads[4];
      attn::accumulators_to_a(st[2 * kk], st[2 * kk + 1], ap);
      attn::accumulators_to_a(dpt[2 * kk], dpt[2 * kk + 1], ads);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const attn::RowChunk rt = ldsm_pattern_x(lane, kk * 16, dp * 2);
        uint32_t bo[4], bq[4];
        attn::ldsm_x4_trans(adO + tile_byte_offset(rt.row, rt.chunk, kChunks), bo);
        attn::ldsm_x4_trans(aQ + tile_byte_offset(rt.row, rt.chunk, kChunks), bq);
        attn::mma_x2(dv[2 * dp], dv[2 * dp + 1], ap, bo);
        attn::mma_x2(dk[2 * dp], dk[2 * dp + 1], ads, bq);
      }
    }

    // dS^T (bf16) to shared memory, [key][query].
#pragma unroll
    for (int nt = 0; nt < kNq; ++nt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + acc_row(lane, 2 * r);
        const int col = nt * 8 + acc_col(lane, 0);
        *reinterpret_cast<uint32_t *>(sdS + (row * kDsStride + col) * 2) =
            attn::pack_bf16(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
      }
    }
    __syncthreads();  // all of dS^T written

    // dQ(q0 .. q0 + kBq) += dS K: units of 16 queries x 16 columns, spread over
    // the warps.
    constexpr int kUnits = (kBq / 16) * (D / 16);
    for (int u = warp; u < kUnits; u += kThreads / 32) {
      const int mt = u / (D / 16), dc = u % (D / 16);
      float acc[2][4];
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][e] = acc[1][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t a[4], bk[4];
        const attn::RowChunk ra = ldsm_pattern_y(lane, kk * 16, mt * 2);  // dS^T is [k][m]
        attn::ldsm_x4_trans(adS + ra.row * kDsStride * 2 + ra.chunk * 16, a);
        const attn::RowChunk rb = ldsm_pattern_x(lane, kk * 16, dc * 2);  // K is [k][n]
        attn::ldsm_x4_trans(aK + tile_byte_offset(rb.row, rb.chunk, kChunks), bk);
        attn::mma_x2(acc[0], acc[1], a, bk);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int query = q0 + mt * 16 + acc_row(lane, 2 * r);
        if (query >= Tn) continue;
        float *dst = p.dq_acc + ((static_cast<int64_t>(b) * Tn + query) * p.Hq + h) * D + dc * 16 +
                     acc_col(lane, 0);
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
          atomicAdd(reinterpret_cast<float2 *>(dst + nn * 8),
                    make_float2(acc[nn][2 * r], acc[nn][2 * r + 1]));
      }
    }
    __syncthreads();  // buffers of `it` and dS^T free for reuse
  }

  // dK, dV rows of this warp's keys (bf16x2 stores).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = k0 + warp * 16 + acc_row(lane, 2 * r);
    if (key >= Tn) continue;
    const int64_t off = ((static_cast<int64_t>(b) * Tn + key) * p.Hkv + hk) * D + acc_col(lane, 0);
#pragma unroll
    for (int dt = 0; dt < kDt; ++dt) {
      *reinterpret_cast<uint32_t *>(p.dk + off + dt * 8) =
          attn::pack_bf16(dk[dt][2 * r], dk[dt][2 * r + 1]);
      *reinterpret_cast<uint32_t *>(p.dv + off + dt * 8) =
          attn::pack_bf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

__global__ void dq_convert_kernel(const float *acc, __nv_bfloat16 *dq, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    dq[i] = __float2bfloat16_rn(acc[i]);
}

template <int D, int kBq>
void launch_flash_bwd(const AttentionPlan &plan, const FlashBwdParams &p, StreamHandle stream) {
  static std::atomic<bool> done[16];
  const size_t smem = flash_bwd_smem_bytes(kBq, D);
  KILN_CHECK(plan.smem_bytes == smem && plan.threads == 128,
             "[attention_backward] plan and kernel disagree (smem {} vs {})", plan.smem_bytes,
             smem);
  attn::ensure_smem(flash_bwd_kernel<D, kBq>, smem, done);
  flash_bwd_kernel<D, kBq><<<attn::plan_grid(plan), 128, smem, stream>>>(p);
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- generic backward
// ---------------------------------------------------------------------------

template <typename T>
struct GenericBwdParams {
  const T *q;
  const T *k;
  const T *v;
  const T *dout;
  const float *lse;
  const float *di;
  T *dq;
  T *dk;
  T *dv;
  int T_, Hq, Hkv, G, D;
  float scale;
};

constexpr int kWarps = kGenericThreads / 32;
constexpr int kItemsPerWarp = kGenericItems / kWarps;
constexpr int kMaxPerLane = kGenericMaxD / 32;
static_assert(kGenericTile == 32, "generic kernels map one key (or query) of a tile per lane");

__device__ __forceinline__ float dot_row(const float *a, const float *b, int D) {
  float acc = 0.f;
  for (int d = 0; d < D; ++d) acc = fmaf(a[d], b[d], acc);
  return acc;
}

// dQ: items (query, head of the group) of kv head blockIdx.y; K/V tiles of 32
// keys.
template <typename T>
__global__ void __launch_bounds__(kGenericThreads) generic_dq_kernel(const GenericBwdParams<T> p) {
  extern __shared__ float gsm[];
  const int D = p.D, Dp = D + 1, Tn = p.T_;
  float *s_q = gsm;                       // [items][D]
  float *s_do = s_q + kGenericItems * D;  // [items][D]
  float *s_k = s_do + kGenericItems * D;  // [32][D + 1]
  float *s_v = s_k + kGenericTile * Dp;   // [32][D + 1]
  float *s_p = s_v + kGenericTile * Dp;   // [warps][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int r0 = blockIdx.x * kGenericItems;
  const int r1 = min(r0 + kGenericItems, Tn * p.G);
  const int kend = static_cast<int>(attn::generic_key_end(r1, p.G, 0));

  for (int e = threadIdx.x; e < kGenericItems * D; e += kGenericThreads) {
    const int it = e / D, d = e % D, r = r0 + it;
    float x = 0.f, g = 0.f;
    if (r < r1) {
      const int64_t off =
          ((static_cast<int64_t>(b) * Tn + r / p.G) * p.Hq + hk * p.G + r % p.G) * D + d;
      x = load(p.q[off]);
      g = load(p.dout[off]);
    }
    s_q[e] = x;
    s_do[e] = g;
  }
  float dq[kItemsPerWarp][kMaxPerLane];
  float lse[kItemsPerWarp], di[kItemsPerWarp];
  int pos[kItemsPerWarp];
#pragma unroll
  for (int it = 0; it < kItemsPerWarp; ++it) {
    const int r = r0 + warp * kItemsPerWarp + it;
    pos[it] = r / p.G;
    lse[it] = di[it] = 0.f;
    if (r < r1) {
      const int64_t li = (static_cast<int64_t>(b) * p.Hq + hk * p.G + r % p.G) * Tn + r / p.G;
      lse[it] = p.lse[li];
      di[it] = p.di[li];
    }
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) dq[it][c] = 0.f;
  }

  for (int kt = 0; kt < kend; kt += kGenericTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kGenericTile * D; e += kGenericThreads) {
      const int j = e / D, d = e % D, key = kt + j;
      float kx = 0.f, vx = 0.f;
      if (key < kend) {
        const int64_t off = ((static_cast<int64_t>(b) * Tn + key) * p.Hkv + hk) * D + d;
        kx = load(p.k[off]);
        vx = load(p.v[off]);
      }
      s_k[j * Dp + d] = kx;
      s_v[j * Dp + d] = vx;
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < kItemsPerWarp; ++it) {
      const int item = warp * kItemsPerWarp + it;
      if (r0 + item >= r1) continue;  // warp-uniform
      const int key = kt + lane;
      float ds = 0.f;
      if (key < kend && key <= pos[it]) {
        const float pe = expf(p.scale * dot_row(s_q + item * D, s_k + lane * Dp, D) - lse[it]);
        const float dp = dot_row(s_do + item * D, s_v + lane * Dp, D);
        ds = pe * (dp - di[it]);
      }
      s_p[warp * 32 + lane] = ds;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        const int d = c * 32 + lane;
        if (d < D) {
          float acc = dq[it][c];
          for (int jj = 0; jj < kGenericTile; ++jj)
            acc = fmaf(s_p[warp * 32 + jj], s_k[jj * Dp + d], acc);
          dq[it][c] = acc;
        }
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int it = 0; it < kItemsPerWarp; ++it) {
    const int r = r0 + warp * kItemsPerWarp + it;
    if (r >= r1) continue;
    T *row = p.dq + ((static_cast<int64_t>(b) * Tn + r / p.G) * p.Hq + hk * p.G + r % p.G) * D;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int d = c * 32 + lane;
      if (d < D) row[d] = store<T>(p.scale * dq[it][c]);
    }
  }
}

// dK, dV: items are keys j0 .. j0 + 7 of kv head blockIdx.y; Q/dO tiles of 32
// queries, over the G query heads of the group and the queries i >= j0.
template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
    generic_dkdv_kernel(const GenericBwdParams<T> p) {
  extern __shared__ float gsm[];
  const int D = p.D, Dp = D + 1, Tn = p.T_;
  float *s_kr = gsm;                       // [items][D] key rows
  float *s_vr = s_kr + kGenericItems * D;  // [items][D] value rows
  float *s_q = s_vr + kGenericItems * D;   // [32][D + 1]
  float *s_do = s_q + kGenericTile * Dp;   // [32][D + 1]
  float *s_p = s_do + kGenericTile * Dp;   // [warps][32]
  float *s_ds = s_p + kWarps * 32;         // [warps][32]
  float *s_l = s_ds + kWarps * 32;         // [32]
  float *s_di = s_l + kGenericTile;        // [32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int j0 = blockIdx.x * kGenericItems;
  const int j1 = min(j0 + kGenericItems, Tn);

  for (int e = threadIdx.x; e < kGenericItems * D; e += kGenericThreads) {
    const int it = e / D, d = e % D, j = j0 + it;
    float kx = 0.f, vx = 0.f;
    if (j < j1) {
      const int64_t off = ((static_cast<int64_t>(b) * Tn + j) * p.Hkv + hk) * D + d;
      kx = load(p.k[off]);
      vx = load(p.v[off]);
    }
    s_kr[e] = kx;
    s_vr[e] = vx;
  }
  float dk[kItemsPerWarp][kMaxPerLane], dv[kItemsPerWarp][kMaxPerLane];
#pragma unroll
  for (int it = 0; it < kItemsPerWarp; ++it)
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) dk[it][c] = dv[it][c] = 0.f;

  for (int g = 0; g < p.G; ++g) {
    const int h = hk * p.G + g;
    for (int qt = j0; qt < Tn; qt += kGenericTile) {
      __syncthreads();
      for (int e = threadIdx.x; e < kGenericTile * D; e += kGenericThreads) {
        const int i = e / D, d = e % D, query = qt + i;
        float x = 0.f, gx = 0.f;
        if (query < Tn) {
          const int64_t off = ((static_cast<int64_t>(b) * Tn + query) * p.Hq + h) * D + d;
          x = load(p.q[off]);
          gx = load(p.dout[off]);
        }
        s_q[i * Dp + d] = x;
        s_do[i * Dp + d] = gx;
      }
      if (threadIdx.x < kGenericTile) {
        const int query = qt + threadIdx.x;
        const int64_t li = (static_cast<int64_t>(b) * p.Hq + h) * Tn + query;
        s_l[threadIdx.x] = query < Tn ? p.lse[li] : 0.f;
        s_di[threadIdx.x] = query < Tn ? p.di[li] : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int it = 0; it < kItemsPerWarp; ++it) {
        const int item = warp * kItemsPerWarp + it, j = j0 + item;
        if (j >= j1) continue;  // warp-uniform
        const int query = qt + lane;
        float pe = 0.f, ds = 0.f;
        if (query < Tn && query >= j) {
          pe = expf(p.scale * dot_row(s_q + lane * Dp, s_kr + item * D, D) - s_l[lane]);
          ds = pe * (dot_row(s_do + lane * Dp, s_vr + item * D, D) - s_di[lane]);
        }
        s_p[warp * 32 + lane] = pe;
        s_ds[warp * 32 + lane] = ds;
        __syncwarp();
#pragma unroll
        for (int c = 0; c < kMaxPerLane; ++c) {
          const int d = c * 32 + lane;
          if (d < D) {
            float av = dv[it][c], ak = dk[it][c];
            for (int ii = 0; ii < kGenericTile; ++ii) {
              av = fmaf(s_p[warp * 32 + ii], s_do[ii * Dp + d], av);
              ak = fmaf(s_ds[warp * 32 + ii], s_q[ii * Dp + d], ak);
            }
            dv[it][c] = av;
            dk[it][c] = ak;
          }
        }
        __syncwarp();
      }
    }
  }
#pragma unroll
  for (int it = 0; it < kItemsPerWarp; ++it) {
    const int j = j0 + warp * kItemsPerWarp + it;
    if (j >= j1) continue;
    const int64_t off = ((static_cast<int64_t>(b) * Tn + j) * p.Hkv + hk) * D;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int d = c * 32 + lane;
      if (d < D) {
        p.dk[off + d] = store<T>(p.scale * dk[it][c]);
        p.dv[off + d] = store<T>(dv[it][c]);
      }
    }
  }
}

}  // namespace

template <typename T>
void attention_backward(const AttentionPlan &plan, const AttentionShape &s, float scale, const T *q,
                        const T *k, const T *v, const T *out, const float *lse, const T *dout,
                        T *dq, T *dk, T *dv, float *scratch, StreamHandle stream) {
  KILN_CHECK(scratch != nullptr && plan.scratch_floats > 0, "[attention_backward] needs scratch");
  const int64_t Tn = s.Tq;
  const int64_t rows = s.B * Tn * s.Hq;
  // Scratch: [dQ accumulator (flash only, first, so float2 atomics stay 8-byte
  // aligned)][Di].
  const int64_t dq_floats = plan.path == AttentionPath::Flash ? rows * s.D : 0;
  float *dq_acc = scratch;
  float *di = scratch + dq_floats;
  KILN_CHECK(plan.scratch_floats >= dq_floats + rows, "[attention_backward] scratch too small");

  di_kernel<T><<<grid_for(rows * 32, 128), 128, 0, stream>>>(
      out, dout, di, rows, static_cast<int>(Tn), static_cast<int>(s.Hq), static_cast<int>(s.D));
  KILN_CUDA_CHECK_LAUNCH();

  if (plan.path == AttentionPath::Generic) {
    static std::atomic<bool> done_dq[16], done_dkdv[16];
    KILN_CHECK(plan.smem_bytes == generic_smem_bytes(s.D) && plan.threads == kGenericThreads,
               "[attention_backward] plan and generic kernel disagree");
    GenericBwdParams<T> p{};
    p.q = q;
    p.k = k;
    p.v = v;
    p.dout = dout;
    p.lse = lse;
    p.di = di;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    p.T_ = static_cast<int>(Tn);
    p.Hq = static_cast<int>(s.Hq);
    p.Hkv = static_cast<int>(s.Hkv);
    p.G = static_cast<int>(s.Hq / s.Hkv);
    p.D = static_cast<int>(s.D);
    p.scale = scale;
    attn::ensure_smem(generic_dq_kernel<T>, generic_smem_bytes(kGenericMaxD), done_dq);
    attn::ensure_smem(generic_dkdv_kernel<T>, generic_smem_bytes(kGenericMaxD), done_dkdv);
    generic_dq_kernel<T><<<attn::plan_grid(plan), kGenericThreads, plan.smem_bytes, stream>>>(p);
    KILN_CUDA_CHECK_LAUNCH();
    const dim3 grid_kv(static_cast<unsigned>((Tn + kGenericItems - 1) / kGenericItems),
                       static_cast<unsigned>(s.Hkv), static_cast<unsigned>(s.B));
    generic_dkdv_kernel<T><<<grid_kv, kGenericThreads, plan.smem_bytes, stream>>>(p);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }

  if constexpr (!std::is_same_v<T, bf16>) {
    fail("[attention_backward] the tensor-core kernel takes bf16 only");
  } else {
    memset_async(dq_acc, 0, static_cast<size_t>(dq_floats) * sizeof(float), stream);
    FlashBwdParams p{};
    p.q = reinterpret_cast<const __nv_bfloat16 *>(q);
    p.k = reinterpret_cast<const __nv_bfloat16 *>(k);
    p.v = reinterpret_cast<const __nv_bfloat16 *>(v);
    p.dout = reinterpret_cast<const __nv_bfloat16 *>(dout);
    p.lse = lse;
    p.di = di;
    p.dq_acc = dq_acc;
    p.dk = reinterpret_cast<__nv_bfloat16 *>(dk);
    p.dv = reinterpret_cast<__nv_bfloat16 *>(dv);
    p.T = static_cast<int>(Tn);
    p.Hq = static_cast<int>(s.Hq);
    p.Hkv = static_cast<int>(s.Hkv);
    p.G = static_cast<int>(s.Hq / s.Hkv);
    p.scale = scale;
    p.scale_log2 = scale * kLog2e;
    if (s.D == 64 && plan.block_q == 64)
      launch_flash_bwd<64, 64>(plan, p, stream);
    else if (s.D == 128 && plan.block_q == 32)
      launch_flash_bwd<128, 32>(plan, p, stream);
    else
      fail("[attention_backward] no flash kernel for D {} block {}", s.D, plan.block_q);
    dq_convert_kernel<<<grid_for(dq_floats, 256), 256, 0, stream>>>(
        dq_acc, reinterpret_cast<__nv_bfloat16 *>(dq), dq_floats);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

template void attention_backward<float>(const AttentionPlan &, const AttentionShape &, float,
                                        const float *, const float *, const float *, const float *,
                                        const float *, const float *, float *, float *, float *,
                                        float *, StreamHandle);
template void attention_backward<bf16>(const AttentionPlan &, const AttentionShape &, float,
                                       const bf16 *, const bf16 *, const bf16 *, const bf16 *,
                                       const float *, const bf16 *, bf16 *, bf16 *, bf16 *, float *,
                                       StreamHandle);
template void attention_backward<f16>(const AttentionPlan &, const AttentionShape &, float,
                                      const f16 *, const f16 *, const f16 *, const f16 *,
                                      const float *, const f16 *, f16 *, f16 *, f16 *, float *,
                                      StreamHandle);

}  // namespace kiln::cuda
