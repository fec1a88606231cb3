// ops::dequantize: GGML Q8_0 blocks made as llama.cpp's quantize_row_q8_0 makes them (d =
// max|x| / 127 stored as f16, q = round(x / d)) come back within the format's error bound, in
// every float dtype with one rounding; bad block counts and dtypes are refused by name; the meta
// device gives the same shapes; and a backend-ops case compares CUDA with the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/quant.h"
#include "kernels/cpu/gemv_quant.h"  // quant_gemv_max_rows
#include "kernels/cpu/isa.h"
#include "kernels/cuda/quant.h"  // gemv_quant_kernel_for
#include "kernels/cuda/runtime.h"
#include "tensor/memory.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tests/kernels/quant_ref.h"
#include "tests/tensor/backend_ops.h"

namespace kiln {
namespace {

using quant::QuantType;

// The Q8_0 blocks of x (x.size() a multiple of 32), as a Bool (byte) tensor on the CPU.
Tensor quantize_q8_0(const std::vector<float>& x) {
  const std::vector<std::uint8_t> bytes = test::quantize_q8_0(x);
  Tensor blocks = Tensor::empty({static_cast<std::int64_t>(bytes.size())}, DType::Bool);
  std::memcpy(blocks.data<std::uint8_t>(), bytes.data(), bytes.size());
  return blocks;
}

std::vector<float> weights(std::size_t n, std::uint64_t seed) {
  Generator g(seed);
  return ops::randn({static_cast<std::int64_t>(n)}, g, 0.0, 0.05).to_float_vector();
}

TEST(Dequantize, Q8_0RoundTripsWithinTheFormatsBound) {
  const std::vector<float> x = weights(4 * 32, 5);
  const Tensor w = ops::dequantize(quantize_q8_0(x), QuantType::Q8_0, {4, 32});
  ASSERT_EQ(w.shape(), Shape({4, 32}));
  ASSERT_EQ(w.dtype(), DType::F32);
  const std::vector<float> got = w.to_float_vector();
  // Per block, with d = max|x| / 127: rounding q costs d/2, and storing d in f16 (relative
  // error 2^-11) costs up to 127 * d * 2^-11 more, so |w - x| <= d (0.5 + 128 * 2^-11).
  for (std::size_t b = 0; b < 4; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const double bound = amax / 127.0 * (0.5 + 128.0 / 2048.0);
    for (int j = 0; j < 32; ++j)
      EXPECT_LE(std::fabs(double(got[b * 32 + j]) - x[b * 32 + j]), bound) << b << "," << j;
  }
}

TEST(Dequantize, EveryFloatDtypeIsTheExactWeightRoundedOnce) {
  const Tensor blocks = quantize_q8_0(weights(3 * 32, 9));
  const Tensor f32 = ops::dequantize(blocks, QuantType::Q8_0, {96});
  // The weights are exact in f32 (an f16 times an int8), so f64 is the same values and the
  // 16-bit dtypes are those values rounded once.
  EXPECT_EQ(ops::dequantize(blocks, QuantType::Q8_0, {96}, DType::F64).to_double_vector(),
            f32.to(DType::F64).to_double_vector());
  for (DType dt : {DType::BF16, DType::F16})
    EXPECT_EQ(ops::dequantize(blocks, QuantType::Q8_0, {96}, dt).to_float_vector(),
              f32.to(dt).to_float_vector())
        << dtype_name(dt);
  // Blocks of any shape with the right byte count.
  const Tensor rows = blocks.view({3, 34});
  EXPECT_EQ(ops::dequantize(rows, QuantType::Q8_0, {3, 32}).to_float_vector(),
            f32.to_float_vector());
}

TEST(Dequantize, RefusesBadBlocksByName) {
  const Tensor blocks = quantize_q8_0(weights(64, 3));
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] {
              ops::dequantize(blocks, QuantType::Q8_0, {3, 32});
            }),
            "[dequantize] 96 weights in q8_0 take 3 blocks of 34 bytes, got 68 bool elements");
  EXPECT_EQ(message([&] { ops::dequantize(blocks, QuantType::Q8_0, {65}); }),
            "[dequantize] 65 weights of shape (65,) are not whole q8_0 blocks of 32");
  EXPECT_EQ(message([&] { ops::dequantize(blocks, QuantType::Q8_0, {64}, DType::I32); }),
            "[dequantize] weights must be a float dtype, got i32");
  EXPECT_NE(message([&] {
              ops::dequantize(blocks.to(DType::I32), QuantType::Q8_0, {64});
            }).find("got 68 i32 elements"),
            std::string::npos);
}

TEST(Dequantize, MetaGivesTheSameShapesAsCpuAndCuda) {
  const Tensor blocks = quantize_q8_0(weights(64, 4)).to(Device::meta());
  for (DeviceType sim : {DeviceType::CPU, DeviceType::CUDA}) {
    MetaSimulatesScope scope(sim);
    const Tensor w = ops::dequantize(blocks, QuantType::Q8_0, {2, 32}, DType::BF16);
    EXPECT_TRUE(w.device().is_meta());
    EXPECT_EQ(w.shape(), Shape({2, 32}));
    EXPECT_EQ(w.dtype(), DType::BF16);
  }
}

// Random K-quant blocks (finite scales) as a Bool tensor.
Tensor kquant_blocks(QuantType t, int n, std::uint32_t seed) {
  const auto& q = quant::quant_info(t);
  const auto bytes = test::random_blocks(
      n, static_cast<int>(q.block_bytes),
      t == QuantType::Q4_K ? std::vector<int>{0, 2} : std::vector<int>{208}, seed);
  Tensor b = Tensor::empty({static_cast<std::int64_t>(bytes.size())}, DType::Bool);
  std::memcpy(b.data<std::uint8_t>(), bytes.data(), bytes.size());
  return b;
}

// Q4_K and Q6_K through the op: llama.cpp's values (tests/kernels/quant_ref.h) bit for bit in
// f32, each rounded once in bf16.
TEST(Dequantize, KQuantsAreLlamaCppsValues) {
  for (QuantType t : {QuantType::Q4_K, QuantType::Q6_K}) {
    const Tensor blocks = kquant_blocks(t, 3, 21 + static_cast<int>(t));
    const Tensor w = ops::dequantize(blocks, t, {3, 256});
    const std::vector<float> got = w.to_float_vector();
    const std::uint8_t* b = blocks.data<std::uint8_t>();
    const auto bb = quant::quant_info(t).block_bytes;
    for (int k = 0; k < 3; ++k) {
      const std::vector<float> want =
          t == QuantType::Q4_K ? test::ref_q4_k(b + k * bb) : test::ref_q6_k(b + k * bb);
      for (int i = 0; i < 256; ++i)
        ASSERT_EQ(got[k * 256 + i], want[i]) << quant::quant_info(t).name << " " << k << "," << i;
    }
    EXPECT_EQ(ops::dequantize(blocks, t, {3, 256}, DType::BF16).to_float_vector(),
              w.to(DType::BF16).to_float_vector());
    EXPECT_NE(
        [&] {
          try {
            ops::dequantize(blocks, t, {3, 128});
          } catch (const Error& e) {
            return std::string(e.what());
          }
          return std::string();
        }()
            .find("are not whole"),
        std::string::npos);
  }
}

// ---- linear_quant -----------------------------------------------------------------------------

// This CPU's level, then (when they differ) the scalar level, where no type runs on the tiles,
// quant_gemv_max_rows is kQuantGemvMaxRows and more rows take the dequantized slices.
std::vector<cpu::CpuIsa> slices_and_detected_levels() {
  const cpu::CpuIsa detected = cpu::cpu_isa_detected();
  if (detected == cpu::CpuIsa::Scalar) return {detected};
  return {detected, cpu::CpuIsa::Scalar};
}

// Decode rows (the int8 GEMV): within the x quantization's bound of ops::linear on the
// dequantized weight, |err| <= sum_i |w_i| max|x| / 254 per output (x moves by at most half a
// code, d_x / 2 = max|x| / 254), plus f32 rounding; the kernel's exact bound is
// tests/kernels/test_gemv_quant.cpp's. Prefill rows (dequantized slices through the float
// Linear): the same GEMM on the same weights, so f32 rounding only. Run at this CPU's level and
// at the scalar level, where the GEMV stops at kQuantGemvMaxRows rows and the slices take more.
TEST(LinearQuant, DecodeAndPrefillRowsAgreeWithLinearOnTheDequantizedWeight) {
  for (cpu::CpuIsa level : slices_and_detected_levels())
    for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
      cpu::ScopedCpuIsa cap(level);
      const auto& q = quant::quant_info(t);
      const std::int64_t N = 6, K = 2 * q.block_size;
      const Tensor blocks = t == QuantType::Q8_0 ? quantize_q8_0(weights(N * K, 7))
                                                 : kquant_blocks(t, N * 2, 33 + int(t));
      const Tensor w = ops::dequantize(blocks, t, {N, K});
      Generator g(9);
      const Tensor bias = ops::randn({N}, g);
      const std::int64_t kGemvRows = cpu::quant_gemv_max_rows(t);  // more take the slices
      const std::int64_t edge = cpu::kQuantGemvMaxRows;
      for (std::int64_t rows : {std::int64_t{1}, std::int64_t{3}, edge, edge + 4}) {
        const Tensor x = ops::randn({rows, K}, g);
        const std::vector<float> got = ops::linear_quant(x, blocks, t, N, bias).to_float_vector();
        const std::vector<float> want = ops::linear(x, w, bias).to_float_vector();
        const std::vector<float> xs = x.to_float_vector(), ws = w.to_float_vector();
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t n = 0; n < N; ++n) {
            double wabs = 0, xmax = 0, s = 0;
            for (std::int64_t k = 0; k < K; ++k) {
              wabs += std::fabs(ws[n * K + k]);
              xmax = std::max<double>(xmax, std::fabs(xs[r * K + k]));
              s += std::fabs(ws[n * K + k] * xs[r * K + k]);
            }
            const double tol = (rows <= kGemvRows ? wabs * xmax / 254.0 : 0.0) + 1e-5 * (s + 1);
            ASSERT_NEAR(got[r * N + n], want[r * N + n], tol)
                << q.name << " rows " << rows << " (" << r << ", " << n << ") level "
                << cpu::cpu_isa_name(level);
          }
      }
    }
}

// More W rows than one prefill slice holds (4 MiB of f32 weights: 4096 rows of 256): the slices
// land in their own columns, with their bias.
TEST(LinearQuant, PrefillSlicesCoverEveryColumn) {
  cpu::ScopedCpuIsa cap(slices_and_detected_levels().back());  // where the slices run
  const std::int64_t N = 4100, K = 256,
                     rows = cpu::quant_gemv_max_rows(QuantType::Q8_0) + 1;  // the slices' path
  const Tensor blocks = quantize_q8_0(weights(N * K, 11));
  const Tensor w = ops::dequantize(blocks, QuantType::Q8_0, {N, K});
  Generator g(12);
  const Tensor x = ops::randn({rows, K}, g), bias = ops::randn({N}, g);
  const std::vector<float> got =
      ops::linear_quant(x, blocks, QuantType::Q8_0, N, bias).to_float_vector();
  const std::vector<float> want = ops::linear(x, w, bias).to_float_vector();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << i;
}

TEST(LinearQuant, Bf16AndF16InputsKeepTheirDtype) {
  const Tensor blocks = quantize_q8_0(weights(4 * 64, 13));
  const Tensor w = ops::dequantize(blocks, QuantType::Q8_0, {4, 64});
  Generator g(14);
  const Tensor x = ops::randn({2, 3, 64}, g);
  const std::vector<float> want = ops::linear(x, w, Tensor()).to_float_vector();
  for (DType dt : {DType::BF16, DType::F16}) {
    const Tensor y = ops::linear_quant(x.to(dt), blocks, QuantType::Q8_0, 4);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(y.shape(), Shape({2, 3, 4}));
    const std::vector<float> got = y.to_float_vector();
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 0.05 * (std::fabs(want[i]) + 0.5)) << dtype_name(dt) << i;
  }
}

TEST(LinearQuant, RefusesBadShapesByName) {
  const Tensor blocks = quantize_q8_0(weights(4 * 64, 15));
  const Tensor x = ops::zeros({2, 64});
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message([&] { ops::linear_quant(x, blocks, QuantType::Q8_0, 3); }),
            "[linear_quant] a q8_0 weight of 3 x 64 takes 6 blocks of 34 bytes, got 272 bool "
            "elements");
  EXPECT_EQ(message([&] {
              ops::linear_quant(ops::zeros({2, 48}), blocks, QuantType::Q8_0, 4);
            }),
            "[linear_quant] a q8_0 weight of 4 x 48 is not rows of whole blocks of 32");
  EXPECT_EQ(message([&] { ops::linear_quant(x, blocks, QuantType::Q8_0, 4, ops::zeros({3})); }),
            "[linear_quant] bias (3,) does not match 4 outputs");
  EXPECT_EQ(message([&] { ops::linear_quant(x.to(DType::I32), blocks, QuantType::Q8_0, 4); }),
            "[linear_quant] input must be f32, bf16 or f16 with at least one dim, got i32 (2, 64)");
}

// The dry run: shapes, and the kernel's declared scratch, charged as Temporaries as the real CPU
// run allocates it (x's codes for decode; a dequantized slice for prefill). f32 prefill: the bf16
// GEMM's own oneDNN scratch inside a slice is not declared (the dry run misses it).
TEST(LinearQuant, MetaChargesWhatTheCpuRunAllocates) {
  MemoryTracker& tr = MemoryTracker::get(DeviceType::CPU);
  MemoryTracker& mt = MemoryTracker::get(DeviceType::Meta);
  const Tensor blocks = quantize_q8_0(weights(4 * 64, 16));
  const Tensor meta_blocks = blocks.to(Device::meta());
  constexpr auto kTemps = static_cast<std::size_t>(MemCategory::Temporaries);
  for (auto [rows, dt] :
       {std::pair{std::int64_t{1}, DType::BF16}, {std::int64_t{16}, DType::F32}}) {
    tr.reset_peaks();
    const std::int64_t cpu_before = tr.stats().current[kTemps];
    const Tensor y = ops::linear_quant(ops::zeros({rows, 64}, dt), blocks, QuantType::Q8_0, 4);
    const std::int64_t cpu_scratch = tr.stats().peak[kTemps] - cpu_before;
    MetaSimulatesScope scope(DeviceType::CPU);
    mt.reset_peaks();
    const std::int64_t meta_before = mt.stats().current[kTemps];
    const Tensor m = ops::linear_quant(ops::zeros({rows, 64}, dt, Device::meta()), meta_blocks,
                                       QuantType::Q8_0, 4);
    EXPECT_TRUE(m.device().is_meta());
    EXPECT_EQ(m.shape(), y.shape());
    EXPECT_EQ(m.dtype(), dt);
    EXPECT_GT(cpu_scratch, 0) << "rows " << rows;
    EXPECT_EQ(mt.stats().peak[kTemps] - meta_before, cpu_scratch) << "rows " << rows;
  }
  // CUDA: up to 8 rows its GEMV reads the blocks in place (no scratch); more dequantize W.
  MetaSimulatesScope scope(DeviceType::CUDA);
  for (std::int64_t rows : {1, 8, 9}) {
    const Tensor x = ops::zeros({rows, 64}, DType::BF16, Device::meta());
    mt.reset_peaks();
    const std::int64_t before = mt.stats().current[kTemps];
    const Tensor y = ops::linear_quant(x, meta_blocks, QuantType::Q8_0, 4);
    // The output (rows x 4 bf16, one 512-byte block of the CUDA allocator, charged to the
    // default category here), and above 8 rows W dequantized to bf16 (4 x 64 x 2: one block).
    EXPECT_EQ(mt.stats().peak[kTemps] - before, rows <= 8 ? 512 : 1024) << "rows " << rows;
  }
}

// Which CUDA GEMV kernel runs (host logic): each format's own for 16-byte aligned x rows and w
// aligned as that kernel loads it, the general one otherwise.
TEST(CudaQuantHost, GemvKernelFor) {
  using cuda::GemvQuantKernel;
  alignas(16) static char buf[64];
  const void* a = buf;
  const void* a2 = buf + 2;
  const void* a1 = buf + 1;
  EXPECT_EQ(cuda::gemv_quant_kernel_for(QuantType::Q8_0, a, 64, 2, a2), GemvQuantKernel::Q8_0);
  EXPECT_EQ(cuda::gemv_quant_kernel_for(QuantType::Q4_K, a, 256, 4, a), GemvQuantKernel::Q4_K);
  EXPECT_EQ(cuda::gemv_quant_kernel_for(QuantType::Q6_K, a, 256, 2, a2), GemvQuantKernel::Q6_K);
  // w off the kernel's alignment
  EXPECT_EQ(cuda::gemv_quant_kernel_for(QuantType::Q4_K, a, 256, 2, a2), GemvQuantKernel::General);
  EXPECT_EQ(cuda::gemv_quant_kernel_for(QuantType::Q6_K, a, 256, 2, a1), GemvQuantKernel::General);
  EXPECT_EQ(cuda::gemv_quant_kernel_for(QuantType::Q8_0, a, 64, 2, a1), GemvQuantKernel::General);
  // x's base or row pitch off 16 bytes
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
    EXPECT_EQ(cuda::gemv_quant_kernel_for(t, a2, 256, 2, a), GemvQuantKernel::General);
    EXPECT_EQ(cuda::gemv_quant_kernel_for(t, a, 260, 2, a), GemvQuantKernel::General);
    EXPECT_EQ(cuda::gemv_quant_kernel_for(t, a, 258, 4, a), GemvQuantKernel::General);
  }
}

// The CUDA GEMV (1 to 8 rows of x, the blocks read in place): each output within f32
// accumulation of the float64 product of x and the dequantized weights (plus one rounding to
// the output dtype), and every row bit-identical whether it runs alone or among the others.
TEST(CudaLinearQuant, GemvRowsMatchFloat64AndEachOther) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: the quantized GEMV not run";
  const Device gpu = Device::cuda(0);
  // 37 rows: a partial block of 4 warps. Q8_0's 40 blocks per row give lanes 0-7 two blocks each;
  // the K-quants' 18 blocks (72 chunks of 64) give lanes 0-7 three chunks, and 2 blocks leave
  // 24 lanes without one.
  struct Case {
    QuantType t;
    std::int64_t blocks_per_row;
  };
  // Everything runs twice: Q4_K with R rows per warp (the default) and with one
  // (KILN_CUDA_QGEMV_ROWS=0); the other formats' kernels do not change.
  struct RestoreRows {
    bool on = cuda::gemv_quant_rows_enabled();
    ~RestoreRows() { cuda::set_gemv_quant_rows_enabled(on); }
  } restore;
  for (bool rows_kernel : {true, false})
    for (Case c : {Case{QuantType::Q8_0, 40}, Case{QuantType::Q4_K, 2}, Case{QuantType::Q4_K, 18},
                   Case{QuantType::Q6_K, 2}, Case{QuantType::Q6_K, 18}})
      for (DType dt : {DType::F32, DType::BF16}) {
        cuda::set_gemv_quant_rows_enabled(rows_kernel);
        const QuantType t = c.t;
        const auto& q = quant::quant_info(t);
        const std::int64_t N = 37, K = c.blocks_per_row * q.block_size;
        const Tensor blocks =
            t == QuantType::Q8_0
                ? quantize_q8_0(weights(N * K, 51))
                : kquant_blocks(t, static_cast<int>(N * c.blocks_per_row), 52 + int(t));
        const std::vector<double> w = ops::dequantize(blocks, t, {N, K}).to_double_vector();
        Generator g(53);
        const Tensor x = ops::randn({8, K}, g).to(dt), bias = ops::randn({N}, g).to(dt);
        const std::vector<double> xs = x.to_double_vector(), bs = bias.to_double_vector();
        const Tensor bg = blocks.to(gpu), xg = x.to(gpu), biasg = bias.to(gpu);
        const double out_rel = dt == DType::BF16 ? 1.0 / 256 : 0.0;  // one rounding to bf16
        for (std::int64_t rows : {1, 3, 8}) {
          const std::vector<double> got = ops::linear_quant(xg.narrow(0, 0, rows), bg, t, N, biasg)
                                              .to(Device::cpu())
                                              .to_double_vector();
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::vector<double> alone = ops::linear_quant(xg.narrow(0, r, 1), bg, t, N, biasg)
                                                  .to(Device::cpu())
                                                  .to_double_vector();
            for (std::int64_t n = 0; n < N; ++n) {
              double want = bs[n], mag = std::fabs(bs[n]);
              for (std::int64_t k = 0; k < K; ++k) {
                want += w[n * K + k] * xs[r * K + k];
                mag += std::fabs(w[n * K + k] * xs[r * K + k]);
              }
              const double tol = K * std::ldexp(1.0, -23) * mag + out_rel * std::fabs(want) + 1e-30;
              ASSERT_NEAR(got[r * N + n], want, tol)
                  << q.name << " " << dtype_name(dt) << " rows " << rows << " (" << r << ", " << n
                  << ") rows per warp " << (rows_kernel ? "R" : "1");
              ASSERT_EQ(got[r * N + n], alone[n])
                  << q.name << " " << dtype_name(dt) << ": row " << r << " of " << rows
                  << " differs from the row alone at " << n;
            }
          }
        }
      }
}

// Rows of a quantized table: exactly ops::embedding's rows of the dequantized table, in the asked
// dtype; ids out of range refused by name; meta gives the shape.
TEST(EmbeddingQuant, RowsAreTheDequantizedTablesRows) {
  const std::int64_t vocab = 7, dim = 64;
  const Tensor blocks = quantize_q8_0(weights(vocab * dim, 51));
  const Tensor ids = ops::from_vector(std::vector<std::int32_t>{3, 0, 6, 3, 1, 5}, {2, 3});
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor table = ops::dequantize(blocks, QuantType::Q8_0, {vocab, dim}, dt);
    const Tensor got = ops::embedding_quant(ids, blocks, QuantType::Q8_0, vocab, dt);
    EXPECT_EQ(got.shape(), Shape({2, 3, dim}));
    EXPECT_EQ(got.dtype(), dt);
    EXPECT_EQ(got.to_float_vector(), ops::embedding(ids, table).to_float_vector());
  }
  try {
    ops::embedding_quant(ops::from_vector(std::vector<std::int32_t>{7}, {1}), blocks,
                         QuantType::Q8_0, vocab, DType::F32);
    ADD_FAILURE() << "id 7 of 7 was looked up";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[embedding_quant] token id 7 out of range [0, 7)");
  }
  const Tensor m = ops::embedding_quant(ids.to(Device::meta()), blocks.to(Device::meta()),
                                        QuantType::Q8_0, vocab, DType::BF16);
  EXPECT_TRUE(m.device().is_meta());
  EXPECT_EQ(m.shape(), Shape({2, 3, dim}));
}

// CUDA against the CPU from the same bytes: one rounding of an exact product on both, so the
// elementwise limit holds with room (the outputs are bit-identical).
[[maybe_unused]] const bool kBackendCase = backend_ops::register_case(
    {Op::Dequantize, "dequantize_q8_0", backend_ops::Tol::Elementwise,
     [](const backend_ops::Env& e) {
       const Tensor blocks = quantize_q8_0(weights(5 * 32, 6)).to(e.dev);
       return std::vector{ops::dequantize(blocks, QuantType::Q8_0, {5, 32}, e.dt)};
     }});
[[maybe_unused]] const bool kBackendCaseKQuants = backend_ops::register_case(
    {Op::Dequantize, "dequantize_q4_k_q6_k", backend_ops::Tol::Elementwise,
     [](const backend_ops::Env& e) {
       return std::vector{ops::dequantize(kquant_blocks(QuantType::Q4_K, 2, 31).to(e.dev),
                                          QuantType::Q4_K, {2, 256}, e.dt),
                          ops::dequantize(kquant_blocks(QuantType::Q6_K, 2, 32).to(e.dev),
                                          QuantType::Q6_K, {512}, e.dt)};
     }});
// Prefill rows (20): both backends multiply the dequantized weight by a float GEMM.
[[maybe_unused]] const bool kBackendCaseLinearQuant = backend_ops::register_case(
    {Op::Dequantize, "linear_quant_prefill", backend_ops::Tol::Matmul,
     [](const backend_ops::Env& e) {
       const Tensor x = e.in({20, 256}, 41), bias = e.in({3}, 42);
       return std::vector{ops::linear_quant(x, quantize_q8_0(weights(3 * 256, 43)).to(e.dev),
                                            QuantType::Q8_0, 3, bias),
                          ops::linear_quant(x, kquant_blocks(QuantType::Q4_K, 3, 44).to(e.dev),
                                            QuantType::Q4_K, 3, bias)};
     }});

}  // namespace
}  // namespace kiln
