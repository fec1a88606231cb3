// Quantized blocks (kernels/common/quant.h): every Q8_0 weight against a float64 decode of the
// block's bytes written from GGML's definition (w = d * q, d an IEEE half read bit by bit here),
// and every Q4_K and Q6_K weight against llama.cpp's row dequantizers as ggml writes them
// (tests/kernels/quant_ref.h), bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/common/quant.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/isa.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/quant_ref.h"

namespace kiln {
KILN_OP_TESTED(Op::Dequantize);

namespace {

TEST(Quant, Q8_0WeightIsScaleTimesCodeForEveryFiniteScale) {
  const quant::QuantInfo& q = quant::quant_info(quant::QuantType::Q8_0);
  EXPECT_EQ(q.name, "q8_0");
  EXPECT_EQ(q.block_size, 32);
  EXPECT_EQ(q.block_bytes, 2 + 32);
  // Every finite half scale (subnormals and both zeros included) with the extreme and small
  // codes; the product of an 11-bit and an 8-bit significand is exact in f32, so equality.
  const std::vector<std::int8_t> codes = {-128, -127, -1, 0, 1, 2, 63, 127};
  std::vector<std::uint8_t> block(34);
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 31) == 31) continue;  // inf and NaN scales
    block[0] = static_cast<std::uint8_t>(h & 0xff);
    block[1] = static_cast<std::uint8_t>(h >> 8);
    for (std::size_t j = 0; j < codes.size(); ++j)
      block[2 + j] = static_cast<std::uint8_t>(codes[j]);
    for (std::size_t j = 0; j < codes.size(); ++j) {
      const double want = test::half_bits_value(static_cast<std::uint16_t>(h)) * codes[j];
      ASSERT_EQ(static_cast<double>(quant::q8_0_weight(block.data(), static_cast<int>(j))), want)
          << "scale bits " << h << " code " << int(codes[j]);
    }
  }
}

TEST(Quant, Q8_0ReadsEachWeightFromItsOwnByte) {
  std::vector<std::uint8_t> block(34);
  block[0] = 0x00, block[1] = 0x3c;  // d = 1.0
  for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<std::uint8_t>(j * 7 - 100);
  for (int j = 0; j < 32; ++j)
    EXPECT_EQ(quant::q8_0_weight(block.data(), j), static_cast<float>(std::int8_t(j * 7 - 100)));
}

// Bit-for-bit equality of f32 values (both finite here).
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(Quant, Q4_KMatchesLlamaCppsRowDequantizerBitForBit) {
  const quant::QuantInfo& q = quant::quant_info(quant::QuantType::Q4_K);
  EXPECT_EQ(q.name, "q4_k");
  EXPECT_EQ(q.block_size, 256);
  EXPECT_EQ(q.block_bytes, 2 + 2 + 12 + 128);
  const int n = 64;
  const auto blocks = test::random_blocks(n, 144, {0, 2}, 11);
  for (int k = 0; k < n; ++k) {
    const std::uint8_t* b = blocks.data() + k * 144;
    const std::vector<float> want = test::ref_q4_k(b);
    for (int i = 0; i < 256; ++i)
      ASSERT_TRUE(same_bits(quant::q4_k_weight(b, i), want[i]))
          << "block " << k << " weight " << i << ": " << quant::q4_k_weight(b, i) << " vs "
          << want[i];
  }
}

TEST(Quant, Q6_KMatchesLlamaCppsRowDequantizerBitForBit) {
  const quant::QuantInfo& q = quant::quant_info(quant::QuantType::Q6_K);
  EXPECT_EQ(q.name, "q6_k");
  EXPECT_EQ(q.block_size, 256);
  EXPECT_EQ(q.block_bytes, 128 + 64 + 16 + 2);
  const int n = 64;
  const auto blocks = test::random_blocks(n, 210, {208}, 12);
  for (int k = 0; k < n; ++k) {
    const std::uint8_t* b = blocks.data() + k * 210;
    const std::vector<float> want = test::ref_q6_k(b);
    for (int i = 0; i < 256; ++i)
      ASSERT_TRUE(same_bits(quant::q6_k_weight(b, i), want[i]))
          << "block " << k << " weight " << i << ": " << quant::q6_k_weight(b, i) << " vs "
          << want[i];
  }
}

// block_weight dispatches each type to its decoder.
TEST(Quant, BlockWeightDispatchesByType) {
  const auto b = test::random_blocks(1, 210, {0, 2, 208}, 13);
  for (int i = 0; i < 32; ++i)
    EXPECT_TRUE(same_bits(quant::block_weight(quant::QuantType::Q8_0, b.data(), i),
                          quant::q8_0_weight(b.data(), i)));
  for (int i = 0; i < 256; i += 17) {
    EXPECT_TRUE(same_bits(quant::block_weight(quant::QuantType::Q4_K, b.data(), i),
                          quant::q4_k_weight(b.data(), i)));
    EXPECT_TRUE(same_bits(quant::block_weight(quant::QuantType::Q6_K, b.data(), i),
                          quant::q6_k_weight(b.data(), i)));
  }
}

// The bulk Q8_0 dequantizer (prefill) at every ISA level: q8_0_weight's bits, in f32 and bf16,
// for random blocks (every finite scale class: normal, subnormal, zero).
TEST(Quant, BulkQ8_0DequantizerIsTheWeightBitForBitAtEveryLevel) {
  const int n = 300;
  auto blocks = test::random_blocks(n, 34, {0}, 17);
  blocks[1] = 0x00, blocks[0] = 0x03;    // a subnormal scale
  blocks[35] = 0x00, blocks[34] = 0x00;  // zero
  for (cpu::CpuIsa level : test::supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    std::vector<float> f(32 * n);
    std::vector<bf16> h(32 * n);
    cpu::dequantize_q8_0(blocks.data(), n, f.data());
    cpu::dequantize_q8_0(blocks.data(), n, h.data());
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < 32; ++j) {
        const float w = quant::q8_0_weight(blocks.data() + 34 * k, j);
        ASSERT_TRUE(same_bits(f[32 * k + j], w))
            << cpu::cpu_isa_name(level) << " block " << k << " " << j;
        ASSERT_EQ(h[32 * k + j].bits, float_to_bf16(w).bits)
            << cpu::cpu_isa_name(level) << " block " << k;
      }
  }
}

}  // namespace
}  // namespace kiln
