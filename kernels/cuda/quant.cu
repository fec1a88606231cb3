// Dequantization and the quantized GEMV (formats and math in kernels/common/quant.h; the
// kernels' shapes in quant.h). dequantize: thread i decodes weight i from its block's scales and
// its own bits; gemv_quant: a warp per weight row, decoding as dequantize does, or with aligned
// x a kernel per format that reads whole blocks or 64-weight chunks per lane in wide loads.
#include <atomic>

#include "kernels/cuda/activation.h"  // Pack
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void dequantize_kernel(quant::QuantType type, std::int64_t n, std::int64_t block_size,
                                  std::int64_t block_bytes, const std::uint8_t* blocks, T* out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = store<T>(quant::block_weight(type, blocks + (i / block_size) * block_bytes,
                                          static_cast<int>(i % block_size)));
}

// The weight row of this warp: blockIdx.x * warps + warp.
__device__ __forceinline__ std::int64_t warp_row() {
  return static_cast<std::int64_t>(blockIdx.x) * kQuantGemvWarpsPerBlock + threadIdx.x / 32;
}

// Row n of each of the M outputs: the fixed-order warp sum of acc[m], plus the bias.
template <typename T, int M>
__device__ __forceinline__ void store_rows(const float (&acc)[M], int lane, std::int64_t n,
                                           const T* bias, T* y, std::int64_t ldy) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float s = warp_sum(acc[m]);
    if (lane == 0) y[m * ldy + n] = store<T>(bias ? s + load(bias[n]) : s);
  }
}

// One warp per weight row n (blockIdx.x * warps + warp); acc[m] for the M rows of x.
template <typename T, int M>
__global__ void __launch_bounds__(32 * kQuantGemvWarpsPerBlock)
    gemv_quant_kernel(quant::QuantType type, std::int64_t N, std::int64_t K,
                      std::int64_t block_size, std::int64_t block_bytes, const T* x,
                      std::int64_t ldx, const std::uint8_t* w, const T* bias, T* y,
                      std::int64_t ldy) {
  const int lane = threadIdx.x % 32;
  const std::int64_t n = warp_row();
  if (n >= N) return;  // whole warps
  const std::int64_t nb = K / block_size;
  const std::uint8_t* row = w + n * nb * block_bytes;
  float acc[M] = {};
  // Block by block (no 64-bit division per weight); lane l takes weights l, l + 32, ... of each.
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = row + b * block_bytes;
    for (int j = lane; j < block_size; j += 32) {
      const float wk = quant::block_weight(type, blk, j);
      const std::int64_t k = b * block_size + j;
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] = fmaf(wk, load(x[m * ldx + k]), acc[m]);
    }
  }
  store_rows<T, M>(acc, lane, n, bias, y, ldy);
}

// Q8_0, one warp per weight row n, lane l on blocks l, l + 32, ...: acc[m] += d * sum_j q_j x_j
// over each block (the 32 products in order, then one multiply by d), a fixed-order warp sum.
// x rows 16-byte aligned (gemv_quant_kernel_for); blocks are 34 bytes, so 2-byte aligned.
template <typename T, int M>
__global__ void __launch_bounds__(32 * kQuantGemvWarpsPerBlock)
    gemv_q8_0_kernel(std::int64_t N, std::int64_t K, const T* x, std::int64_t ldx,
                     const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy) {
  constexpr int P = 16 / sizeof(T);  // x elements per 16-byte load
  const int lane = threadIdx.x % 32;
  const std::int64_t n = warp_row();
  if (n >= N) return;  // whole warps
  const std::int64_t nb = K / 32;
  const std::uint8_t* row = w + n * nb * 34;
  float acc[M] = {};
  for (std::int64_t b = lane; b < nb; b += 32) {
    const auto* bp = reinterpret_cast<const std::uint16_t*>(row + b * 34);
    f16 dh;
    dh.bits = bp[0];
    const float d = f16_to_float(dh);
    std::uint16_t qs[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) qs[i] = bp[1 + i];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const T* xr = x + m * ldx + b * 32;
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < 32 / P; ++c) {
        const Pack<T, P> xp = *reinterpret_cast<const Pack<T, P>*>(xr + c * P);
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const int j = c * P + e;
          const std::uint16_t pair = qs[j / 2];
          const auto q = static_cast<std::int8_t>(j % 2 ? pair >> 8 : pair & 0xFF);
          s = fmaf(static_cast<float>(q), load(xp.v[e]), s);
        }
      }
      acc[m] = fmaf(d, s, acc[m]);
    }
  }
  store_rows<T, M>(acc, lane, n, bias, y, ldy);
}

// Q4_K, one warp per weight row n; lane l on 64-weight chunks c = l, l + 32, ...: chunk c is
// superblock c / 4's sub-blocks 2j and 2j + 1 (j = c % 4), the low and high nibbles of the 32
// code bytes at 16 + 32j (two 16-byte loads: 144-byte blocks keep them on 16-byte boundaries
// when w is). Per sub-block, w_i = d sc q_i - dmin m, so its dot with x is
// d sc sum_i q_i x_i - dmin m sum_i x_i: two f32 sums, then the block's scale and min once.
template <typename T, int M>
__global__ void __launch_bounds__(32 * kQuantGemvWarpsPerBlock)
    gemv_q4_k_kernel(std::int64_t N, std::int64_t K, const T* x, std::int64_t ldx,
                     const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy) {
  constexpr int P = 16 / sizeof(T);  // x elements per 16-byte load
  const int lane = threadIdx.x % 32;
  const std::int64_t n = warp_row();
  if (n >= N) return;  // whole warps
  const std::int64_t chunks = K / 64;
  const std::uint8_t* row = w + n * (K / 256) * 144;
  float acc[M] = {};
  for (std::int64_t c = lane; c < chunks; c += 32) {
    const std::uint8_t* blk = row + (c / 4) * 144;
    const int j = static_cast<int>(c % 4);
    int sc_lo, m_lo, sc_hi, m_hi;
    quant::q4_k_scale_min(blk, 2 * j, sc_lo, m_lo);
    quant::q4_k_scale_min(blk, 2 * j + 1, sc_hi, m_hi);
    const float d = quant::f16_at(blk), dmin = quant::f16_at(blk + 2);
    const float d_lo = d * static_cast<float>(sc_lo), min_lo = dmin * static_cast<float>(m_lo);
    const float d_hi = d * static_cast<float>(sc_hi), min_hi = dmin * static_cast<float>(m_hi);
    const auto* qp = reinterpret_cast<const uint4*>(blk + 16 + 32 * j);
    const uint4 q0 = qp[0], q1 = qp[1];
    const std::uint32_t qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const T* xr = x + m * ldx + c * 64;  // x_lo: xr[0, 32); x_hi: xr[32, 64)
      float s_lo = 0.f, s_hi = 0.f, x_lo = 0.f, x_hi = 0.f;
#pragma unroll
      for (int g = 0; g < 32 / P; ++g) {
        const Pack<T, P> lo = *reinterpret_cast<const Pack<T, P>*>(xr + g * P);
        const Pack<T, P> hi = *reinterpret_cast<const Pack<T, P>*>(xr + 32 + g * P);
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const int t = g * P + e;  // code byte t
          const std::uint32_t byte = (qw[t / 4] >> (8 * (t % 4))) & 0xFF;
          const float xl = load(lo.v[e]), xh = load(hi.v[e]);
          s_lo = fmaf(static_cast<float>(byte & 0xF), xl, s_lo);
          s_hi = fmaf(static_cast<float>(byte >> 4), xh, s_hi);
          x_lo += xl;
          x_hi += xh;
        }
      }
      acc[m] += (d_lo * s_lo - min_lo * x_lo) + (d_hi * s_hi - min_hi * x_hi);
    }
  }
  store_rows<T, M>(acc, lane, n, bias, y, ldy);
}

// 16 bytes at p, 2-byte aligned (Q6_K's 210-byte blocks), as four 32-bit words: five aligned
// loads and a funnel shift. The fifth word lies inside the block for every range read below.
__device__ __forceinline__ void load16_align2(const std::uint8_t* p, std::uint32_t (&out)[4]) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const auto* w4 = reinterpret_cast<const std::uint32_t*>(addr & ~std::uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(addr & 3) * 8;  // 0 or 16
  std::uint32_t words[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) words[i] = w4[i];
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = __funnelshift_r(words[i], words[i + 1], shift);
}

// Q6_K, one warp per weight row n; lane l on 64-weight units c = l, l + 32, ...: unit c is
// superblock c / 4's half h = u / 2 and lanes l0 = 16 (u % 2) .. l0 + 15 of it (u = c % 4),
// which are 16 consecutive weights in each of the four 32-weight quarters r of the half:
// ql[64h + l0 + i] (r 0 low nibble, r 2 high), ql[64h + 32 + l0 + i] (r 1 low, r 3 high),
// qh[32h + l0 + i] (bits 2r, 2r + 1), scale scales[8h + u % 2 + 2r] for each r. Per r:
// d scale sum_i (q_i - 32) x_i, one f32 sum of q_i x_i and one of x_i.
template <typename T, int M>
__global__ void __launch_bounds__(32 * kQuantGemvWarpsPerBlock)
    gemv_q6_k_kernel(std::int64_t N, std::int64_t K, const T* x, std::int64_t ldx,
                     const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy) {
  constexpr int P = 16 / sizeof(T);
  const int lane = threadIdx.x % 32;
  const std::int64_t n = warp_row();
  if (n >= N) return;  // whole warps
  const std::int64_t units = K / 64;
  const std::uint8_t* row = w + n * (K / 256) * 210;
  float acc[M] = {};
  for (std::int64_t c = lane; c < units; c += 32) {
    const std::uint8_t* blk = row + (c / 4) * 210;
    const int u = static_cast<int>(c % 4), h = u / 2, l0 = 16 * (u % 2);
    std::uint32_t qa[4], qb[4], qh[4];
    load16_align2(blk + 64 * h + l0, qa);
    load16_align2(blk + 64 * h + 32 + l0, qb);
    load16_align2(blk + 128 + 32 * h + l0, qh);
    const float d = quant::f16_at(blk + 208);
    const auto* scales = reinterpret_cast<const std::int8_t*>(blk + 192 + 8 * h + u % 2);
    float dr[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) dr[r] = d * static_cast<float>(scales[2 * r]);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const T* xr = x + m * ldx + (c / 4) * 256 + 128 * h + l0;  // quarter r: xr[32r, 32r + 16)
      float s[4] = {0.f, 0.f, 0.f, 0.f}, xs[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
#pragma unroll
        for (int g = 0; g < 16 / P; ++g) {
          const Pack<T, P> xp = *reinterpret_cast<const Pack<T, P>*>(xr + 32 * r + g * P);
#pragma unroll
          for (int e = 0; e < P; ++e) {
            const int i = g * P + e;
            const std::uint32_t low_byte = ((r & 1 ? qb : qa)[i / 4] >> (8 * (i % 4))) & 0xFF;
            const std::uint32_t low = r >= 2 ? low_byte >> 4 : low_byte & 0xF;
            const std::uint32_t high = (qh[i / 4] >> (8 * (i % 4) + 2 * r)) & 3;
            const float xv = load(xp.v[e]);
            s[r] = fmaf(static_cast<float>(low | (high << 4)), xv, s[r]);
            xs[r] += xv;
          }
        }
      }
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < 4; ++r) sum += dr[r] * (s[r] - 32.f * xs[r]);
      acc[m] += sum;
    }
  }
  store_rows<T, M>(acc, lane, n, bias, y, ldy);
}

// ---- Q4_K GEMV with kQuantGemvRowsPerWarp rows per warp (gemv_quant_rows_enabled()) -----------
//
// gemv_q4_k_kernel spends more issue slots than bytes: every lane converts 64 values of x and
// sums them for each weight row (x is 3.5x a Q4_K row's bytes), and turns each code into a float
// with I2F, a quarter-rate instruction. Here a warp takes R = kQuantGemvRowsPerWarp rows: a lane
// loads and converts its chunk of x once per row of x and uses it for R weight rows, and a code q
// becomes a float in two full-rate integer ops, as the mantissa of 1 + q / 16:
// sum_i q_i x_i = 16 (sum_i (1 + q_i / 16) x_i - sum_i x_i), with sum_i x_i computed once per
// chunk. A row's arithmetic does not depend on M (batch invariance holds within the kernel).
// Measured on Qwen3-8B's decode weights (kiln_bench_gemv_cuda, H200, 2026-11-27): 1046 GB/s
// against 768 with one row per warp. The same scheme for Q6_K (6-bit codes as 1 + q / 64) ran
// at 1121 GB/s against its one-row kernel's 1307, so Q6_K keeps one row per warp.

// 1 + (bits [shift, shift + 4) of v) / 16: the nibble placed in the top 4 mantissa bits of 1.0f.
__device__ __forceinline__ float one_plus_nibble_16th(std::uint32_t v, int shift) {
  const std::uint32_t field = shift <= 19 ? v << (19 - shift) : v >> (shift - 19);
  return __uint_as_float(0x3F800000u | (field & 0x00780000u));
}

// quant::q4_k_scale_min on a block's first 16 bytes held in registers (bytes 4..15 are the 12
// packed scale bytes): the same unpacking, with shifts where a byte pointer into the registers
// would move them to local memory (s is not known at compile time).
__device__ __forceinline__ void q4_k_scale_min_regs(const uint4& head, int s, int& sc, int& m) {
  const auto scale_byte = [head](int i) -> int {  // by value: no address into the registers
    const std::uint32_t word = i < 4 ? head.y : (i < 8 ? head.z : head.w);
    return static_cast<int>((word >> (8 * (i % 4))) & 0xFFu);
  };
  quant::q4_k_unpack_scale_min(scale_byte, s, sc, m);
}

// Q4_K: lane l on 64-weight chunks c = l, l + 32, ... of rows n0 .. n0 + R - 1 (as
// gemv_q4_k_kernel: chunk c is superblock c / 4's sub-blocks 2j, 2j + 1, j = c % 4). A block's
// first 16 bytes (d, dmin, the 12 packed scale bytes) come in one 16-byte load.
template <typename T, int M>
__global__ void __launch_bounds__(32 * kQuantGemvWarpsPerBlock)
    gemv_q4_k_rows_kernel(std::int64_t N, std::int64_t K, const T* x, std::int64_t ldx,
                          const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy) {
  constexpr int R = kQuantGemvRowsPerWarp, P = 16 / sizeof(T);
  const int lane = threadIdx.x % 32;
  const std::int64_t n0 = warp_row() * R;
  if (n0 >= N) return;  // whole warps
  const std::int64_t chunks = K / 64, row_bytes = (K / 256) * 144;
  float acc[R][M] = {};
  for (std::int64_t c = lane; c < chunks; c += 32) {
    const int j = static_cast<int>(c % 4);
    uint4 head[R], q0[R], q1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (n0 + r < N) {
        const std::uint8_t* blk = w + (n0 + r) * row_bytes + (c / 4) * 144;
        head[r] = *reinterpret_cast<const uint4*>(blk);
        q0[r] = reinterpret_cast<const uint4*>(blk + 16 + 32 * j)[0];
        q1[r] = reinterpret_cast<const uint4*>(blk + 16 + 32 * j)[1];
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const T* xr = x + m * ldx + c * 64;  // x_lo: xr[0, 32); x_hi: xr[32, 64)
      float xv_lo[32], xv_hi[32], x_lo = 0.f, x_hi = 0.f;
#pragma unroll
      for (int g = 0; g < 32 / P; ++g) {
        const Pack<T, P> lo = *reinterpret_cast<const Pack<T, P>*>(xr + g * P);
        const Pack<T, P> hi = *reinterpret_cast<const Pack<T, P>*>(xr + 32 + g * P);
#pragma unroll
        for (int e = 0; e < P; ++e) {
          xv_lo[g * P + e] = load(lo.v[e]);
          xv_hi[g * P + e] = load(hi.v[e]);
          x_lo += xv_lo[g * P + e];
          x_hi += xv_hi[g * P + e];
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (n0 + r >= N) break;
        int sc_lo, m_lo, sc_hi, m_hi;
        q4_k_scale_min_regs(head[r], 2 * j, sc_lo, m_lo);
        q4_k_scale_min_regs(head[r], 2 * j + 1, sc_hi, m_hi);
        const float d = f16_bits_to_float(static_cast<std::uint16_t>(head[r].x & 0xFFFFu));
        const float dmin = f16_bits_to_float(static_cast<std::uint16_t>(head[r].x >> 16));
        const std::uint32_t qw[8] = {q0[r].x, q0[r].y, q0[r].z, q0[r].w,
                                     q1[r].x, q1[r].y, q1[r].z, q1[r].w};
        float s_lo = 0.f, s_hi = 0.f;  // sums of (1 + q / 16) x
#pragma unroll
        for (int t = 0; t < 32; ++t) {
          s_lo = fmaf(one_plus_nibble_16th(qw[t / 4], 8 * (t % 4)), xv_lo[t], s_lo);
          s_hi = fmaf(one_plus_nibble_16th(qw[t / 4], 8 * (t % 4) + 4), xv_hi[t], s_hi);
        }
        const float d_lo = d * static_cast<float>(sc_lo), min_lo = dmin * static_cast<float>(m_lo);
        const float d_hi = d * static_cast<float>(sc_hi), min_hi = dmin * static_cast<float>(m_hi);
        acc[r][m] += (d_lo * (16.f * (s_lo - x_lo)) - min_lo * x_lo) +
                     (d_hi * (16.f * (s_hi - x_hi)) - min_hi * x_hi);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (n0 + r < N) store_rows<T, M>(acc[r], lane, n0 + r, bias, y, ldy);
}

std::atomic<int> g_gemv_quant_rows{-1};  // -1: not read from the environment yet

template <typename T, int M>
void launch_gemv_quant(quant::QuantType type, std::int64_t N, std::int64_t K,
                       const quant::QuantInfo& q, const T* x, std::int64_t ldx,
                       const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy,
                       StreamHandle stream) {
  const std::int64_t blocks = (N + kQuantGemvWarpsPerBlock - 1) / kQuantGemvWarpsPerBlock;
  KILN_CHECK(blocks <= 0x7fffffffLL, "[linear_quant] {} weight rows exceed the grid", N);
  const unsigned grid = static_cast<unsigned>(blocks), threads = 32 * kQuantGemvWarpsPerBlock;
  const GemvQuantKernel kernel = gemv_quant_kernel_for(type, x, ldx, sizeof(T), w);
  if (kernel == GemvQuantKernel::Q4_K && gemv_quant_rows_enabled()) {
    const auto row_grid =
        static_cast<unsigned>((N + kQuantGemvWarpsPerBlock * kQuantGemvRowsPerWarp - 1) /
                              (kQuantGemvWarpsPerBlock * kQuantGemvRowsPerWarp));
    gemv_q4_k_rows_kernel<T, M><<<row_grid, threads, 0, stream>>>(N, K, x, ldx, w, bias, y, ldy);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (kernel) {
    case GemvQuantKernel::Q8_0:
      gemv_q8_0_kernel<T, M><<<grid, threads, 0, stream>>>(N, K, x, ldx, w, bias, y, ldy);
      KILN_CUDA_CHECK_LAUNCH();
      return;
    case GemvQuantKernel::Q4_K:
      gemv_q4_k_kernel<T, M><<<grid, threads, 0, stream>>>(N, K, x, ldx, w, bias, y, ldy);
      KILN_CUDA_CHECK_LAUNCH();
      return;
    case GemvQuantKernel::Q6_K:
      gemv_q6_k_kernel<T, M><<<grid, threads, 0, stream>>>(N, K, x, ldx, w, bias, y, ldy);
      KILN_CUDA_CHECK_LAUNCH();
      return;
    case GemvQuantKernel::General:
      break;
  }
  gemv_quant_kernel<T, M><<<grid, threads, 0, stream>>>(type, N, K, q.block_size, q.block_bytes, x,
                                                        ldx, w, bias, y, ldy);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemv_quant_rows_enabled() { return env_switch(g_gemv_quant_rows, "KILN_CUDA_QGEMV_ROWS"); }

void set_gemv_quant_rows_enabled(bool on) { g_gemv_quant_rows.store(on ? 1 : 0); }

template <typename T>
void gemv_quant(quant::QuantType type, std::int64_t M, std::int64_t N, std::int64_t K, const T* x,
                std::int64_t ldx, const std::uint8_t* w, const T* bias, T* y, std::int64_t ldy,
                StreamHandle stream) {
  const quant::QuantInfo& q = quant::quant_info(type);
  KILN_CHECK(M >= 1 && M <= kQuantGemvMaxRows && N >= 0 && K >= 0 && K % q.block_size == 0,
             "[linear_quant] the quantized GEMV takes 1 to {} rows of whole {} blocks, got {} x {}",
             kQuantGemvMaxRows, q.name, M, K);
  if (N == 0) return;
  with_rows<static_cast<int>(kQuantGemvMaxRows)>(static_cast<int>(M), [&](auto rows) {
    launch_gemv_quant<T, decltype(rows)::value>(type, N, K, q, x, ldx, w, bias, y, ldy, stream);
  });
}

template <typename T>
void dequantize(quant::QuantType type, std::int64_t n, const std::uint8_t* blocks, T* out,
                StreamHandle stream) {
  const quant::QuantInfo& q = quant::quant_info(type);
  KILN_CHECK(n >= 0 && n % q.block_size == 0,
             "[dequantize] {} weights are not whole {} blocks of {}", n, q.name, q.block_size);
  if (n == 0) return;
  dequantize_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(type, n, q.block_size,
                                                                       q.block_bytes, blocks, out);
  KILN_CUDA_CHECK_LAUNCH();
}

template void dequantize<float>(quant::QuantType, std::int64_t, const std::uint8_t*, float*,
                                StreamHandle);
template void dequantize<bf16>(quant::QuantType, std::int64_t, const std::uint8_t*, bf16*,
                               StreamHandle);
template void dequantize<f16>(quant::QuantType, std::int64_t, const std::uint8_t*, f16*,
                              StreamHandle);

#define KILN_INSTANTIATE_GEMV(T)                                                          \
  template void gemv_quant<T>(quant::QuantType, std::int64_t, std::int64_t, std::int64_t, \
                              const T*, std::int64_t, const std::uint8_t*, const T*, T*,  \
                              std::int64_t, StreamHandle);
KILN_INSTANTIATE_GEMV(float)
KILN_INSTANTIATE_GEMV(bf16)
KILN_INSTANTIATE_GEMV(f16)
#undef KILN_INSTANTIATE_GEMV

}  // namespace kiln::cuda
