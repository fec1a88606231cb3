// kiln's CUDA flash attention (kernels/cuda/attention*.{h,cu}, tensor/kernels_cuda_attention.cpp).
//
// CPU tests (run everywhere):
//  - plans: which kernel, tile sizes, grids, shared memory and scratch for training, prefill,
//    decode (split-K), odd head dims, misaligned pointers, and the errors for bad shapes;
//  - fragments: ldmatrix and mma.m16n8k16 are emulated from the PTX ISA's tables, and the lane
//    addresses of attention_tile.h must deliver exactly the fragment each mma expects, with
//    16-byte aligned, bank-conflict-free rows (swizzled and padded tiles);
//  - replays: the blocked loops of the flash forward and backward (key/query block bounds,
//    skipped masks, base-2 online softmax, lse) and the generic split-K forward, run on the CPU
//    with the same helper functions as the kernels, against kernels/cpu/attention. With P and dS
//    rounded to bf16 where the kernels round them, the replay also calibrates the bf16 tolerance
//    used on the GPU (printed).
// The GPU tests (CudaAttentionGpu.*) are in test_cuda_attention_gpu.cpp.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_tile.h"
#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/attention_shape.h"

namespace kiln {
namespace {

using cuda::AttentionPath;
using cuda::AttentionPlan;
using cuda::AttentionShape;

using test_attention::shape;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// ---- plans --------------------------------------------------------------------------------------

TEST(CudaAttentionPlan, TrainingForwardUsesFlashWith128RowBlocks) {
  // Qwen3-8B-like training step: B 4, T 1024, 32 query heads over 8 kv heads, D 128.
  const AttentionPlan p =
      cuda::plan_attention_forward(shape(4, 1024, 1024, 32, 8, 128), true, true, 132);
  EXPECT_EQ(p.path, AttentionPath::Flash);
  EXPECT_EQ(p.block_q, 128);
  EXPECT_EQ(p.block_k, 64);
  EXPECT_EQ(p.threads, 256);
  EXPECT_EQ(p.grid[0], 8);
  EXPECT_EQ(p.grid[1], 32);
  EXPECT_EQ(p.grid[2], 4);
  EXPECT_EQ(p.smem_bytes, 65536u);  // (128 + 2 x 64) rows x 128 x 2 bytes
  EXPECT_EQ(p.scratch_floats, 0);
}

TEST(CudaAttentionPlan, SmallForwardUses64RowBlocks) {
  // ceil(200 / 128) x 4 heads = 8 CTAs would leave most SMs idle: 64-row blocks.
  const AttentionPlan p =
      cuda::plan_attention_forward(shape(1, 200, 200, 4, 4, 64), true, true, 132);
  EXPECT_EQ(p.path, AttentionPath::Flash);
  EXPECT_EQ(p.block_q, 64);
  EXPECT_EQ(p.threads, 128);
  EXPECT_EQ(p.grid[0], 4);
  EXPECT_EQ(p.grid[1], 4);
  EXPECT_EQ(p.grid[2], 1);
  EXPECT_EQ(p.smem_bytes, 24576u);  // (64 + 128) x 64 x 2
  // Prefill of 17 tokens after a cache of 100 is still the tensor-core kernel.
  EXPECT_EQ(cuda::plan_attention_forward(shape(1, 17, 117, 4, 2, 128, 100), true, true, 132).path,
            AttentionPath::Flash);
}

TEST(CudaAttentionPlan, GenericForF32OddHeadDimsMisalignedAndDecode) {
  const AttentionShape s = shape(2, 64, 64, 4, 2, 64);
  EXPECT_EQ(cuda::plan_attention_forward(s, false, true, 132).path, AttentionPath::Generic);
  EXPECT_EQ(cuda::plan_attention_forward(s, true, false, 132).path, AttentionPath::Generic);
  EXPECT_EQ(cuda::plan_attention_forward(shape(2, 64, 64, 4, 2, 16), true, true, 132).path,
            AttentionPath::Generic);
  EXPECT_EQ(cuda::plan_attention_forward(shape(2, 64, 64, 4, 2, 96), true, true, 132).path,
            AttentionPath::Generic);
  const AttentionPlan g = cuda::plan_attention_forward(shape(2, 16, 16, 4, 2, 64), true, true, 132);
  EXPECT_EQ(g.path, AttentionPath::Generic);  // Tq <= kDecodeRows
  EXPECT_EQ(g.threads, 128);
  EXPECT_EQ(g.block_q, 8);
  EXPECT_EQ(g.splits, 1);  // 16 keys: nothing to split
  EXPECT_EQ(g.keys_per_split, 16);
  EXPECT_EQ(g.grid[0], 4);  // 16 queries x 2 heads per kv head = 32 items / 8
  EXPECT_EQ(g.grid[1], 2);
  EXPECT_EQ(g.grid[2], 2);
  EXPECT_EQ(g.smem_bytes, 4u * (2 * 8 * 64 + 2 * 32 * 65 + 2 * 4 * 32 + 2 * 32));
  EXPECT_EQ(g.scratch_floats, 0);
}

TEST(CudaAttentionPlan, DecodeSplitsTheKeys) {
  // One token against 4096 cached keys, 32 query heads on 8 kv heads: 32 CTAs without splitting.
  const AttentionShape s = shape(1, 1, 4096, 32, 8, 128, 4095, 8192 * 8 * 128);
  const AttentionPlan p = cuda::plan_attention_forward(s, true, true, 132);
  EXPECT_EQ(p.path, AttentionPath::Decode);
  EXPECT_EQ(p.threads, 128);
  // min(ceil(4 x 132 / 32) = 17, ceil(4096 / 16) = 256) = 17 splits of ceil(4096 / 17) = 241.
  EXPECT_EQ(p.splits, 17);
  EXPECT_EQ(p.keys_per_split, 241);
  EXPECT_GE(p.splits * p.keys_per_split, 4096);
  EXPECT_LT((p.splits - 1) * p.keys_per_split, 4096);  // the last split is not empty
  EXPECT_EQ(p.grid[0], 17);
  EXPECT_EQ(p.grid[1], 32);
  EXPECT_EQ(p.grid[2], 1);
  EXPECT_EQ(p.smem_bytes, 0u);
  EXPECT_EQ(p.scratch_floats, 17 * 32 * 130);
  // Uneven: 1000 keys, 4 heads: min(132, 63) = 63 splits of 16, recounted: 63 (62 x 16 < 1000).
  const AttentionPlan q =
      cuda::plan_attention_forward(shape(1, 1, 1000, 4, 4, 64, 999), false, true, 132);
  EXPECT_EQ(q.path, AttentionPath::Decode);
  EXPECT_EQ(q.splits, 63);
  EXPECT_EQ(q.keys_per_split, 16);
  EXPECT_EQ(q.scratch_floats, 63 * 4 * 66);
  // Short decode contexts (Qwen3-8B): 70 cached keys in 5 splits of 14, 16 keys in one.
  const AttentionPlan r =
      cuda::plan_attention_forward(shape(1, 1, 70, 32, 8, 128, 69), true, true, 132);
  EXPECT_EQ(r.splits, 5);
  EXPECT_EQ(r.keys_per_split, 14);
  const AttentionPlan one =
      cuda::plan_attention_forward(shape(1, 1, 16, 32, 8, 128, 15), true, true, 132);
  EXPECT_EQ(one.splits, 1);
  EXPECT_EQ(one.keys_per_split, 16);
  EXPECT_EQ(one.scratch_floats, 0);
  // A big batch fills the GPU without splitting.
  EXPECT_EQ(
      cuda::plan_attention_forward(shape(64, 1, 4096, 32, 8, 128, 4095), true, true, 132).splits,
      1);
  // Not the decode kernel: two query rows, odd or f32-256 head dims, misaligned rows, or off.
  EXPECT_EQ(cuda::plan_attention_forward(shape(1, 2, 70, 32, 8, 128, 68), true, true, 132).path,
            AttentionPath::Generic);
  EXPECT_EQ(cuda::plan_attention_forward(shape(1, 1, 70, 4, 2, 96, 69), true, true, 132).path,
            AttentionPath::Generic);
  EXPECT_EQ(cuda::plan_attention_forward(shape(1, 1, 70, 4, 2, 256, 69), false, true, 132).path,
            AttentionPath::Generic);
  EXPECT_EQ(cuda::plan_attention_forward(shape(1, 1, 70, 4, 2, 256, 69), true, true, 132).path,
            AttentionPath::Decode);
  EXPECT_EQ(cuda::plan_attention_forward(shape(1, 1, 70, 32, 8, 128, 69), true, false, 132).path,
            AttentionPath::Generic);
  const AttentionPlan g =
      cuda::plan_attention_forward(shape(1, 1, 4096, 32, 8, 128, 4095), true, true, 132, false);
  EXPECT_EQ(g.path, AttentionPath::Generic);
  // The generic kernel's own split rule (with the decode kernel off): min(ceil(264 / 8) = 33,
  // 4096 / 32 = 128) = 33 splits of ceil(4096 / 33) = 125 -> 128 keys (whole 32-key tiles),
  // recounted: 32 splits.
  EXPECT_EQ(g.splits, 32);
  EXPECT_EQ(g.keys_per_split, 128);
  EXPECT_EQ(g.grid[0], 32);
  EXPECT_EQ(g.grid[1], 8);
  EXPECT_EQ(g.scratch_floats, 32 * 32 * 130);
  EXPECT_EQ(
      cuda::plan_attention_forward(shape(1, 1, 67, 32, 8, 128, 66), true, true, 132, false).splits,
      2);
}

TEST(CudaAttentionPlan, Backward) {
  const AttentionPlan p =
      cuda::plan_attention_backward(shape(2, 1000, 1000, 16, 4, 128), true, true);
  EXPECT_EQ(p.path, AttentionPath::Flash);
  EXPECT_EQ(p.threads, 128);
  EXPECT_EQ(p.block_k, 64);
  EXPECT_EQ(p.block_q, 32);
  EXPECT_EQ(p.grid[0], 16);
  EXPECT_EQ(p.grid[1], 4);
  EXPECT_EQ(p.grid[2], 2);
  // K, V 32768 + Q, dO double-buffered 32768 + lse, Di 512 + dS^T 64 x 40 x 2 = 5120.
  EXPECT_EQ(p.smem_bytes, 71168u);
  EXPECT_EQ(p.scratch_floats, 2 * 16 * 1000 + 2 * 1000 * 16 * 128);
  const AttentionPlan p64 = cuda::plan_attention_backward(shape(1, 64, 64, 2, 2, 64), true, true);
  EXPECT_EQ(p64.block_q, 64);
  EXPECT_EQ(p64.smem_bytes, 16384u + 32768u + 1024u + 9216u);
  const AttentionPlan g = cuda::plan_attention_backward(shape(2, 70, 70, 4, 2, 16), true, true);
  EXPECT_EQ(g.path, AttentionPath::Generic);
  EXPECT_EQ(g.grid[0], 18);  // 70 queries x 2 heads / 8
  EXPECT_EQ(g.scratch_floats, 2 * 4 * 70);
  EXPECT_EQ(cuda::plan_attention_backward(shape(2, 70, 70, 4, 2, 64), false, true).path,
            AttentionPath::Generic);
}

// --attention auto's rule (host logic; the GPU test CudnnAttentionGpu.AutoTakesCudnnForTraining...
// checks that the entries follow it): cuDNN for training's shape with a head dim it takes, kiln's
// kernels for decode, prefill over a KV cache, and other head dims.
TEST(CudaAttentionPlan, AutoChoosesCudnnForTrainingShapesOnly) {
  using cuda::auto_attention_uses_cudnn;
  auto train = [](int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
    return cuda::training_attention_shape(B, T, Hq, Hkv, D);
  };
  EXPECT_TRUE(auto_attention_uses_cudnn(train(64, 256, 6, 6, 48)));   // stories15M
  EXPECT_TRUE(auto_attention_uses_cudnn(train(16, 1024, 8, 8, 64)));  // stories42M
  EXPECT_TRUE(auto_attention_uses_cudnn(train(1, 512, 32, 8, 128)));  // Qwen3-8B, no cache
  EXPECT_TRUE(auto_attention_uses_cudnn(train(1, 7, 4, 2, 256)));
  EXPECT_FALSE(auto_attention_uses_cudnn(train(2, 64, 4, 2, 20)));   // D not a multiple of 8
  EXPECT_FALSE(auto_attention_uses_cudnn(train(2, 64, 4, 2, 264)));  // D above 256
  EXPECT_FALSE(auto_attention_uses_cudnn(train(2, 64, 6, 4, 64)));   // Hq not a multiple of Hkv
  EXPECT_FALSE(auto_attention_uses_cudnn(train(0, 64, 4, 4, 64)));
  EXPECT_FALSE(auto_attention_uses_cudnn(train(8, 1 << 20, 32, 8, 128)));  // beyond 2^31 elements
  cuda::AttentionShape decode = train(1, 1, 32, 8, 128);
  decode.Tk = 41, decode.q_offset = 40, decode.kv_batch_stride = 4096 * 8 * 128;
  EXPECT_FALSE(auto_attention_uses_cudnn(decode));
  cuda::AttentionShape prefill_in_cache = train(1, 64, 32, 8, 128);
  prefill_in_cache.kv_batch_stride = 4096 * 8 * 128;  // the first prompt, into a KV cache
  EXPECT_FALSE(auto_attention_uses_cudnn(prefill_in_cache));
}

TEST(CudaAttentionPlan, Errors) {
  EXPECT_NE(error_of([] {
              cuda::plan_attention_forward(shape(1, 8, 8, 6, 4, 64), true, true, 132);
            }).find("[attention] 6 query heads not divisible by 4 kv heads"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              cuda::plan_attention_forward(shape(1, 8, 8, 4, 4, 64, 1), true, true, 132);
            }).find("need keys up to 9, have 8"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              cuda::plan_attention_forward(shape(1, 8, 8, 4, 4, 512), false, true, 132);
            }).find("head dim 512 is not supported on CUDA"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              cuda::plan_attention_forward(shape(70000, 8, 8, 4, 4, 64), true, true, 132);
            }).find("grid limits"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              cuda::plan_attention_forward(shape(2, 8, 8, 4, 4, 64, 0, 100), true, true, 132);
            }).find("kv batch stride 100 is smaller"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              cuda::plan_attention_backward(shape(1, 4, 8, 4, 4, 64, 4), true, true);
            }).find("[attention_backward] needs Tq == Tk"),
            std::string::npos);
}

// ---- fragment emulation -------------------------------------------------------------------------
// ldmatrix.x4 from the PTX ISA: matrix i's 8 row addresses come from lanes 8i..8i+7; lane l
// receives register i = (M_i[l/4][2(l%4)], M_i[l/4][2(l%4)+1]), or with .trans
// (M_i[2(l%4)][l/4], M_i[2(l%4)+1][l/4]). Elements are the 16-bit ids stored in `smem`.
using Frag = std::array<std::array<std::array<uint16_t, 2>, 4>, 32>;  // [lane][reg][half]

Frag emulate_ldsm_x4(const std::vector<uint8_t>& smem, const std::array<int, 32>& addr,
                     bool trans) {
  Frag f{};
  for (int i = 0; i < 4; ++i) {
    auto M = [&](int r, int c) {
      uint16_t x;
      std::memcpy(&x, &smem[static_cast<size_t>(addr[8 * i + r] + 2 * c)], 2);
      return x;
    };
    for (int l = 0; l < 32; ++l) {
      if (!trans)
        f[l][i] = {M(l / 4, 2 * (l % 4)), M(l / 4, 2 * (l % 4) + 1)};
      else
        f[l][i] = {M(2 * (l % 4), l / 4), M(2 * (l % 4) + 1, l / 4)};
    }
  }
  return f;
}

// Every row address 16-byte aligned; the 8 rows of each matrix in distinct 16-byte bank groups
// (one shared-memory wavefront, no conflicts).
void expect_aligned_conflict_free(const std::array<int, 32>& addr, const std::string& what) {
  for (int i = 0; i < 4; ++i) {
    std::set<int> groups;
    for (int r = 0; r < 8; ++r) {
      EXPECT_EQ(addr[8 * i + r] % 16, 0) << what;
      groups.insert((addr[8 * i + r] / 16) % 8);
    }
    EXPECT_EQ(groups.size(), 8u) << what << " matrix " << i << " has bank conflicts";
  }
}

uint16_t elem_id(int row, int col) { return static_cast<uint16_t>(row * 256 + col); }

// A swizzled rows x D tile holding elem_id(row, col).
std::vector<uint8_t> swizzled_tile(int rows, int D) {
  std::vector<uint8_t> t(static_cast<size_t>(rows * D * 2));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < D; ++c) {
      const uint16_t id = elem_id(r, c);
      std::memcpy(
          &t[static_cast<size_t>(cuda::attn::tile_byte_offset(r, c / 8, D / 8) + (c % 8) * 2)], &id,
          2);
    }
  return t;
}

TEST(CudaAttentionFragments, SwizzledOperandsMatchThePtxLayouts) {
  for (int D : {64, 128}) {
    const int rows = 64;
    const std::vector<uint8_t> tile = swizzled_tile(rows, D);
    for (int r0 = 0; r0 < rows; r0 += 16) {
      for (int c0 = 0; c0 < D / 8; c0 += 2) {
        const std::string where =
            "D " + std::to_string(D) + " r0 " + std::to_string(r0) + " c0 " + std::to_string(c0);
        std::array<int, 32> ax{}, ay{};
        for (int l = 0; l < 32; ++l) {
          const cuda::attn::RowChunk x = cuda::attn::ldsm_pattern_x(l, r0, c0);
          const cuda::attn::RowChunk y = cuda::attn::ldsm_pattern_y(l, r0, c0);
          ax[l] = cuda::attn::tile_byte_offset(x.row, x.chunk, D / 8);
          ay[l] = cuda::attn::tile_byte_offset(y.row, y.chunk, D / 8);
        }
        expect_aligned_conflict_free(ax, "pattern x " + where);
        expect_aligned_conflict_free(ay, "pattern y " + where);
        const Frag a = emulate_ldsm_x4(tile, ax, false);  // A from [m][k] (Q; K, V in bwd)
        const Frag bt = emulate_ldsm_x4(tile, ax, true);  // B from [k][n] (V; dO, Q, K in bwd)
        const Frag b = emulate_ldsm_x4(tile, ay, false);  // B from [n][k] (K; Q, dO in bwd)
        const int k0 = 8 * c0;
        for (int l = 0; l < 32; ++l) {
          const int g = l / 4, t = l % 4;
          for (int i = 0; i < 4; ++i)
            for (int e = 0; e < 2; ++e) {
              // A: a_i = (m g + 8 (i & 1), k 2t + e + 8 (i >> 1)), stored [m][k].
              EXPECT_EQ(a[l][i][e], elem_id(r0 + g + 8 * (i & 1), k0 + 2 * t + e + 8 * (i >> 1)))
                  << where << " lane " << l << " reg " << i;
              // B pairs: register i is b_(i & 1) of n-tile i >> 1: (k 2t + e + 8 (i & 1), n g).
              // From [n][k] (rows n = r0.., cols k = k0..):
              EXPECT_EQ(b[l][i][e], elem_id(r0 + 8 * (i >> 1) + g, k0 + 2 * t + e + 8 * (i & 1)))
                  << where << " lane " << l << " reg " << i;
              // From [k][n] with .trans (rows k = r0.., cols n = k0..):
              EXPECT_EQ(bt[l][i][e], elem_id(r0 + 2 * t + e + 8 * (i & 1), k0 + 8 * (i >> 1) + g))
                  << where << " lane " << l << " reg " << i;
            }
        }
      }
    }
  }
}

TEST(CudaAttentionFragments, PaddedDsTransposedAOperand) {
  // dS^T is stored [key][query] with rows of Bq + 8 bf16 (flash_bwd_kernel); dQ = dS K reads it
  // as the A operand (m = query, k = key) with pattern y and .trans.
  for (int bq : {32, 64}) {
    const int stride = bq + 8;
    std::vector<uint8_t> t(static_cast<size_t>(64 * stride * 2));
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < bq; ++c) {
        const uint16_t id = elem_id(r, c);
        std::memcpy(&t[static_cast<size_t>((r * stride + c) * 2)], &id, 2);
      }
    for (int k0 = 0; k0 < 64; k0 += 16)
      for (int mt = 0; mt < bq / 16; ++mt) {
        std::array<int, 32> ay{};
        for (int l = 0; l < 32; ++l) {
          const cuda::attn::RowChunk y = cuda::attn::ldsm_pattern_y(l, k0, mt * 2);
          ay[l] = y.row * stride * 2 + y.chunk * 16;
        }
        const std::string where = "bq " + std::to_string(bq) + " k0 " + std::to_string(k0);
        expect_aligned_conflict_free(ay, where);
        const Frag a = emulate_ldsm_x4(t, ay, true);
        for (int l = 0; l < 32; ++l)
          for (int i = 0; i < 4; ++i)
            for (int e = 0; e < 2; ++e) {
              const int m = mt * 16 + l / 4 + 8 * (i & 1);
              const int k = k0 + 2 * (l % 4) + e + 8 * (i >> 1);
              EXPECT_EQ(a[l][i][e], elem_id(k, m)) << where << " lane " << l << " reg " << i;
            }
      }
    // The accumulator stores of dS^T (4-byte words at (row g (+8), col 8 nt + 2t)) hit 32
    // different banks per instruction.
    for (int nt = 0; nt < bq / 8; ++nt) {
      std::set<int> banks;
      for (int l = 0; l < 32; ++l) {
        const int row = cuda::attn::acc_row(l, 0), col = nt * 8 + cuda::attn::acc_col(l, 0);
        banks.insert(((row * stride + col) * 2 / 4) % 32);
      }
      EXPECT_EQ(banks.size(), 32u) << "bq " << bq << " nt " << nt;
    }
  }
}

TEST(CudaAttentionFragments, AccumulatorsRepackAsAOperand) {
  // The kernels turn the S (or S^T) accumulators of n-tiles 2kk and 2kk + 1 into the A operand of
  // k-step kk: register i = (acc[2kk + (i >> 1)][2 (i & 1)], acc[..][2 (i & 1) + 1]). For that the
  // accumulator element must sit where a_i expects it: row g + 8 (i & 1), column 2t + e + 8 (i>>1).
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i)
      for (int e = 0; e < 2; ++e) {
        const int elem = 2 * (i & 1) + e;
        EXPECT_EQ(cuda::attn::acc_row(l, elem), l / 4 + 8 * (i & 1));
        EXPECT_EQ(8 * (i >> 1) + cuda::attn::acc_col(l, elem), 2 * (l % 4) + e + 8 * (i >> 1));
      }
  // And the output staging writes (row g (+8), chunk dt) of a swizzled tile are conflict-free.
  for (int D : {64, 128})
    for (int dt = 0; dt < D / 8; ++dt) {
      std::set<int> banks;
      for (int l = 0; l < 32; ++l) {
        const int off = cuda::attn::tile_byte_offset(cuda::attn::acc_row(l, 0), dt, D / 8) +
                        cuda::attn::acc_col(l, 0) * 2;
        banks.insert((off / 4) % 32);
      }
      EXPECT_EQ(banks.size(), 32u) << "D " << D << " dt " << dt;
    }
}

// ---- replays of the blocked algorithms ----------------------------------------------------------

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

struct Inputs {
  AttentionShape s;
  std::vector<float> q, k, v, dout;  // dense; k/v with batch stride s.kv_batch_stride
};

Inputs make_inputs(const AttentionShape& s, uint64_t seed, bool bf16_inputs) {
  Inputs in;
  in.s = s;
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(static_cast<size_t>(n));
    for (float& e : x) e = bf16_inputs ? round_bf16(dist(gen)) : dist(gen);
  };
  fill(in.q, s.B * s.Tq * s.Hq * s.D);
  fill(in.k, s.B * s.kv_batch_stride);
  fill(in.v, s.B * s.kv_batch_stride);
  fill(in.dout, s.B * s.Tq * s.Hq * s.D);
  return in;
}

// Normalized MSE sum((got - want)^2) / sum(want^2). The denominator is floored at an RMS of 1e-3:
// with T = 1 the exact dq and dk are 0 (one key: P = 1 and dP = Di), and both sides hold only
// rounding noise there.
double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return num / std::max(den, 1e-6 * double(want.size()));
}

constexpr float kLog2e = 1.4426950408889634f;

// The flash forward's loops on the CPU: query blocks of br rows, key blocks of 64, the same mask
// skipping, base-2 online softmax, lse; P rounded to bf16 before P V when round_p.
void replay_flash_forward(const Inputs& in, float scale, int br, bool round_p,
                          std::vector<float>& out, std::vector<float>& lse) {
  const AttentionShape& s = in.s;
  const int64_t G = s.Hq / s.Hkv, D = s.D, bc = 64;
  out.assign(static_cast<size_t>(s.B * s.Tq * s.Hq * D), 0.f);
  lse.assign(static_cast<size_t>(s.B * s.Hq * s.Tq), 0.f);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t q0 = 0; q0 < s.Tq; q0 += br) {
        const int64_t nkb = cuda::attn::fwd_key_blocks(q0, br, s.Tq, s.Tk, s.q_offset, bc);
        for (int64_t i = q0; i < std::min(q0 + br, s.Tq); ++i) {
          const int64_t pos = s.q_offset + i;
          ASSERT_LT(std::min(pos, s.Tk - 1), nkb * bc) << "a visible key is never visited";
          const float* qi = &in.q[static_cast<size_t>(((b * s.Tq + i) * s.Hq + h) * D)];
          float m = -INFINITY, l = 0;
          std::vector<float> o(static_cast<size_t>(D), 0.f);
          for (int64_t j = 0; j < nkb; ++j) {
            const int64_t k0 = j * bc;
            const bool mask = cuda::attn::fwd_block_needs_mask(q0, s.q_offset, k0, bc);
            std::vector<float> sc(static_cast<size_t>(bc));
            float mx = -INFINITY;
            for (int64_t c = 0; c < bc; ++c) {
              const int64_t key = k0 + c;
              if (!mask) ASSERT_LE(key, pos) << "an unmasked block holds an invisible key";
              float x = 0;  // zero-filled K rows past Tk score 0
              if (key < s.Tk) {
                const float* kj =
                    &in.k[static_cast<size_t>(b * s.kv_batch_stride + (key * s.Hkv + h / G) * D)];
                for (int64_t d = 0; d < D; ++d) x += qi[d] * kj[d];
              }
              x *= scale * kLog2e;
              if (mask && key > pos) x = -INFINITY;
              sc[static_cast<size_t>(c)] = x;
              mx = std::max(mx, x);
            }
            const cuda::attn::SoftmaxStep st = cuda::attn::online_softmax_step(m, mx);
            l *= st.rescale;
            for (float& e : o) e *= st.rescale;
            for (int64_t c = 0; c < bc; ++c) {
              const float p = exp2f(sc[static_cast<size_t>(c)] - st.base);
              l += p;
              const float pv = round_p ? round_bf16(p) : p;
              const int64_t key = k0 + c;
              if (pv == 0.f || key >= s.Tk) continue;
              const float* vj =
                  &in.v[static_cast<size_t>(b * s.kv_batch_stride + (key * s.Hkv + h / G) * D)];
              for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(d)] += pv * vj[d];
            }
          }
          for (int64_t d = 0; d < D; ++d)
            out[static_cast<size_t>(((b * s.Tq + i) * s.Hq + h) * D + d)] =
                o[static_cast<size_t>(d)] / l;
          lse[static_cast<size_t>((b * s.Hq + h) * s.Tq + i)] = cuda::attn::row_lse(m, l);
        }
      }
}

// The flash backward's loops: key blocks of 64 per (b, kv head), the group's heads, query blocks
// of bq from the diagonal, the same mask skipping; P and dS rounded to bf16 when round.
void replay_flash_backward(const Inputs& in, const std::vector<float>& out,
                           const std::vector<float>& lse, float scale, int bq, bool round,
                           std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) {
  const AttentionShape& s = in.s;
  const int64_t T = s.Tq, G = s.Hq / s.Hkv, D = s.D, bc = 64;
  dq.assign(in.q.size(), 0.f);
  dk.assign(static_cast<size_t>(s.B * T * s.Hkv * D), 0.f);
  dv.assign(dk.size(), 0.f);
  auto rnd = [&](float x) { return round ? round_bf16(x) : x; };
  std::vector<float> di(static_cast<size_t>(s.B * s.Hq * T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t h = 0; h < s.Hq; ++h) {
        float acc = 0;
        for (int64_t d = 0; d < D; ++d) {
          const size_t o = static_cast<size_t>(((b * T + i) * s.Hq + h) * D + d);
          acc += in.dout[o] * out[o];
        }
        di[static_cast<size_t>((b * s.Hq + h) * T + i)] = acc;
      }
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t hk = 0; hk < s.Hkv; ++hk)
      for (int64_t k0 = 0; k0 < T; k0 += bc) {
        const int64_t qb0 = cuda::attn::bwd_first_query_block(k0, bq);
        ASSERT_LE(qb0 * bq, k0) << "query blocks before the first one see no key of the block";
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = hk * G + g;
          for (int64_t q0 = qb0 * bq; q0 < T; q0 += bq) {
            const bool mask = cuda::attn::bwd_block_needs_mask(q0, bq, k0, bc, T);
            for (int64_t key = k0; key < k0 + bc; ++key)
              for (int64_t i = q0; i < q0 + bq; ++i) {
                if (!mask) ASSERT_TRUE(key <= i && i < T && key < T) << "mask skipped wrongly";
                if (key >= T || i >= T) {
                  // Zero-filled K row or Q row past T: the kernel's P must be masked to 0.
                  ASSERT_TRUE(mask) << "rows past T need the mask";
                  continue;
                }
                if (mask && key > i) continue;
                const float* qi = &in.q[static_cast<size_t>(((b * T + i) * s.Hq + h) * D)];
                const float* gi = &in.dout[static_cast<size_t>(((b * T + i) * s.Hq + h) * D)];
                const float* kj = &in.k[static_cast<size_t>(((b * T + key) * s.Hkv + hk) * D)];
                const float* vj = &in.v[static_cast<size_t>(((b * T + key) * s.Hkv + hk) * D)];
                float sc = 0, dp = 0;
                for (int64_t d = 0; d < D; ++d) {
                  sc += kj[d] * qi[d];
                  dp += vj[d] * gi[d];
                }
                const size_t li = static_cast<size_t>((b * s.Hq + h) * T + i);
                const float p = exp2f(sc * scale * kLog2e - lse[li] * kLog2e);
                const float ds = rnd(p * (dp - di[li]) * scale);
                const float pr = rnd(p);
                float* dki = &dk[static_cast<size_t>(((b * T + key) * s.Hkv + hk) * D)];
                float* dvi = &dv[static_cast<size_t>(((b * T + key) * s.Hkv + hk) * D)];
                float* dqi = &dq[static_cast<size_t>(((b * T + i) * s.Hq + h) * D)];
                for (int64_t d = 0; d < D; ++d) {
                  dvi[d] += pr * gi[d];
                  dki[d] += ds * qi[d];
                  dqi[d] += ds * kj[d];
                }
              }
          }
        }
      }
}

struct Reference {
  std::vector<float> out, lse, dq, dk, dv;
};

Reference cpu_reference(const Inputs& in, float scale, bool backward) {
  const AttentionShape& s = in.s;
  Reference r;
  r.out.resize(in.q.size());
  r.lse.resize(static_cast<size_t>(s.B * s.Hq * s.Tq));
  cpu::attention_forward<float>(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_offset, scale, in.q.data(),
                                in.k.data(), in.v.data(), s.kv_batch_stride, r.out.data(),
                                r.lse.data());
  if (backward) {
    r.dq.resize(in.q.size());
    r.dk.resize(in.k.size());
    r.dv.resize(in.v.size());
    cpu::attention_backward<float>(s.B, s.Tq, s.Hq, s.Hkv, s.D, scale, in.q.data(), in.k.data(),
                                   in.v.data(), r.out.data(), r.lse.data(), in.dout.data(),
                                   r.dq.data(), r.dk.data(), r.dv.data());
  }
  return r;
}

std::vector<float> rounded(std::vector<float> x) {
  for (float& e : x) e = round_bf16(e);
  return x;
}

// Worst bf16 normalized MSE over the replays (outputs rounded to bf16 as both backends do, P and
// dS rounded where the flash kernels round them), written down for the GPU thresholds below.
struct Worst {
  double out = 0, lse = 0, grads = 0;
};
Worst& bf16_worst() {
  static Worst w;
  return w;
}

TEST(CudaAttentionReplay, FlashForwardMatchesCpu) {
  struct C {
    int64_t B, Tq, Tk, Hq, Hkv, D, off;
  };
  for (const C c :
       {C{2, 17, 17, 4, 2, 64, 0}, C{1, 64, 64, 2, 1, 64, 0}, C{2, 200, 200, 4, 1, 64, 0},
        C{1, 130, 130, 2, 2, 128, 0}, C{2, 17, 117, 4, 2, 64, 100}, C{1, 40, 300, 8, 2, 128, 260},
        C{1, 1, 65, 2, 1, 64, 64}})
    for (int br : {64, 128}) {
      const std::string where = "Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) +
                                " D " + std::to_string(c.D) + " br " + std::to_string(br);
      const AttentionShape s = shape(c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, c.off,
                                     (c.Tk + 5) * c.Hkv * c.D);  // KV-cache batch stride
      const float scale = 1.f / std::sqrt(float(c.D));
      // f32: the replay is the same math in another order.
      const Inputs in = make_inputs(s, 11, false);
      const Reference ref = cpu_reference(in, scale, false);
      std::vector<float> out, lse;
      replay_flash_forward(in, scale, br, false, out, lse);
      EXPECT_LT(nmse(out, ref.out), 1e-10) << where;
      EXPECT_LT(nmse(lse, ref.lse), 1e-12) << where;
      // bf16: inputs rounded, P rounded for the P V product, outputs rounded.
      const Inputs inb = make_inputs(s, 12, true);
      const Reference refb = cpu_reference(inb, scale, false);
      replay_flash_forward(inb, scale, br, true, out, lse);
      const double e_out = nmse(rounded(out), rounded(refb.out)), e_lse = nmse(lse, refb.lse);
      EXPECT_LT(e_out, 1e-4) << where;
      bf16_worst().out = std::max(bf16_worst().out, e_out);
      bf16_worst().lse = std::max(bf16_worst().lse, e_lse);
    }
  std::printf("[replay] bf16 forward: worst nmse out %.3g lse %.3g\n", bf16_worst().out,
              bf16_worst().lse);
}

TEST(CudaAttentionReplay, FlashBackwardMatchesCpu) {
  struct C {
    int64_t B, T, Hq, Hkv, D;
  };
  for (const C c : {C{2, 17, 4, 2, 64}, C{1, 64, 2, 1, 64}, C{1, 200, 4, 1, 64},
                    C{2, 130, 2, 2, 128}, C{1, 1, 2, 2, 128}, C{1, 97, 8, 2, 128}}) {
    const int bq = c.D == 128 ? 32 : 64;
    const std::string where = "T " + std::to_string(c.T) + " D " + std::to_string(c.D);
    const AttentionShape s = shape(c.B, c.T, c.T, c.Hq, c.Hkv, c.D);
    const float scale = 1.f / std::sqrt(float(c.D));
    const Inputs in = make_inputs(s, 21, false);
    const Reference ref = cpu_reference(in, scale, true);
    std::vector<float> dq, dk, dv;
    replay_flash_backward(in, ref.out, ref.lse, scale, bq, false, dq, dk, dv);
    EXPECT_LT(nmse(dq, ref.dq), 1e-9) << where;
    EXPECT_LT(nmse(dk, ref.dk), 1e-9) << where;
    EXPECT_LT(nmse(dv, ref.dv), 1e-9) << where;
    const Inputs inb = make_inputs(s, 22, true);
    const Reference refb = cpu_reference(inb, scale, true);
    // The kernel's backward reads the bf16 out the forward stored.
    replay_flash_backward(inb, rounded(refb.out), refb.lse, scale, bq, true, dq, dk, dv);
    for (auto [got, want] : {std::pair{&dq, &refb.dq}, {&dk, &refb.dk}, {&dv, &refb.dv}}) {
      const double e = nmse(rounded(*got), rounded(*want));
      EXPECT_LT(e, 1e-3) << where;
      bf16_worst().grads = std::max(bf16_worst().grads, e);
    }
  }
  std::printf("[replay] bf16 backward: worst nmse of dq/dk/dv %.3g\n", bf16_worst().grads);
}

TEST(CudaAttentionReplay, GenericSplitKForwardMatchesCpu) {
  // The generic kernel's item blocks and key splits, as planned, cover exactly the keys each
  // item sees; per-split (o, m, l) partials merge to the CPU result.
  for (const AttentionShape s :
       {shape(1, 1, 4096, 8, 2, 32, 4095), shape(2, 3, 1000, 4, 4, 16, 997),
        shape(1, 5, 2000, 6, 2, 24, 1995)}) {
    // Tq == 1 goes to the decode kernel (test_cuda_attention_decode.cpp) unless it is off.
    const AttentionPlan p = cuda::plan_attention_forward(s, false, true, 132, false);
    ASSERT_EQ(p.path, AttentionPath::Generic);
    ASSERT_GT(p.splits, 1);
    const float scale = 0.3f;
    const Inputs in = make_inputs(s, 31, false);
    const Reference ref = cpu_reference(in, scale, false);
    const int64_t G = s.Hq / s.Hkv, D = s.D, items = s.Tq * G;
    std::vector<float> out(in.q.size()), lse(ref.lse.size());
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t hk = 0; hk < s.Hkv; ++hk)
        for (int64_t r0 = 0; r0 < items; r0 += cuda::kGenericItems) {
          const int64_t r1 = std::min<int64_t>(r0 + cuda::kGenericItems, items);
          const int64_t kend = cuda::attn::generic_key_end(r1, G, s.q_offset);
          ASSERT_LE(kend, s.Tk);
          ASSERT_GE(p.splits * p.keys_per_split, kend) << "keys left over after the last split";
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t i = r / G, h = hk * G + r % G, pos = s.q_offset + i;
            const float* qi = &in.q[static_cast<size_t>(((b * s.Tq + i) * s.Hq + h) * D)];
            std::vector<float> M, L;
            std::vector<std::vector<float>> O;
            for (int64_t sp = 0; sp < p.splits; ++sp) {
              const int64_t lo = sp * p.keys_per_split;
              const int64_t hi = std::min(kend, lo + p.keys_per_split);
              float m = -INFINITY, l = 0;
              std::vector<float> o(static_cast<size_t>(D), 0.f);
              for (int64_t key = lo; key < hi; ++key) {
                if (key > pos) continue;
                const size_t off =
                    static_cast<size_t>(b * s.kv_batch_stride + (key * s.Hkv + hk) * D);
                float x = 0;
                for (int64_t d = 0; d < D; ++d) x += qi[d] * in.k[off + d];
                x *= scale;
                const float mn = std::max(m, x), c = std::exp(m - mn), e = std::exp(x - mn);
                l = l * c + e;
                for (int64_t d = 0; d < D; ++d) o[d] = o[d] * c + e * in.v[off + d];
                m = mn;
              }
              M.push_back(m);
              L.push_back(l);
              O.push_back(o);
            }
            float mm = -INFINITY, ll = 0;
            for (float x : M) mm = std::max(mm, x);
            for (size_t j = 0; j < M.size(); ++j) ll += L[j] * std::exp(M[j] - mm);
            for (int64_t d = 0; d < D; ++d) {
              float acc = 0;
              for (size_t j = 0; j < M.size(); ++j) acc += O[j][d] * std::exp(M[j] - mm);
              out[static_cast<size_t>(((b * s.Tq + i) * s.Hq + h) * D + d)] = acc / ll;
            }
            lse[static_cast<size_t>((b * s.Hq + h) * s.Tq + i)] = mm + std::log(ll);
          }
        }
    EXPECT_LT(nmse(out, ref.out), 1e-10);
    EXPECT_LT(nmse(lse, ref.lse), 1e-12);
  }
}

}  // namespace
}  // namespace kiln
