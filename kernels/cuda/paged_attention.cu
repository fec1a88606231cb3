// Causal attention over a paged KV cache (kernels/cuda/paged_attention.h).
//
// Warp w of the grid serves (row i, head h) = (w / Hq, w % Hq). Lane l holds dims l, l + 32, ...
// (up to kMaxDimsPerLane of them, so D <= 256). For each key j = 0..pos_i in order:
//   s = scale * (q . k_j)   (lane partial sums, then a butterfly reduction: every lane has s)
//   m' = max(m, s);  l = l e^(m - m') + e^(s - m');  acc = acc e^(m - m') + e^(s - m') v_j
// and out = acc / l at the end. The order is fixed by the row alone.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/paged_attention.h"

namespace kiln::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimsPerLane = 8;

template <typename T>
__global__ void paged_attention_kernel(std::int64_t N, std::int64_t Hq, std::int64_t Hkv,
                                       std::int64_t D, std::int64_t block_size,
                                       std::int64_t max_blocks, float scale, const T* q,
                                       const T* k_pool, const T* v_pool,
                                       const std::int32_t* block_tables,
                                       const std::int32_t* token_seq, const std::int32_t* token_pos,
                                       T* out) {
  const std::int64_t warp =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= N * Hq) return;
  const std::int64_t i = warp / Hq, h = warp % Hq, kvh = h / (Hq / Hkv);
  const std::int64_t pos = token_pos[i];
  const std::int32_t* table = block_tables + static_cast<std::int64_t>(token_seq[i]) * max_blocks;
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  for (int r = 0; r < kMaxDimsPerLane; ++r) {
    const std::int64_t d = lane + 32 * r;
    qr[r] = d < D ? load(q[(i * Hq + h) * D + d]) : 0.f;
    acc[r] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (std::int64_t j = 0; j <= pos; ++j) {
    const std::int64_t row =
        static_cast<std::int64_t>(table[j / block_size]) * block_size + j % block_size;
    const T* kj = k_pool + (row * Hkv + kvh) * D;
    const T* vj = v_pool + (row * Hkv + kvh) * D;
    float s = 0.f;
    for (int r = 0; r < kMaxDimsPerLane; ++r) {
      const std::int64_t d = lane + 32 * r;
      if (d < D) s += qr[r] * load(kj[d]);
    }
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    s *= scale;
    const float m_new = fmaxf(m, s);
    const float old_w = __expf(m - m_new), new_w = __expf(s - m_new);
    l = l * old_w + new_w;
    for (int r = 0; r < kMaxDimsPerLane; ++r) {
      const std::int64_t d = lane + 32 * r;
      acc[r] = acc[r] * old_w + (d < D ? new_w * load(vj[d]) : 0.f);
    }
    m = m_new;
  }
  for (int r = 0; r < kMaxDimsPerLane; ++r) {
    const std::int64_t d = lane + 32 * r;
    if (d < D) out[(i * Hq + h) * D + d] = store<T>(acc[r] / l);
  }
}

}  // namespace

template <typename T>
void paged_attention_forward(std::int64_t N, std::int64_t Hq, std::int64_t Hkv, std::int64_t D,
                             std::int64_t block_size, std::int64_t max_blocks, double scale,
                             const T* q, const T* k_pool, const T* v_pool,
                             const std::int32_t* block_tables, const std::int32_t* token_seq,
                             const std::int32_t* token_pos, T* out, StreamHandle stream) {
  KILN_CHECK(D > 0 && D <= 32 * kMaxDimsPerLane,
             "[paged_attention] head_dim {} is outside (0, {}] on CUDA", D, 32 * kMaxDimsPerLane);
  if (N == 0 || Hq == 0) return;
  const std::int64_t warps = N * Hq;
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  paged_attention_kernel<T><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
      N, Hq, Hkv, D, block_size, max_blocks, static_cast<float>(scale), q, k_pool, v_pool,
      block_tables, token_seq, token_pos, out);
  KILN_CUDA_CHECK_LAUNCH();
}

template void paged_attention_forward<float>(std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                             std::int64_t, std::int64_t, double, const float*,
                                             const float*, const float*, const std::int32_t*,
                                             const std::int32_t*, const std::int32_t*, float*,
                                             StreamHandle);
template void paged_attention_forward<bf16>(std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                            std::int64_t, std::int64_t, double, const bf16*,
                                            const bf16*, const bf16*, const std::int32_t*,
                                            const std::int32_t*, const std::int32_t*, bf16*,
                                            StreamHandle);

}  // namespace kiln::cuda
