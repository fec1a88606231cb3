// kernels/cpu/quantize.h: Q8_0 byte for byte llama.cpp's quantize_row_q8_0_ref (the copy in
// tests/kernels/quant_ref.h); Q4_K and Q6_K read back through the llama.cpp-style reference
// dequantizers (quant_ref.h, not kiln's decoder): exactly for values the format holds exactly,
// and within the rounding error of their scales for Gaussian weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/quantize.h"
#include "quant_ref.h"

namespace kiln {
namespace {

using quant::QuantType;

std::vector<std::uint8_t> quantized(QuantType t, const std::vector<float>& x) {
  const auto& q = quant::quant_info(t);
  std::vector<std::uint8_t> out(x.size() / q.block_size * q.block_bytes);
  cpu::quantize_blocks(t, x.data(), static_cast<std::int64_t>(x.size()), out.data());
  return out;
}

std::vector<float> read_back(QuantType t, const std::vector<std::uint8_t>& b) {
  const auto& q = quant::quant_info(t);
  std::vector<float> out;
  for (std::size_t k = 0; k < b.size() / q.block_bytes; ++k) {
    const std::vector<float> w = t == QuantType::Q4_K ? test::ref_q4_k(b.data() + k * 144)
                                                      : test::ref_q6_k(b.data() + k * 210);
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

TEST(Quantize, Q8_0IsLlamaCppsBytes) {
  std::vector<float> x = gaussian(32 * 40, 3, 0.02f);
  for (int j = 0; j < 32; ++j) x[32 + j] = 0.0f;                               // an all-zero block
  for (int j = 0; j < 32; ++j) x[64 + j] = static_cast<float>(j - 16) * 0.5f;  // ties at .5
  x[100] = 1e-30f;
  EXPECT_EQ(quantized(QuantType::Q8_0, x), test::quantize_q8_0(x));
}

// Values d sc q - dmin m with d = dmin = 1 (the largest step and min codes 63), every code 0..15
// in every sub-block: the quantizer finds these scales and codes, so the values come back exactly.
TEST(Quantize, Q4_KRepresentableValuesComeBackExactly) {
  std::mt19937 rng(5);
  std::vector<float> x(512);
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 8; ++s) {
      const int sc = s == 3 ? 63 : 1 + static_cast<int>(rng() % 63);
      const int m = s == 5 ? 63 : static_cast<int>(rng() % 64);
      for (int l = 0; l < 32; ++l) {
        const int q = l < 16 ? l : static_cast<int>(rng() % 16);
        x[256 * b + 32 * s + l] = static_cast<float>(sc * q - m);
      }
    }
  EXPECT_EQ(read_back(QuantType::Q4_K, quantized(QuantType::Q4_K, x)), x);
}

// Values d sc (q - 32) with d = 1 (|sc| = 127 in one sub-block), each sub-block's largest
// magnitude at code -32: they come back exactly.
TEST(Quantize, Q6_KRepresentableValuesComeBackExactly) {
  std::mt19937 rng(6);
  std::vector<float> x(512);
  for (int b = 0; b < 2; ++b)
    for (int g = 0; g < 16; ++g) {
      int sc = g == 7 ? -127 : 1 + static_cast<int>(rng() % 127);
      if (g % 3 == 0 && g != 7) sc = -sc;
      for (int l = 0; l < 16; ++l) {
        const int q = l == 0 ? -32 : static_cast<int>(rng() % 64) - 32;
        x[256 * b + 16 * g + l] = static_cast<float>(sc * q);
      }
    }
  EXPECT_EQ(read_back(QuantType::Q6_K, quantized(QuantType::Q6_K, x)), x);
}

// Gaussian weights (sigma 0.02, as initialized models hold): rounding to a step of range / 15
// (Q4_K: a range of about 4 sigma over 32 values) leaves an RMS error of step / sqrt(12), about
// 0.08 sigma (0.078 seen with the range's grid alone, 0.070 with the least-squares search); Q6_K's step is max|x| / 32 over 16 values (about 1.8 sigma / 32),
// 0.016 sigma (0.019 seen: the 8-bit scale codes round each step too). The bounds allow about
// 30% over the prediction; a lower bound catches a quantizer that returned its input.
TEST(Quantize, KQuantErrorIsTheStepsRoundingError) {
  const float sigma = 0.02f;
  const std::vector<float> x = gaussian(256 * 64, 9, sigma);
  for (auto [t, bound] : {std::pair{QuantType::Q4_K, 0.10}, {QuantType::Q6_K, 0.025}}) {
    const std::vector<float> y = read_back(t, quantized(t, x));
    ASSERT_EQ(y.size(), x.size());
    double se = 0;
    for (std::size_t i = 0; i < x.size(); ++i) se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    const double rms = std::sqrt(se / static_cast<double>(x.size())) / sigma;
    EXPECT_LT(rms, bound) << quant::quant_info(t).name;
    EXPECT_GT(rms, bound / 20) << quant::quant_info(t).name << ": suspiciously exact";
  }
}

TEST(Quantize, RefusesPartialBlocksAndNonFiniteWeights) {
  std::vector<float> x(256, 1.0f);
  std::vector<std::uint8_t> out(256 * 2);
  auto message = [&](QuantType t, std::int64_t n) {
    try {
      cpu::quantize_blocks(t, x.data(), n, out.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message(QuantType::Q4_K, 128),
            "[quantize] 128 weights are not whole q4_k blocks of 256");
  x[7] = NAN;
  EXPECT_EQ(message(QuantType::Q8_0, 32),
            "[quantize] weight 7 is nan: q8_0 holds finite values only");
}

}  // namespace
}  // namespace kiln
