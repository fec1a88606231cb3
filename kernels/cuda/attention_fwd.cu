// Causal GQA attention forward on CUDA (plans, layouts and the choice of
// kernel: attention.h).
//
//   S = scale * q k^T (key j visible to query i iff j <= q_offset + i), P =
//   softmax(S), out = P v (=), lse = log sum_j exp(S_ij) (=, f32, natural log).
//
// q, out: (B, Tq, Hq, D); k, v: (B, Tk, Hkv, D) with batch stride kv_bs; lse:
// (B, Hq, Tq).
//
// flash_fwd_kernel<D, W>: bf16 tensor cores, one CTA per (query block of 16 W
// rows, query head, batch), W warps of 16 rows. Per key block of 64 keys: S = Q
// K^T (mma, K as the col-major B operand straight from the [key][d] tile),
// mask, online softmax in f32 registers (base 2), then O += P V with P
// re-packed from the S accumulators into A fragments (no shared-memory round
// trip) and V read transposed by ldmatrix.trans. Q, K, V tiles are swizzled
// (attention_tile.h); K(j+1) is loaded while P V(j) runs and V(j) while Q
// K(j)^T runs.
//
// generic_fwd_kernel<T>: any dtype, any D <= 256: f32 SIMT math. An item is
// (query, head of the kv group); 4 warps x 2 items per CTA share 32-key K/V
// tiles in shared memory; lane j scores key j, so a tile costs D FMAs per lane
// and two warp reductions per item. With splits > 1 each CTA covers
// keys_per_split keys and writes (o unnormalized, m, l) partials that
// combine_splits_kernel merges (flash-decoding).
#include <cuda_bf16.h>

#include <atomic>
#include <type_traits>

#include "kernels/cuda/activation.h"  // Pack
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

// ---- flash forward (bf16, D in {64, 128})
// -------------------------------------------------------

struct FlashFwdParams {
  const __nv_bfloat16 *q;
  const __nv_bfloat16 *k;
  const __nv_bfloat16 *v;
  __nv_bfloat16 *out;
  float *lse;
  int64_t kv_bs;  // k/v batch stride, elements
  int Tq, Tk, Hq, Hkv, G, q_offset;
  int num_q_blocks;
  float scale_log2;  // scale * log2(e)
};

template <int D, int W>
__global__ void __launch_bounds__(W * 32) flash_fwd_kernel(const FlashFwdParams p) {
  constexpr int kBr = 16 * W, kBc = 64, kThreads = 32 * W, kChunks = D / 8;
  constexpr int kNt = kBc / 8;  // n-tiles of S (8 keys each)
  constexpr int kDt = D / 8;    // n-tiles of O (8 columns each)
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char *sQ = smem;              // [kBr][D]
  unsigned char *sK = sQ + kBr * D * 2;  // [kBc][D]
  unsigned char *sV = sK + kBc * D * 2;  // [kBc][D]
  const uint32_t aQ = attn::smem_addr(sQ), aK = attn::smem_addr(sK), aV = attn::smem_addr(sV);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int qb = p.num_q_blocks - 1 - static_cast<int>(blockIdx.x);  // longest rows first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
  const int q0 = qb * kBr;
  const int64_t q_stride = static_cast<int64_t>(p.Hq) * D;    // between query rows
  const int64_t kv_stride = static_cast<int64_t>(p.Hkv) * D;  // between key rows
  const __nv_bfloat16 *qg = p.q + (static_cast<int64_t>(b) * p.Tq * p.Hq + h) * D;
  const __nv_bfloat16 *kg = p.k + b * p.kv_bs + static_cast<int64_t>(hk) * D;
  const __nv_bfloat16 *vg = p.v + b * p.kv_bs + static_cast<int64_t>(hk) * D;

  const int nkb = static_cast<int>(attn::fwd_key_blocks(q0, kBr, p.Tq, p.Tk, p.q_offset, kBc));
  attn::load_tile_async<D, kThreads>(sQ, qg, q_stride, q0, kBr, p.Tq);
  attn::load_tile_async<D, kThreads>(sK, kg, kv_stride, 0, kBc, p.Tk);
  attn::cp_async_commit();

  float o[kDt][4];
#pragma unroll
  for (int i = 0; i < kDt; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g and g + 8 (base-2 units)
  float l[2] = {0.f, 0.f};              // this lane's partial row sums
  const int row_base = q0 + warp * 16;  // first query row of this warp

  for (int j = 0; j < nkb; ++j) {
    const int k0 = j * kBc;
    attn::cp_async_wait<0>();
    __syncthreads();  // K(j) landed; every warp is done with V(j-1)
    attn::load_tile_async<D, kThreads>(sV, vg, kv_stride, k0, kBc, p.Tk);
    attn::cp_async_commit();

    // S = Q K^T: 16 rows x 64 keys per warp.
    float s[kNt][4];
#pragma unroll
    for (int i = 0; i < kNt; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[4];
      const attn::RowChunk qa = ldsm_pattern_x(lane, warp * 16, ks * 2);
      attn::ldsm_x4(aQ + tile_byte_offset(qa.row, qa.chunk, kChunks), a);
#pragma unroll
      for (int np = 0; np < kNt / 2; ++np) {
        uint32_t bk[4];
        const attn::RowChunk kb = ldsm_pattern_y(lane, np * 16, ks * 2);
        attn::ldsm_x4(aK + tile_byte_offset(kb.row, kb.chunk, kChunks), bk);
        attn::mma_x2(s[2 * np], s[2 * np + 1], a, bk);
      }
    }

    // Scale to base 2, mask, online softmax. Elements e = 0, 1 belong to row g,
    // 2, 3 to g + 8.
    const bool need_mask = attn::fwd_block_needs_mask(q0, p.q_offset, k0, kBc);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * p.scale_log2;
        if (need_mask) {
          const int key = k0 + nt * 8 + acc_col(lane, e);
          const int pos = p.q_offset + row_base + acc_row(lane, e);
          if (key > pos) x = -INFINITY;
        }
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // The 4 lanes of a quad hold the 64 columns of one row.
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const attn::SoftmaxStep st = attn::online_softmax_step(m[r], mx[r]);
      base[r] = st.base;
      l[r] *= st.rescale;
#pragma unroll
      for (int dt = 0; dt < kDt; ++dt) {
        o[dt][2 * r] *= st.rescale;
        o[dt][2 * r + 1] *= st.rescale;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2f(s[nt][e] - base[e >> 1]);  // masked: exp2(-inf) = 0
        s[nt][e] = pe;
        l[e >> 1] += pe;
      }
    }

    attn::cp_async_wait<0>();
    __syncthreads();  // V(j) landed; every warp is done with K(j)
    if (j + 1 < nkb) {
      attn::load_tile_async<D, kThreads>(sK, kg, kv_stride, k0 + kBc, kBc, p.Tk);
      attn::cp_async_commit();
    }

    // O += P V: P (16 x 64) as A fragments from the S accumulators, V tile read
    // transposed.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t a[4];
      attn::accumulators_to_a(s[2 * kk], s[2 * kk + 1], a);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bv[4];
        const attn::RowChunk vb = ldsm_pattern_x(lane, kk * 16, dp * 2);
        attn::ldsm_x4_trans(aV + tile_byte_offset(vb.row, vb.chunk, kChunks), bv);
        attn::mma_x2(o[2 * dp], o[2 * dp + 1], a, bv);
      }
    }
  }

  // Finish: full row sums over the quad, normalize, lse.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
    const int row = row_base + (lane >> 2) + 8 * r;
    if ((lane & 3) == 0 && row < p.Tq)
      p.lse[(static_cast<int64_t>(b) * p.Hq + h) * p.Tq + row] = attn::row_lse(m[r], l[r]);
  }
  // Stage this warp's 16 output rows in its own rows of the Q tile (no other
  // warp reads them), then write whole 16-byte chunks.
  __syncwarp();
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + acc_row(lane, 2 * r);
      const int col = acc_col(lane, 0);  // 2t: byte 4t of chunk dt
      *reinterpret_cast<uint32_t *>(sQ + tile_byte_offset(row, dt, kChunks) + col * 2) =
          attn::pack_bf16(o[dt][2 * r] * inv[r], o[dt][2 * r + 1] * inv[r]);
    }
  }
  __syncwarp();
  __nv_bfloat16 *og = p.out + (static_cast<int64_t>(b) * p.Tq * p.Hq + h) * D;
  for (int c = lane; c < 16 * kChunks; c += 32) {
    const int r = c / kChunks, ch = c % kChunks;
    const int row = row_base + r;
    if (row < p.Tq)
      *reinterpret_cast<uint4 *>(og + static_cast<int64_t>(row) * q_stride + ch * 8) =
          *reinterpret_cast<const uint4 *>(sQ + tile_byte_offset(warp * 16 + r, ch, kChunks));
  }
}

template <int D, int W>
void launch_flash_fwd(const AttentionPlan &plan, const FlashFwdParams &p, StreamHandle stream) {
  static std::atomic<bool> done[16];
  const size_t smem = flash_fwd_smem_bytes(16 * W, D);
  KILN_CHECK(plan.smem_bytes == smem && plan.threads == 32 * W,
             "[attention] plan and kernel disagree (smem {} vs {}, threads {})", plan.smem_bytes,
             smem, plan.threads);
  attn::ensure_smem(flash_fwd_kernel<D, W>, smem, done);
  flash_fwd_kernel<D, W><<<attn::plan_grid(plan), 32 * W, smem, stream>>>(p);
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- generic forward (any dtype, D <= 256)
// ------------------------------------------------------

template <typename T>
struct GenericFwdParams {
  const T *q;
  const T *k;
  const T *v;
  T *out;
  float *lse;
  float *part;  // splits > 1: (splits, B * Hq * Tq, D + 2) partials (o, m, l)
  int64_t kv_bs;
  int64_t rows;  // B * Hq * Tq
  int Tq, Tk, Hq, Hkv, G, D, q_offset;
  int splits, keys_per_split;
  float scale;
};

constexpr int kItemsPerWarp = kGenericItems / (kGenericThreads / 32);
constexpr int kLoadBatch = 8;  // generic forward: K/V tile elements in flight per thread
constexpr int kMaxPerLane = kGenericMaxD / 32;
static_assert(kItemsPerWarp * (kGenericThreads / 32) == kGenericItems);
static_assert(kGenericTile == 32, "generic kernels map one key (or query) of a tile per lane");

template <typename T>
__global__ void __launch_bounds__(kGenericThreads) generic_fwd_kernel(const GenericFwdParams<T> p) {
  extern __shared__ float gsm[];
  const int D = p.D, Dp = D + 1;
  float *s_q = gsm;                          // [items][D]
  float *s_k = s_q + 2 * kGenericItems * D;  // [32][D + 1]
  float *s_v = s_k + kGenericTile * Dp;      // [32][D + 1]
  float *s_p = s_v + kGenericTile * Dp;      // [warps][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ib = blockIdx.x / p.splits, split = blockIdx.x % p.splits;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int r0 = ib * kGenericItems;
  const int r1 = min(r0 + kGenericItems, p.Tq * p.G);
  const int k_lo = split * p.keys_per_split;
  const int k_hi =
      min(static_cast<int>(attn::generic_key_end(r1, p.G, p.q_offset)), k_lo + p.keys_per_split);

  for (int e = threadIdx.x; e < kGenericItems * D; e += kGenericThreads) {
    const int it = e / D, d = e % D, r = r0 + it;
    float x = 0.f;
    if (r < r1) {
      const int i = r / p.G, h = hk * p.G + r % p.G;
      x = load(p.q[((static_cast<int64_t>(b) * p.Tq + i) * p.Hq + h) * D + d]);
    }
    s_q[e] = x;
  }

  float o[kItemsPerWarp][kMaxPerLane];
  float m[kItemsPerWarp], l[kItemsPerWarp];
  int pos[kItemsPerWarp];
#pragma unroll
  for (int it = 0; it < kItemsPerWarp; ++it) {
    m[it] = -INFINITY;
    l[it] = 0.f;
    pos[it] = p.q_offset + (r0 + warp * kItemsPerWarp + it) / p.G;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) o[it][c] = 0.f;
  }

  for (int kt = k_lo; kt < k_hi; kt += kGenericTile) {
    __syncthreads();  // the previous tile is consumed (and s_q is written, first
                      // time)
    // kLoadBatch elements of K and of V per thread are loaded before any is stored, so a tile
    // costs about D / (4 kLoadBatch) memory latencies instead of D / 4: decode is one token
    // against the cache, and a per-element load-then-store loop left it latency-bound (51 us
    // per layer for 128 keys on the H200, ncu 2026-11-26).
    for (int e0 = threadIdx.x; e0 < kGenericTile * D; e0 += kGenericThreads * kLoadBatch) {
      float kx[kLoadBatch], vx[kLoadBatch];
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int e = e0 + u * kGenericThreads, j = e / D, d = e % D, key = kt + j;
        kx[u] = 0.f;
        vx[u] = 0.f;
        if (e < kGenericTile * D && key < k_hi) {
          const int64_t off = b * p.kv_bs + (static_cast<int64_t>(key) * p.Hkv + hk) * D + d;
          kx[u] = load(p.k[off]);
          vx[u] = load(p.v[off]);
        }
      }
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int e = e0 + u * kGenericThreads, j = e / D, d = e % D;
        if (e < kGenericTile * D) {
          s_k[j * Dp + d] = kx[u];
          s_v[j * Dp + d] = vx[u];
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < kItemsPerWarp; ++it) {
      if (r0 + warp * kItemsPerWarp + it >= r1) continue;  // warp-uniform
      const int key = kt + lane;
      float sc = -INFINITY;
      if (key < k_hi && key <= pos[it]) {
        const float *qr = s_q + (warp * kItemsPerWarp + it) * D;
        const float *kr = s_k + lane * Dp;
        // Four independent FMA chains: one chain of D dependent FMAs (each waiting on its
        // shared-memory loads) made the decode forward latency-bound (49 us per layer at 67
        // keys on the H200, ncu 2026-11-26).
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        int d = 0;
#pragma unroll 2
        for (; d + 4 <= D; d += 4) {
          a0 = fmaf(qr[d], kr[d], a0);
          a1 = fmaf(qr[d + 1], kr[d + 1], a1);
          a2 = fmaf(qr[d + 2], kr[d + 2], a2);
          a3 = fmaf(qr[d + 3], kr[d + 3], a3);
        }
        for (; d < D; ++d) a0 = fmaf(qr[d], kr[d], a0);
        sc = ((a0 + a1) + (a2 + a3)) * p.scale;
      }
      const float m_new = fmaxf(m[it], warp_max(sc));
      if (m_new == -INFINITY) continue;        // nothing visible yet for this item (warp-uniform)
      const float corr = expf(m[it] - m_new);  // 0 on the first visible tile
      const float pr = expf(sc - m_new);       // 0 for masked keys
      l[it] = l[it] * corr + warp_sum(pr);
      m[it] = m_new;
      s_p[warp * 32 + lane] = pr;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        const int d = c * 32 + lane;
        if (d < D) {
          float b0 = 0.f, b1 = 0.f, b2 = 0.f, b3 = 0.f;  // four chains, as for S
#pragma unroll
          for (int jj = 0; jj < kGenericTile; jj += 4) {
            b0 = fmaf(s_p[warp * 32 + jj], s_v[jj * Dp + d], b0);
            b1 = fmaf(s_p[warp * 32 + jj + 1], s_v[(jj + 1) * Dp + d], b1);
            b2 = fmaf(s_p[warp * 32 + jj + 2], s_v[(jj + 2) * Dp + d], b2);
            b3 = fmaf(s_p[warp * 32 + jj + 3], s_v[(jj + 3) * Dp + d], b3);
          }
          o[it][c] = fmaf(o[it][c], corr, (b0 + b1) + (b2 + b3));
        }
      }
      __syncwarp();
    }
  }

#pragma unroll
  for (int it = 0; it < kItemsPerWarp; ++it) {
    const int r = r0 + warp * kItemsPerWarp + it;
    if (r >= r1) continue;
    const int i = r / p.G, h = hk * p.G + r % p.G;
    const int64_t row = (static_cast<int64_t>(b) * p.Hq + h) * p.Tq + i;  // lse / partial row
    if (p.splits == 1) {
      const float inv = l[it] > 0.f ? 1.f / l[it] : 0.f;
      T *orow = p.out + ((static_cast<int64_t>(b) * p.Tq + i) * p.Hq + h) * D;
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        const int d = c * 32 + lane;
        if (d < D) orow[d] = store<T>(o[it][c] * inv);
      }
      if (lane == 0) p.lse[row] = m[it] + logf(l[it]);
    } else {
      float *po = p.part + (static_cast<int64_t>(split) * p.rows + row) * (D + 2);
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        const int d = c * 32 + lane;
        if (d < D) po[d] = o[it][c];
      }
      if (lane == 0) {
        po[D] = m[it];  // -inf when this split saw no key of the item
        po[D + 1] = l[it];
      }
    }
  }
}

// Merge split-K partials: one warp per (b, h, i) row. Split 0 always sees key
// 0, so the merged maximum is finite. Lane s (and s + 32) loads split s's max and sum once, the
// warp takes the max, and the weights e_s = exp(m_s - M) reach every lane by shuffle; each lane
// then adds its columns over the splits in split order, kMaxPerLane loads in flight per split.
// (A warp that walked the splits one load after another took 7.7 us per Qwen3-8B layer on the
// H200, more than the decode kernel's 4.9 us: ncu, 2026-11-27.) The sums are the same
// expressions in the same order as that loop's, so the results are the same bits.
template <typename T>
__global__ void __launch_bounds__(128) combine_splits_kernel(const GenericFwdParams<T> p) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int D = p.D;
  for (int64_t row = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5); row < p.rows;
       row += warps) {
    const int i = static_cast<int>(row % p.Tq);
    const int64_t bh = row / p.Tq;
    const int h = static_cast<int>(bh % p.Hq);
    const int64_t b = bh / p.Hq;
    auto split_row = [&](int s) { return p.part + (s * p.rows + row) * (D + 2); };
    // splits <= kMaxSplits = 64 (combine_splits checks): lane holds splits lane and lane + 32
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
    if (lane < p.splits) {
      m_lo = split_row(lane)[D];
      l_lo = split_row(lane)[D + 1];
    }
    if (lane + 32 < p.splits) {
      m_hi = split_row(lane + 32)[D];
      l_hi = split_row(lane + 32)[D + 1];
    }
    const float M = warp_max(fmaxf(m_lo, m_hi));
    const float e_lo = lane < p.splits ? expf(m_lo - M) : 0.f;
    const float e_hi = lane + 32 < p.splits ? expf(m_hi - M) : 0.f;
    const float le_lo = l_lo * e_lo, le_hi = l_hi * e_hi;
    float L = 0.f;
    for (int s = 0; s < p.splits; ++s)
      L += __shfl_sync(0xffffffffu, s < 32 ? le_lo : le_hi, s & 31);
    const float inv = L > 0.f ? 1.f / L : 0.f;
    float acc[kMaxPerLane];
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) acc[c] = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float e = __shfl_sync(0xffffffffu, s < 32 ? e_lo : e_hi, s & 31);
      const float *ps = split_row(s);
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        const int d = c * 32 + lane;
        if (d < D) acc[c] += ps[d] * e;
      }
    }
    T *orow = p.out + ((b * p.Tq + i) * p.Hq + h) * D;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int d = c * 32 + lane;
      if (d < D) orow[d] = store<T>(acc[c] * inv);
    }
    if (lane == 0) p.lse[row] = M + logf(L);
  }
}

// ---- decode forward (Tq == 1; the path and its splits in attention.h) --------------------------

// grid (splits, Hq, B), kDecodeThreads threads. Lane `lane` holds columns [lane * DL, lane * DL +
// DL) of q (pre-scaled), of each K/V row and of its output. Warp w takes keys k_lo + w,
// k_lo + w + 4, ... in rounds of kDecodeKeysInFlight, each round one max and one rescale.
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeKeysInFlight = 4;

template <typename T, int DL>
__global__ void __launch_bounds__(kDecodeThreads) decode_fwd_kernel(const GenericFwdParams<T> p) {
  __shared__ float s_o[kDecodeWarps][32 * DL];
  __shared__ float s_m[kDecodeWarps], s_l[kDecodeWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / p.G;
  const int D = 32 * DL;
  const int k_lo = split * p.keys_per_split;
  const int k_hi = min(p.q_offset + 1, k_lo + p.keys_per_split);

  float qv[DL];
  {
    const Pack<T, DL> qp = *reinterpret_cast<const Pack<T, DL> *>(
        p.q + (static_cast<int64_t>(b) * p.Hq + h) * D + lane * DL);
#pragma unroll
    for (int e = 0; e < DL; ++e) qv[e] = load(qp.v[e]) * p.scale;
  }
  float m = -INFINITY, l = 0.f, o[DL];
#pragma unroll
  for (int e = 0; e < DL; ++e) o[e] = 0.f;
  const int64_t key_stride = static_cast<int64_t>(p.Hkv) * D;
  const T *kb = p.k + b * p.kv_bs + static_cast<int64_t>(hk) * D + lane * DL;
  const T *vb = p.v + b * p.kv_bs + static_cast<int64_t>(hk) * D + lane * DL;

  for (int j0 = k_lo + warp; j0 < k_hi; j0 += kDecodeWarps * kDecodeKeysInFlight) {
    Pack<T, DL> kp[kDecodeKeysInFlight], vp[kDecodeKeysInFlight];
#pragma unroll
    for (int u = 0; u < kDecodeKeysInFlight; ++u) {
      const int j = j0 + u * kDecodeWarps;
      if (j < k_hi) {  // warp-uniform
        kp[u] = *reinterpret_cast<const Pack<T, DL> *>(kb + j * key_stride);
        vp[u] = *reinterpret_cast<const Pack<T, DL> *>(vb + j * key_stride);
      }
    }
    float sc[kDecodeKeysInFlight];
#pragma unroll
    for (int u = 0; u < kDecodeKeysInFlight; ++u) {
      float a = 0.f;
#pragma unroll
      for (int e = 0; e < DL; ++e) a = fmaf(qv[e], load(kp[u].v[e]), a);
      sc[u] = a;
    }
#pragma unroll
    for (int u = 0; u < kDecodeKeysInFlight; ++u) sc[u] = warp_sum(sc[u]);
    float mx = m;
#pragma unroll
    for (int u = 0; u < kDecodeKeysInFlight; ++u)
      if (j0 + u * kDecodeWarps < k_hi) mx = fmaxf(mx, sc[u]);
    const float corr = expf(m - mx);  // 0 on the warp's first round (m = -inf)
    l *= corr;
#pragma unroll
    for (int e = 0; e < DL; ++e) o[e] *= corr;
#pragma unroll
    for (int u = 0; u < kDecodeKeysInFlight; ++u) {
      if (j0 + u * kDecodeWarps >= k_hi) continue;
      const float pr = expf(sc[u] - mx);
      l += pr;
#pragma unroll
      for (int e = 0; e < DL; ++e) o[e] = fmaf(pr, load(vp[u].v[e]), o[e]);
    }
    m = mx;
  }

  // Merge the warps (a warp without keys has m = -inf, l = 0; warp 0 always has k_lo).
#pragma unroll
  for (int e = 0; e < DL; ++e) s_o[warp][lane * DL + e] = o[e];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, s_m[w]);
  float f[kDecodeWarps], L = 0.f;
#pragma unroll
  for (int w = 0; w < kDecodeWarps; ++w) {
    f[w] = expf(s_m[w] - M);
    L += s_l[w] * f[w];
  }
  const int64_t row = static_cast<int64_t>(b) * p.Hq + h;  // Tq == 1
  if (p.splits == 1) {
    const float inv = L > 0.f ? 1.f / L : 0.f;
    T *orow = p.out + row * D;
    for (int d = threadIdx.x; d < D; d += kDecodeThreads) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) acc += s_o[w][d] * f[w];
      orow[d] = store<T>(acc * inv);
    }
    if (threadIdx.x == 0) p.lse[row] = M + logf(L);
  } else {
    float *po = p.part + (static_cast<int64_t>(split) * p.rows + row) * (D + 2);
    for (int d = threadIdx.x; d < D; d += kDecodeThreads) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) acc += s_o[w][d] * f[w];
      po[d] = acc;
    }
    if (threadIdx.x == 0) {
      po[D] = M;
      po[D + 1] = L;
    }
  }
}

// The parameters of both SIMT forwards (generic and decode) for shape s and its plan.
template <typename T>
GenericFwdParams<T> fwd_params(const AttentionPlan &plan, const AttentionShape &s, float scale,
                               const T *q, const T *k, const T *v, T *out, float *lse,
                               float *scratch) {
  KILN_CHECK(plan.splits == 1 || scratch != nullptr, "[attention] split-K needs scratch");
  GenericFwdParams<T> p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.part = scratch;
  p.kv_bs = s.kv_batch_stride;
  p.rows = s.B * s.Hq * s.Tq;
  p.Tq = static_cast<int>(s.Tq);
  p.Tk = static_cast<int>(s.Tk);
  p.Hq = static_cast<int>(s.Hq);
  p.Hkv = static_cast<int>(s.Hkv);
  p.G = static_cast<int>(s.Hq / s.Hkv);
  p.D = static_cast<int>(s.D);
  p.q_offset = static_cast<int>(s.q_offset);
  p.splits = static_cast<int>(plan.splits);
  p.keys_per_split = static_cast<int>(plan.keys_per_split);
  p.scale = scale;
  return p;
}

// Merges the split-K partials into out and lse (nothing to merge with one split).
template <typename T>
void combine_splits(const GenericFwdParams<T> &p, StreamHandle stream) {
  if (p.splits <= 1) return;
  KILN_CHECK(p.splits <= kMaxSplits && p.D <= kGenericMaxD,
             "[attention] {} splits of D {} exceed the merge's {} and {}", p.splits, p.D,
             kMaxSplits, kGenericMaxD);
  combine_splits_kernel<T><<<grid_for(p.rows * 32, 128), 128, 0, stream>>>(p);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_generic_fwd(const AttentionPlan &plan, const AttentionShape &s, float scale, const T *q,
                        const T *k, const T *v, T *out, float *lse, float *scratch,
                        StreamHandle stream) {
  static std::atomic<bool> done[16];
  KILN_CHECK(plan.smem_bytes == generic_smem_bytes(s.D) && plan.threads == kGenericThreads,
             "[attention] plan and generic kernel disagree");
  const GenericFwdParams<T> p = fwd_params(plan, s, scale, q, k, v, out, lse, scratch);
  // One limit for every D: the largest this kernel is ever planned with.
  attn::ensure_smem(generic_fwd_kernel<T>, generic_smem_bytes(kGenericMaxD), done);
  generic_fwd_kernel<T><<<attn::plan_grid(plan), kGenericThreads, plan.smem_bytes, stream>>>(p);
  KILN_CUDA_CHECK_LAUNCH();
  combine_splits(p, stream);
}

template <typename T>
void launch_decode_fwd(const AttentionPlan &plan, const AttentionShape &s, float scale, const T *q,
                       const T *k, const T *v, T *out, float *lse, float *scratch,
                       StreamHandle stream) {
  KILN_CHECK(s.Tq == 1 && plan.threads == kDecodeThreads && plan.grid[0] == plan.splits &&
                 plan.keys_per_split * plan.splits >= s.q_offset + 1,
             "[attention] plan and decode kernel disagree");
  const GenericFwdParams<T> p = fwd_params(plan, s, scale, q, k, v, out, lse, scratch);
  auto launch = [&](auto dl) {
    constexpr int DL = decltype(dl)::value;
    decode_fwd_kernel<T, DL><<<attn::plan_grid(plan), kDecodeThreads, 0, stream>>>(p);
    KILN_CUDA_CHECK_LAUNCH();
  };
  switch (s.D) {
    case 32:
      launch(std::integral_constant<int, 1>{});
      break;
    case 64:
      launch(std::integral_constant<int, 2>{});
      break;
    case 128:
      launch(std::integral_constant<int, 4>{});
      break;
    case 256:
      if constexpr (sizeof(T) == 2)
        launch(std::integral_constant<int, 8>{});
      else
        fail("[attention] no decode kernel for D 256 in f32");
      break;
    default:
      fail("[attention] no decode kernel for D {}", s.D);
  }
  combine_splits(p, stream);
}

std::atomic<int> g_decode_enabled{-1};  // -1: not read from the environment yet

}  // namespace

bool decode_attention_enabled() {
  return env_switch(g_decode_enabled, "KILN_CUDA_DECODE_ATTENTION");
}

void set_decode_attention_enabled(bool on) { g_decode_enabled.store(on ? 1 : 0); }

template <typename T>
void attention_forward(const AttentionPlan &plan, const AttentionShape &s, float scale, const T *q,
                       const T *k, const T *v, T *out, float *lse, float *scratch,
                       StreamHandle stream) {
  if (plan.path == AttentionPath::Generic) {
    launch_generic_fwd<T>(plan, s, scale, q, k, v, out, lse, scratch, stream);
    return;
  }
  if (plan.path == AttentionPath::Decode) {
    launch_decode_fwd<T>(plan, s, scale, q, k, v, out, lse, scratch, stream);
    return;
  }
  if constexpr (!std::is_same_v<T, bf16>) {
    fail("[attention] the tensor-core kernel takes bf16 only");
  } else {
    FlashFwdParams p{};
    p.q = reinterpret_cast<const __nv_bfloat16 *>(q);
    p.k = reinterpret_cast<const __nv_bfloat16 *>(k);
    p.v = reinterpret_cast<const __nv_bfloat16 *>(v);
    p.out = reinterpret_cast<__nv_bfloat16 *>(out);
    p.lse = lse;
    p.kv_bs = s.kv_batch_stride;
    p.Tq = static_cast<int>(s.Tq);
    p.Tk = static_cast<int>(s.Tk);
    p.Hq = static_cast<int>(s.Hq);
    p.Hkv = static_cast<int>(s.Hkv);
    p.G = static_cast<int>(s.Hq / s.Hkv);
    p.q_offset = static_cast<int>(s.q_offset);
    p.num_q_blocks = static_cast<int>(plan.grid[0]);
    p.scale_log2 = scale * kLog2e;
    if (s.D == 64 && plan.block_q == 64)
      launch_flash_fwd<64, 4>(plan, p, stream);
    else if (s.D == 64 && plan.block_q == 128)
      launch_flash_fwd<64, 8>(plan, p, stream);
    else if (s.D == 128 && plan.block_q == 64)
      launch_flash_fwd<128, 4>(plan, p, stream);
    else if (s.D == 128 && plan.block_q == 128)
      launch_flash_fwd<128, 8>(plan, p, stream);
    else
      fail("[attention] no flash kernel for D {} block {}", s.D, plan.block_q);
  }
}

template void attention_forward<float>(const AttentionPlan &, const AttentionShape &, float,
                                       const float *, const float *, const float *, float *,
                                       float *, float *, StreamHandle);
template void attention_forward<bf16>(const AttentionPlan &, const AttentionShape &, float,
                                      const bf16 *, const bf16 *, const bf16 *, bf16 *, float *,
                                      float *, StreamHandle);
template void attention_forward<f16>(const AttentionPlan &, const AttentionShape &, float,
                                     const f16 *, const f16 *, const f16 *, f16 *, float *, float *,
                                     StreamHandle);

}  // namespace kiln::cuda
