// The nn family on CUDA (tensor/kernels_cuda_nn.cpp, kernels/cuda/{softmax,embedding,norm,rope,
// activation,dropout}) against the CPU ops, in f32 and bf16, on odd sizes and strided inputs;
// plus the host-side launch helpers, which are plain C++ and run everywhere.
//
// GPU comparisons: NaN/Inf agreement, normalized MSE and a max error relative to the largest
// reference value, per op and dtype; guard regions around raw launcher outputs catch writes out
// of bounds; the deterministic backward kernels (embedding, norms) are run twice and must agree
// bit for bit. Without a GPU these tests skip and say so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/softmax.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tests/tensor/norm_error_bound.h"

namespace kiln {
namespace {

// ---- host-side launch helpers (no GPU needed) --------------------------------------------------

TEST(CudaNnHost, PackElems) {
  EXPECT_EQ(cuda::pack_elems(4), 4);
  EXPECT_EQ(cuda::pack_elems(2), 8);
  EXPECT_EQ(cuda::pack_elems(1), 16);
  EXPECT_EQ(cuda::pack_elems(8), 2);
  EXPECT_EQ(cuda::pack_elems(0), 1);
  EXPECT_EQ(alignof(cuda::Pack<float, 4>), 16u);
  EXPECT_EQ(sizeof(cuda::Pack<bf16, 8>), 16u);
  EXPECT_EQ(alignof(cuda::Pack<bf16, 8>), 16u);
}

TEST(CudaNnHost, RowVecWidth) {
  alignas(16) static float buf[64];
  const void* a = buf;
  const void* off = buf + 1;  // 4-byte aligned only
  EXPECT_EQ(cuda::row_vec_width(4, 64, {a, a}, {64}), 4);
  EXPECT_EQ(cuda::row_vec_width(2, 64, {a}, {64}), 8);
  EXPECT_EQ(cuda::row_vec_width(4, 7, {a}, {7}), 1);             // cols not a multiple of the pack
  EXPECT_EQ(cuda::row_vec_width(4, 64, {a}, {66}), 1);           // row stride breaks alignment
  EXPECT_EQ(cuda::row_vec_width(4, 64, {off}, {64}), 1);         // base pointer unaligned
  EXPECT_EQ(cuda::row_vec_width(4, 64, {a, nullptr}, {64}), 4);  // null pointers are ignored
  EXPECT_EQ(cuda::row_vec_width(2, 4096, {a}, {4104}), 8);
  EXPECT_TRUE(cuda::aligned16({a, nullptr}));
  EXPECT_FALSE(cuda::aligned16({a, off}));
}

TEST(CudaNnHost, RowLaunch) {
  // Up to kWarpRowMax columns: a warp per row, 4 rows per 128-thread block.
  cuda::RowLaunch l = cuda::row_launch(7, 1024, 4);
  EXPECT_TRUE(l.warp_per_row);
  EXPECT_EQ(l.threads, 128);
  EXPECT_EQ(l.rows_per_block, 4);
  EXPECT_EQ(l.blocks, 2);
  l = cuda::row_launch(1, 1, 1);
  EXPECT_TRUE(l.warp_per_row);
  EXPECT_EQ(l.blocks, 1);
  // Wider rows: one block per row, one access per thread up to 1024 threads (128 at least).
  l = cuda::row_launch(5, 1025, 1);  // 1025 accesses -> 1024 threads
  EXPECT_FALSE(l.warp_per_row);
  EXPECT_EQ(l.threads, 1024);
  EXPECT_EQ(l.rows_per_block, 1);
  EXPECT_EQ(l.blocks, 5);
  EXPECT_EQ(cuda::row_launch(3, 1032, 8).threads, 256);   // 129 accesses
  EXPECT_EQ(cuda::row_launch(3, 1088, 16).threads, 128);  // 68 accesses: 128 at least
  EXPECT_EQ(cuda::row_launch(3, 4096, 8).threads, 512);   // 512 accesses
  EXPECT_EQ(cuda::row_launch(3, 4096, 4).threads, 1024);  // 1024 accesses
  EXPECT_EQ(cuda::row_launch(3, 4097, 1).threads, 1024);  // 4097 accesses
  EXPECT_EQ(cuda::row_launch(3, 151936, 4).threads, 1024);
  // The shape does not depend on the number of rows (a row's bits do not change with the batch).
  for (std::int64_t rows : {1, 2, 64, 65, 4096}) {
    EXPECT_EQ(cuda::row_launch(rows, 4096, 8).threads, 512) << rows;
    EXPECT_EQ(cuda::row_launch(rows, 4096, 8).rows_per_block, 1) << rows;
  }
  EXPECT_EQ(cuda::row_launch(0, 64, 1).blocks, 0);
}

TEST(CudaNnHost, NormChunksFollowTheCpuRule) {
  // count = ceil(rows / per), per = ceil(rows / min(rows, 1024)); every chunk non-empty.
  struct Case {
    std::int64_t rows, count, per;
  };
  for (const Case& c :
       {Case{0, 0, 1}, Case{1, 1, 1}, Case{7, 7, 1}, Case{1024, 1024, 1}, Case{1025, 513, 2},
        Case{2000, 1000, 2}, Case{4097, 820, 5}, Case{100000, 1021, 98}}) {
    const cuda::NormChunks ch = cuda::norm_chunks(c.rows);
    EXPECT_EQ(ch.count, c.count) << c.rows;
    EXPECT_EQ(ch.rows_per, c.per) << c.rows;
    if (c.rows > 0) {
      EXPECT_LE(ch.count, cuda::kNormMaxChunks);
      EXPECT_GE(ch.count * ch.rows_per, c.rows);
      EXPECT_LT((ch.count - 1) * ch.rows_per, c.rows);  // the last chunk is not empty
    }
  }
  EXPECT_EQ(cuda::norm_backward_scratch_floats(2000, 64, false), 1000 * 64);
  EXPECT_EQ(cuda::norm_backward_scratch_floats(2000, 64, true), 2 * 1000 * 64);
  EXPECT_EQ(cuda::qk_norm_rope_scratch_floats(2, 3, 5, 64), 30 * 64);
}

// The RMSNorm backward's register path: accesses per lane rounded up to 1, 2 or 4, else 0.
TEST(CudaNnHost, NormRegisterPacks) {
  EXPECT_EQ(cuda::norm_register_packs(1, 1), 1);
  EXPECT_EQ(cuda::norm_register_packs(64, 8), 1);   // bf16: 8 lanes busy
  EXPECT_EQ(cuda::norm_register_packs(288, 8), 2);  // stories15M: 36 accesses
  EXPECT_EQ(cuda::norm_register_packs(512, 8), 2);  // stories42M bf16
  EXPECT_EQ(cuda::norm_register_packs(512, 4), 4);  // stories42M f32
  EXPECT_EQ(cuda::norm_register_packs(768, 8), 4);  // 3 accesses, one pack idle
  EXPECT_EQ(cuda::norm_register_packs(1024, 8), 4);
  EXPECT_EQ(cuda::norm_register_packs(1024, 4), 0);  // 8 per lane
  EXPECT_EQ(cuda::norm_register_packs(129, 1), 0);   // 5 per lane
  EXPECT_EQ(cuda::norm_register_packs(2048, 8), 0);  // block mode
  EXPECT_EQ(cuda::norm_register_packs(64, 0), 0);
}

// rope_apply's packed path: V pairs per 16-byte access, only for dense, aligned rows.
TEST(CudaNnHost, RopeVecPairs) {
  using cuda::RopeStyle;
  alignas(16) static char buf[64];
  const void* a = buf;
  const void* off = buf + 2;
  const cuda::Strides4 dense{{7 * 4 * 64, 4 * 64, 64, 1}};       // (B, 7, 4, 64)
  const cuda::Strides4 qkv{{7 * 12 * 64, 12 * 64, 64, 1}};       // q of a fused (.., 12, 64)
  const cuda::Strides4 transposed{{4 * 7 * 64, 64, 7 * 64, 1}};  // (B, H, T, D) viewed as BTHD
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 2, 64, a, dense, a, dense), 4);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::RotateHalf, 2, 64, a, dense, a, dense), 8);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 4, 64, a, dense, a, dense), 2);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::RotateHalf, 4, 64, a, dense, a, dense), 4);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::RotateHalf, 2, 64, a, qkv, a, dense), 8);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 2, 64, a, transposed, a, dense), 4);
  // stories15M: D 48, 24 pairs: 4 (interleaved bf16) and 8 (rotate-half bf16) divide it.
  const cuda::Strides4 d48{{7 * 6 * 48, 6 * 48, 48, 1}};
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 2, 48, a, d48, a, d48), 4);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::RotateHalf, 2, 48, a, d48, a, d48), 8);
  // The scalar kernel: pairs that do not fill a pack, a strided D, a misaligned base or row.
  const cuda::Strides4 d4{{7 * 4 * 4, 4 * 4, 4, 1}};
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::RotateHalf, 2, 4, a, d4, a, d4), 0);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 2, 2, a, d4, a, d4), 0);
  const cuda::Strides4 strided_d{{7 * 4 * 128, 4 * 128, 128, 2}};
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 2, 64, a, strided_d, a, dense), 0);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 2, 64, off, dense, a, dense), 0);
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 2, 64, a, dense, off, dense), 0);
  const cuda::Strides4 odd_row{{7 * 4 * 66, 4 * 66, 66, 1}};  // rows 132 bytes apart
  EXPECT_EQ(cuda::rope_vec_pairs(RopeStyle::Interleaved, 2, 64, a, odd_row, a, dense), 0);
}

// rope_apply's grid: every pair of every token gets exactly one thread, blocks are whole warps of
// at most 256 threads, and a grid the device cannot take is refused by name.
TEST(CudaNnHost, RopeLaunchCoversEveryPairOnce) {
  struct C {
    std::int64_t B, T, H, D;
    int threads;
    std::int64_t blocks_y;
  };
  for (const C& c : {C{64, 256, 6, 48, 160, 1},   // stories15M: 144 pairs a token
                     C{16, 1024, 8, 64, 256, 1},  // stories42M: 256
                     C{1, 512, 32, 128, 256, 8},  // Qwen3-8B's q: 2048
                     C{1, 1, 1, 2, 32, 1}, C{3, 5, 7, 10, 64, 1}}) {
    const cuda::RopeLaunch l = cuda::rope_launch(c.B, c.T, c.H, c.D);
    EXPECT_EQ(l.tokens, c.B * c.T);
    EXPECT_EQ(l.pairs, c.H * c.D / 2);
    EXPECT_EQ(l.threads, c.threads) << c.H << "x" << c.D;
    EXPECT_EQ(l.blocks_y, c.blocks_y);
    EXPECT_EQ(l.threads % 32, 0);
    EXPECT_GE(l.blocks_y * l.threads, l.pairs);
    EXPECT_LT((l.blocks_y - 1) * l.threads, l.pairs);
  }
  EXPECT_EQ(cuda::rope_launch(0, 7, 2, 8).tokens, 0);
  EXPECT_THROW(cuda::rope_launch(1 << 16, 1 << 16, 1, 2), Error);  // 2^32 tokens
}

TEST(CudaNnHost, EmbeddingThreads) {
  EXPECT_EQ(cuda::embedding_threads(1, 1), 32);
  EXPECT_EQ(cuda::embedding_threads(288, 4), 96);  // 72 accesses -> 3 warps
  EXPECT_EQ(cuda::embedding_threads(4097, 1), 256);
  EXPECT_EQ(cuda::embedding_threads(4096, 8), 256);
  EXPECT_EQ(cuda::embedding_threads(64, 8), 32);
}

TEST(CudaNnHost, RopeInvFreqMatchesTheCpuTables) {
  // Row p = 1 of the CPU f32 tables is (cos, sin)(1.0f * inv_freq_i): the host-side inv_freq
  // the CUDA table kernel uses must be the CPU's to the bit.
  for (std::int64_t D : {2, 64, 128}) {
    for (double theta : {10000.0, 1000000.0}) {
      const std::int64_t half = D / 2;
      std::vector<float> c(2 * half), s(2 * half);
      cpu::rope_tables<float>(2, D, theta, c.data(), s.data());
      for (std::int64_t i = 0; i < half; ++i) {
        const float inv = cuda::rope_inv_freq(D, theta, i);
        EXPECT_EQ(std::cos(inv), c[half + i]) << D << " " << i;
        EXPECT_EQ(std::sin(inv), s[half + i]) << D << " " << i;
      }
    }
  }
  EXPECT_EQ(cuda::rope_inv_freq(64, 10000.0, 0), 1.0f);
}

// ---- GPU comparisons ----------------------------------------------------------------------------

#undef KILN_REQUIRE_GPU  // each file skips with its own message (unity batches share macros)
#define KILN_REQUIRE_GPU()       \
  if (cuda::device_count() == 0) \
  GTEST_SKIP() << "no CUDA device: the CPU-vs-CUDA comparison of the nn ops did not run"

const Device kCuda = Device::cuda(0);

Tensor randt(const Shape& shape, std::uint64_t seed, DType dtype, double lo = -2.0,
             double hi = 2.0) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(g);
  return ops::from_vector(v, shape, DType::F64).to(dtype);
}

struct Tol {
  double nmse, max_rel;  // normalized MSE, max |err| / max |ref|
};
Tol tol_for(DType dt) { return dt == DType::BF16 ? Tol{1e-4, 2e-2} : Tol{1e-10, 2e-5}; }

::testing::AssertionResult close(const Tensor& got_any, const Tensor& want_any, Tol tol) {
  const std::vector<double> got = got_any.to(Device::cpu()).to_double_vector();
  const std::vector<double> want = want_any.to(Device::cpu()).to_double_vector();
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isfinite(want[i]) != std::isfinite(got[i]) ||
        std::isnan(want[i]) != std::isnan(got[i]))
      return ::testing::AssertionFailure() << "index " << i << ": got " << got[i] << " want "
                                           << want[i] << " (non-finite mismatch)";
    if (!std::isfinite(want[i])) continue;
    const double e = got[i] - want[i];
    err2 += e * e;
    ref2 += want[i] * want[i];
    max_err = std::max(max_err, std::abs(e));
    max_ref = std::max(max_ref, std::abs(want[i]));
  }
  const double nmse = err2 / std::max(ref2, 1e-30);
  const double rel = max_err / std::max(max_ref, 1e-30);
  if (nmse > tol.nmse || rel > tol.max_rel)
    return ::testing::AssertionFailure()
           << "nmse " << nmse << " (tol " << tol.nmse << "), max err " << max_err << " / max ref "
           << max_ref << " = " << rel << " (tol " << tol.max_rel << ")";
  return ::testing::AssertionSuccess();
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.to(Device::cpu()).contiguous(), cb = b.to(Device::cpu()).contiguous();
  return ca.nbytes() == cb.nbytes() && std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

const std::vector<DType> kDtypes = {DType::F32, DType::BF16};
const std::vector<std::int64_t> kSizes = {1, 7, 64, 129, 4097};

TEST(CudaNn, SoftmaxAndLogSoftmax) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (std::int64_t rows : {1, 7, 129}) {
      for (std::int64_t cols : kSizes) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols));
        const Tensor x = randt({rows, cols}, 1 + rows * 7 + cols, dt, -6, 6);
        const Tensor dy = randt({rows, cols}, 2 + rows + cols, dt);
        const Tensor xc = x.to(kCuda), dyc = dy.to(kCuda);
        const Tensor y = ops::softmax(x), yc = ops::softmax(xc);
        EXPECT_TRUE(close(yc, y, tol_for(dt)));
        EXPECT_TRUE(
            close(ops::softmax_backward(yc, dyc), ops::softmax_backward(y, dy), tol_for(dt)));
        const Tensor ly = ops::log_softmax(x), lyc = ops::log_softmax(xc);
        EXPECT_TRUE(close(lyc, ly, tol_for(dt)));
        EXPECT_TRUE(close(ops::log_softmax_backward(lyc, dyc), ops::log_softmax_backward(ly, dy),
                          tol_for(dt)));
      }
    }
  }
}

TEST(CudaNn, SoftmaxStridedAndMaskedRows) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    // Row-strided view (narrow along the last dim; unaligned start) and a transposed view.
    const Tensor base = randt({9, 133}, 11, dt, -5, 5);
    const Tensor xs = base.narrow(1, 1, 129);
    EXPECT_TRUE(
        close(ops::softmax(base.to(kCuda).narrow(1, 1, 129)), ops::softmax(xs), tol_for(dt)));
    const Tensor xt = base.transpose(0, 1);  // (133, 9), fully strided
    EXPECT_TRUE(
        close(ops::log_softmax(base.to(kCuda).transpose(0, 1)), ops::log_softmax(xt), tol_for(dt)));
    // -inf entries (a causal mask) and a row that is -inf but for one entry.
    std::vector<double> v(3 * 40);
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 40; ++c) v[r * 40 + c] = c > r * 10 ? -INFINITY : 0.1 * c - r;
    const Tensor m = ops::from_vector(v, {3, 40}, DType::F64).to(dt);
    EXPECT_TRUE(close(ops::softmax(m.to(kCuda)), ops::softmax(m), tol_for(dt)));
    EXPECT_TRUE(close(ops::log_softmax(m.to(kCuda)), ops::log_softmax(m), tol_for(dt)));
  }
}

TEST(CudaNn, Embedding) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (std::int64_t dim : kSizes) {
      for (std::int64_t vocab : {1, 7, 129}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " vocab " + std::to_string(vocab) + " dim " +
                     std::to_string(dim));
        // 700 tokens with one id repeated 300 times (a run longer than a block) and random ids.
        std::mt19937 g(static_cast<unsigned>(vocab * 31 + dim));
        std::vector<std::int32_t> ids(700);
        for (std::size_t t = 0; t < ids.size(); ++t)
          ids[t] = t % 7 < 3 ? 0 : static_cast<std::int32_t>(g() % vocab);
        const Tensor idt = ops::from_vector(ids, {7, 100});
        const Tensor table = randt({vocab, dim}, 5, dt);
        EXPECT_TRUE(bit_equal(ops::embedding(idt.to(kCuda), table.to(kCuda)),
                              ops::embedding(idt, table)));  // a gather is exact
        // Backward into an f32 table (and into a bf16 one for bf16), compared with the CPU's
        // f32 accumulation from the same starting values.
        const Tensor dout = randt({7, 100, dim}, 6, dt);
        const Tensor start = randt({vocab, dim}, 7, dt);
        // clone(): for f32, to(F32) returns `start` itself, and the reference's in-place
        // backward would add into `start`, so the CUDA runs below started from start + dtable
        // and the comparison failed by one whole gradient (the first GPU run's "NMSE about 1",
        // f32 only, every vocab and dim; bf16 and f16, where to(F32) copies, passed).
        Tensor want = start.to(DType::F32).clone();
        const std::vector<double> start_values = start.to_double_vector();
        ops::embedding_backward_(want, idt, dout.to(DType::F32));
        ASSERT_EQ(start.to_double_vector(), start_values) << "the reference wrote into start";
        for (DType gdt : {DType::F32, dt}) {
          Tensor g1 = start.to(kCuda).to(gdt), g2 = start.to(kCuda).to(gdt);
          ops::embedding_backward_(g1, idt.to(kCuda), dout.to(kCuda));
          ops::embedding_backward_(g2, idt.to(kCuda), dout.to(kCuda));
          EXPECT_TRUE(close(g1, want, tol_for(gdt == DType::F32 ? dt : gdt)));
          EXPECT_TRUE(bit_equal(g1, g2)) << "embedding backward is not deterministic";
        }
      }
    }
  }
}

TEST(CudaNn, EmbeddingRejectsBadIdsAndLeavesOutputs) {
  KILN_REQUIRE_GPU();
  const Tensor table = randt({10, 16}, 1, DType::F32).to(kCuda);
  for (std::int32_t bad : {10, -1}) {
    const Tensor ids = ops::from_vector(std::vector<std::int32_t>{1, 2, bad, 3}, {4}).to(kCuda);
    try {
      (void)ops::embedding(ids, table);
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[embedding] token id " + std::to_string(bad) +
                                           " out of range [0, 10)"),
                std::string::npos)
          << e.what();
    }
    Tensor dtable = ops::zeros({10, 16}, DType::F32, kCuda);
    EXPECT_THROW(ops::embedding_backward_(dtable, ids, ops::ones({4, 16}, DType::F32, kCuda)),
                 Error);
    EXPECT_EQ(ops::sum_squares(dtable.to(Device::cpu())), 0.0)
        << "a rejected backward wrote into dtable";
  }
}

TEST(CudaNn, RmsNorm) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (std::int64_t rows : {1, 7, 129, 2000}) {
      for (std::int64_t dim : kSizes) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" +
                     std::to_string(dim));
        const Tensor x = randt({rows, dim}, 3 + rows + dim, dt);
        const Tensor w = randt({dim}, 4, dt, 0.5, 1.5);
        const Tensor dy = randt({rows, dim}, 5, dt);
        auto [y, rstd] = ops::rmsnorm(x, w, 1e-5);
        auto [yc, rstdc] = ops::rmsnorm(x.to(kCuda), w.to(kCuda), 1e-5);
        EXPECT_EQ(rstdc.dtype(), DType::F32);
        EXPECT_TRUE(close(yc, y, tol_for(dt)));
        EXPECT_TRUE(close(rstdc, rstd, tol_for(DType::F32)));  // f32 statistics either way
        const Tensor dw0 = randt({dim}, 6, DType::F32);
        Tensor dw = dw0.clone();
        const Tensor dx = ops::rmsnorm_backward(x, w, rstd, dy, &dw);
        // dx cancels at dim 1: compared within its error bound (norm_error_bound.h).
        const std::vector<double> dx_mag = test::rmsnorm_dx_magnitude(x, w, rstd, dy);
        for (DType wdt : {DType::F32, dt}) {
          Tensor dw1 = dw0.to(kCuda).to(wdt), dw2 = dw0.to(kCuda).to(wdt);
          const Tensor dxc =
              ops::rmsnorm_backward(x.to(kCuda), w.to(kCuda), rstdc, dy.to(kCuda), &dw1);
          (void)ops::rmsnorm_backward(x.to(kCuda), w.to(kCuda), rstdc, dy.to(kCuda), &dw2);
          EXPECT_TRUE(test::norm_dx_within_bound(dxc, dx, dx_mag, dt));
          EXPECT_TRUE(close(dw1, dw, tol_for(wdt == DType::F32 ? dt : wdt)));
          EXPECT_TRUE(bit_equal(dw1, dw2)) << "rmsnorm dw is not deterministic";
        }
        // No dw at all.
        EXPECT_TRUE(test::norm_dx_within_bound(
            ops::rmsnorm_backward(x.to(kCuda), w.to(kCuda), rstdc, dy.to(kCuda), nullptr), dx,
            dx_mag, dt));
      }
    }
  }
}

// The shapes of the register path (norm_register_packs 1, 2 and 4; 768 leaves a pack idle) and
// one past it, with chunks of one and of several rows.
TEST(CudaNn, RmsNormBackwardRegisterPath) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (std::int64_t rows : {3, 2500}) {
      for (std::int64_t dim : {32, 288, 512, 768, 1024}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" +
                     std::to_string(dim));
        const Tensor x = randt({rows, dim}, 30 + dim, dt);
        const Tensor w = randt({dim}, 31, dt, 0.5, 1.5);
        const Tensor dy = randt({rows, dim}, 32, dt);
        auto [y, rstd] = ops::rmsnorm(x, w, 1e-5);
        Tensor dw = ops::zeros({dim}, DType::F32);
        const Tensor dx = ops::rmsnorm_backward(x, w, rstd, dy, &dw);
        const std::vector<double> dx_mag = test::rmsnorm_dx_magnitude(x, w, rstd, dy);
        Tensor dw1 = ops::zeros({dim}, DType::F32, kCuda), dw2 = dw1.clone();
        const Tensor rstdc = rstd.to(kCuda);
        const Tensor dxc =
            ops::rmsnorm_backward(x.to(kCuda), w.to(kCuda), rstdc, dy.to(kCuda), &dw1);
        (void)ops::rmsnorm_backward(x.to(kCuda), w.to(kCuda), rstdc, dy.to(kCuda), &dw2);
        EXPECT_TRUE(test::norm_dx_within_bound(dxc, dx, dx_mag, dt));
        EXPECT_TRUE(close(dw1, dw, tol_for(dt)));
        EXPECT_TRUE(bit_equal(dw1, dw2)) << "rmsnorm dw is not deterministic";
      }
    }
  }
}

TEST(CudaNn, RmsNormStridedInput) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    // A row-strided view (row stride 72, read in place) and a transposed one (copied).
    const Tensor base = randt({3, 5, 72}, 8, dt), base_t = randt({64, 15}, 9, dt);
    const Tensor w = randt({64}, 10, dt, 0.5, 1.5);
    const std::vector<std::pair<Tensor, Tensor>> inputs = {
        {base.narrow(2, 4, 64), base.to(kCuda).narrow(2, 4, 64)},
        {base_t.transpose(0, 1), base_t.to(kCuda).transpose(0, 1)}};
    for (const auto& [in, inc] : inputs) {
      auto [y, rstd] = ops::rmsnorm(in, w, 1e-6);
      auto [yc, rstdc] = ops::rmsnorm(inc, w.to(kCuda), 1e-6);
      EXPECT_TRUE(close(yc, y, tol_for(dt)));
      const Tensor dy = randt(in.shape(), 12, dt);
      Tensor dw = ops::zeros({64}, DType::F32), dwc = ops::zeros({64}, DType::F32).to(kCuda);
      const Tensor dx = ops::rmsnorm_backward(in, w, rstd, dy, &dw);
      const Tensor dxc = ops::rmsnorm_backward(inc, w.to(kCuda), rstdc, dy.to(kCuda), &dwc);
      EXPECT_TRUE(close(dxc, dx, tol_for(dt)));
      EXPECT_TRUE(close(dwc, dw, tol_for(dt)));
    }
  }
}

TEST(CudaNn, LayerNorm) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (std::int64_t rows : {1, 7, 2000}) {
      for (std::int64_t dim : kSizes) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" +
                     std::to_string(dim));
        const Tensor x = randt({rows, dim}, 13 + rows + dim, dt, -1, 3);  // non-zero mean
        const Tensor w = randt({dim}, 14, dt, 0.5, 1.5), b = randt({dim}, 15, dt);
        const Tensor dy = randt({rows, dim}, 16, dt);
        auto [y, mean, rstd] = ops::layernorm(x, w, b, 1e-5);
        auto [yc, meanc, rstdc] = ops::layernorm(x.to(kCuda), w.to(kCuda), b.to(kCuda), 1e-5);
        EXPECT_TRUE(close(yc, y, tol_for(dt)));
        EXPECT_TRUE(close(meanc, mean, tol_for(dt)));
        EXPECT_TRUE(close(rstdc, rstd, tol_for(dt)));
        Tensor dw = ops::zeros({dim}, DType::F32), db = ops::zeros({dim}, DType::F32);
        const Tensor dx = ops::layernorm_backward(x, w, mean, rstd, dy, &dw, &db);
        Tensor dwc = ops::zeros({dim}, DType::F32, kCuda),
               dbc = ops::zeros({dim}, DType::F32, kCuda);
        const Tensor dxc = ops::layernorm_backward(x.to(kCuda), w.to(kCuda), meanc, rstdc,
                                                   dy.to(kCuda), &dwc, &dbc);
        // dx cancels at dim 1 (exactly 0 in exact arithmetic, rstd = 1/sqrt(eps)): compared
        // within its error bound (norm_error_bound.h).
        EXPECT_TRUE(test::norm_dx_within_bound(
            dxc, dx, test::layernorm_dx_magnitude(x, w, mean, rstd, dy), dt));
        EXPECT_TRUE(close(dwc, dw, tol_for(dt)));
        EXPECT_TRUE(close(dbc, db, tol_for(dt)));
      }
    }
  }
}

TEST(CudaNn, RopeTablesMatchTheCpu) {
  KILN_REQUIRE_GPU();
  for (std::int64_t D : {2, 64, 128}) {
    auto [c, s] = ops::rope_tables(4097, D, 1e6, DType::F32);
    auto [cc, sc] = ops::rope_tables(4097, D, 1e6, DType::BF16, kCuda);
    EXPECT_EQ(cc.dtype(), DType::F32);
    const std::vector<float> a = c.to_float_vector(), b = cc.to(Device::cpu()).to_float_vector();
    const std::vector<float> a2 = s.to_float_vector(), b2 = sc.to(Device::cpu()).to_float_vector();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], 1.2e-7) << "cos " << i;  // at most an ulp apart in [-1, 1]
      ASSERT_NEAR(a2[i], b2[i], 1.2e-7) << "sin " << i;
    }
  }
}

TEST(CudaNn, Rope) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (auto style : {ops::RopeStyle::Interleaved, ops::RopeStyle::RotateHalf}) {
      // D 48 (stories15M) and up take the packed kernel (rope_vec_pairs), D 2 the scalar one.
      for (std::int64_t D : {2, 48, 64, 128}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " D " + std::to_string(D) +
                     (style == ops::RopeStyle::Interleaved ? " interleaved" : " rotate-half"));
        auto [c, s] = ops::rope_tables(300, D, 10000.0, DType::F32);
        auto [cc, sc] = ops::rope_tables(300, D, 10000.0, DType::F32, kCuda);
        // (B, H, T, D) transposed to (B, T, H, D): strided input.
        const Tensor base = randt({2, 3, 129, D}, 17 + D, dt);
        const Tensor x = base.transpose(1, 2), xc = base.to(kCuda).transpose(1, 2);
        for (bool backward : {false, true}) {
          EXPECT_TRUE(close(ops::rope(xc, cc, sc, style, 7, backward),
                            ops::rope(x, c, s, style, 7, backward), tol_for(dt)));
        }
        // Contiguous input, offset 0, and forward then backward is the identity.
        const Tensor xd = randt({1, 7, 2, D}, 18, dt).to(kCuda);
        const Tensor back = ops::rope(ops::rope(xd, cc, sc, style, 0), cc, sc, style, 0, true);
        EXPECT_TRUE(close(back, xd, tol_for(dt)));
      }
    }
  }
}

TEST(CudaNn, Activations) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (std::int64_t n : kSizes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n));
      // Sliced from one offset so that n == 4097 also runs the unaligned (scalar) path.
      for (std::int64_t off : {0, 1}) {
        const Tensor big = randt({n + 1}, 19 + n, dt, -6, 6), big2 = randt({n + 1}, 20 + n, dt);
        const Tensor bigd = randt({n + 1}, 21 + n, dt);
        const Tensor x = big.narrow(0, off, n), u = big2.narrow(0, off, n),
                     dy = bigd.narrow(0, off, n);
        const Tensor xc = big.to(kCuda).narrow(0, off, n), uc = big2.to(kCuda).narrow(0, off, n);
        const Tensor dyc = bigd.to(kCuda).narrow(0, off, n);
        EXPECT_TRUE(close(ops::silu(xc), ops::silu(x), tol_for(dt)));
        EXPECT_TRUE(close(ops::silu_backward(xc, dyc), ops::silu_backward(x, dy), tol_for(dt)));
        EXPECT_TRUE(close(ops::gelu_tanh(xc), ops::gelu_tanh(x), tol_for(dt)));
        EXPECT_TRUE(
            close(ops::gelu_tanh_backward(xc, dyc), ops::gelu_tanh_backward(x, dy), tol_for(dt)));
        EXPECT_TRUE(close(ops::swiglu(xc, uc), ops::swiglu(x, u), tol_for(dt)));
        auto [dg, du] = ops::swiglu_backward(x, u, dy);
        auto [dgc, duc] = ops::swiglu_backward(xc, uc, dyc);
        EXPECT_TRUE(close(dgc, dg, tol_for(dt)));
        EXPECT_TRUE(close(duc, du, tol_for(dt)));
      }
    }
  }
}

TEST(CudaNn, DropoutMaskMatchesTheCpu) {
  KILN_REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (std::int64_t n : kSizes) {
      for (double p : {0.0, 0.1, 0.5}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n) + " p " +
                     std::to_string(p));
        const Tensor x = randt({n}, 22 + n, dt);
        Generator g1(1234, 77), g2(1234, 77);
        auto [y, mask] = ops::dropout(x, p, g1);
        auto [yc, maskc] = ops::dropout(x.to(kCuda), p, g2);
        EXPECT_TRUE(bit_equal(maskc, mask)) << "the Philox masks differ";
        EXPECT_TRUE(close(yc, y, tol_for(dt)));
        const Tensor dy = randt({n}, 23, dt);
        EXPECT_TRUE(close(ops::dropout_backward(dy.to(kCuda), maskc, p),
                          ops::dropout_backward(dy, mask, p), tol_for(dt)));
      }
    }
  }
}

TEST(CudaNn, F64FailsClearly) {
  KILN_REQUIRE_GPU();
  // Never filled: the op must fail before any kernel reads them.
  const Tensor x = Tensor::empty({4, 8}, DType::F64, kCuda);
  const Tensor w = Tensor::empty({8}, DType::F64, kCuda);
  try {
    (void)ops::rmsnorm(x, w, 1e-5);
    ADD_FAILURE() << "no error for f64";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              ops::detail::no_kernel_message("rmsnorm", DeviceType::CUDA, DType::F64));
  }
  EXPECT_THROW((void)ops::softmax(x), Error);
  EXPECT_THROW((void)ops::silu(x), Error);
}

#if defined(KILN_CUDA)

// ---- launchers with guard regions: nothing is written outside the output -----------------------

constexpr std::int64_t kGuard = 64;  // elements each side; keeps 16-byte alignment

// A CUDA buffer of n elements of T between two guard regions filled with the byte 0x5a.
template <typename T>
struct Guarded {
  Tensor t;  // (kGuard + n + kGuard) elements on the GPU
  std::int64_t n;
  explicit Guarded(std::int64_t n_) : n(n_) {
    Tensor h =
        Tensor::empty({(2 * kGuard + n) * static_cast<std::int64_t>(sizeof(T))}, DType::Bool);
    std::memset(h.raw_data(), 0x5a, h.nbytes());
    t = h.to(kCuda);
  }
  T* ptr() const {
    return reinterpret_cast<T*>(static_cast<char*>(t.raw_data()) + kGuard * sizeof(T));
  }
  bool guards_intact() const {
    const Tensor h = t.to(Device::cpu());
    const auto* b = static_cast<const unsigned char*>(h.raw_data());
    const std::size_t g = kGuard * sizeof(T), body = static_cast<std::size_t>(n) * sizeof(T);
    for (std::size_t i = 0; i < g; ++i)
      if (b[i] != 0x5a || b[g + body + i] != 0x5a) return false;
    return true;
  }
};

TEST(CudaNnKernels, OutputsStayInBounds) {
  KILN_REQUIRE_GPU();
  for (std::int64_t rows : {1, 7}) {
    for (std::int64_t cols : {1, 7, 64, 129, 4097}) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
      const Tensor x = randt({rows, cols}, 30, DType::F32).to(kCuda);
      const Tensor w = randt({cols}, 31, DType::F32).to(kCuda);
      Guarded<float> y(rows * cols), st(rows), part(cuda::norm_chunks(rows).count * cols);
      cuda::softmax_forward<float>(rows, cols, x.data<float>(), cols, false, y.ptr(), nullptr);
      EXPECT_TRUE(y.guards_intact()) << "softmax";
      cuda::rmsnorm_forward<float>(rows, cols, 1e-5f, x.data<float>(), cols, w.data<float>(),
                                   y.ptr(), st.ptr(), nullptr);
      EXPECT_TRUE(y.guards_intact() && st.guards_intact()) << "rmsnorm";
      cuda::rmsnorm_backward<float>(rows, cols, x.data<float>(), cols, w.data<float>(), st.ptr(),
                                    x.data<float>(), cols, y.ptr(), part.ptr(), nullptr);
      EXPECT_TRUE(y.guards_intact() && part.guards_intact()) << "rmsnorm_backward";
      Guarded<bf16> yb(rows * cols);
      const Tensor xb = x.to(DType::BF16);
      cuda::silu_forward<bf16>(rows * cols, xb.data<bf16>(), yb.ptr(), nullptr);
      EXPECT_TRUE(yb.guards_intact()) << "silu";
      Guarded<std::uint8_t> mask(rows * cols);
      cuda::dropout_forward<float>(rows * cols, 0.3f, 1, 2, x.data<float>(), y.ptr(), mask.ptr(),
                                   nullptr);
      EXPECT_TRUE(y.guards_intact() && mask.guards_intact()) << "dropout";
      const Tensor ids =
          ops::from_vector(std::vector<std::int32_t>(static_cast<std::size_t>(rows), 0), {rows})
              .to(kCuda);
      cuda::embedding_forward<float>(rows, 1, cols, ids.data<std::int32_t>(), w.data<float>(),
                                     y.ptr(), nullptr);
      EXPECT_TRUE(y.guards_intact()) << "embedding";
      cuda::device_synchronize();
    }
  }
}

// ---- fused QK-norm + RoPE against rmsnorm followed by rope (both on the GPU) -------------------

TEST(CudaNnKernels, QkNormRopeMatchesRmsNormThenRope) {
  KILN_REQUIRE_GPU();
  for (auto style : {ops::RopeStyle::Interleaved, ops::RopeStyle::RotateHalf}) {
    for (std::int64_t D : {2, 64, 128, 512}) {
      SCOPED_TRACE("D " + std::to_string(D));
      const std::int64_t B = 2, T = 33, H = 3, off = 5;
      auto [cos, sin] = ops::rope_tables(64, D, 1e6, DType::F32, kCuda);
      const Tensor base = randt({B, H, T, D}, 40 + D, DType::F32).to(kCuda);
      const Tensor x = base.transpose(1, 2);  // strided (B, T, H, D)
      const Tensor w = randt({D}, 41, DType::F32, 0.5, 1.5).to(kCuda);
      const Tensor dy = randt({B, T, H, D}, 42, DType::F32).to(kCuda);
      auto [n, rstd] = ops::rmsnorm(x, w, 1e-6);
      const Tensor want = ops::rope(n, cos, sin, style, off);
      const Tensor dn = ops::rope(dy, cos, sin, style, off, /*backward=*/true);
      Tensor dw_want = ops::zeros({D}, DType::F32, kCuda);
      const Tensor dx_want = ops::rmsnorm_backward(x, w, rstd, dn, &dw_want);

      const auto cs = style == ops::RopeStyle::Interleaved ? cuda::RopeStyle::Interleaved
                                                           : cuda::RopeStyle::RotateHalf;
      auto strides = [](const Tensor& t) {
        return cuda::Strides4{{t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
      };
      Tensor y = Tensor::empty({B, T, H, D}, DType::F32, kCuda);
      Tensor r = Tensor::empty({B * T * H}, DType::F32, kCuda);
      cuda::qk_norm_rope_forward<float>(cs, B, T, H, D, 1e-6f, cos.data<float>(), sin.data<float>(),
                                        off, x.data<float>(), strides(x), w.data<float>(),
                                        y.data<float>(), strides(y), r.data<float>(), nullptr);
      EXPECT_TRUE(close(y, want, tol_for(DType::F32)));
      EXPECT_TRUE(close(r, rstd, tol_for(DType::F32)));
      Tensor dx = Tensor::empty({B, T, H, D}, DType::F32, kCuda);
      Tensor dw = ops::zeros({D}, DType::F32, kCuda);
      Tensor part =
          Tensor::empty({cuda::qk_norm_rope_scratch_floats(B, T, H, D)}, DType::F32, kCuda);
      cuda::qk_norm_rope_backward<float, float>(
          cs, B, T, H, D, cos.data<float>(), sin.data<float>(), off, x.data<float>(), strides(x),
          w.data<float>(), r.data<float>(), dy.data<float>(), dx.data<float>(), part.data<float>(),
          dw.data<float>(), nullptr);
      EXPECT_TRUE(close(dx, dx_want, tol_for(DType::F32)));
      EXPECT_TRUE(close(dw, dw_want, tol_for(DType::F32)));
    }
  }
}

#endif  // KILN_CUDA

}  // namespace
}  // namespace kiln
