// Quantized blocks (kernels/common/quant.h): every Q8_0 weight against a float64 decode of the
// block's bytes written from GGML's definition (w = d * q, d an IEEE half read bit by bit here).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/quant.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
KILN_OP_TESTED(Op::Dequantize);

namespace {

// An IEEE 754 half from its bits, in float64, without kiln's conversion.
double half_value(std::uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return sign ? -magnitude : magnitude;
}

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
      const double want = half_value(static_cast<std::uint16_t>(h)) * codes[j];
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

}  // namespace
}  // namespace kiln
