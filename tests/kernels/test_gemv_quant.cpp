// Tests for kernels/cpu/gemv_quant.h: the x quantizers, each dot product at every ISA level
// this machine supports (ScopedCpuIsa), and the GEMV, against f64 references built from
// llama.cpp-style dequantizers (tests/kernels/quant_ref.h), not from the kernel's unpacking.
//
// Error analysis. With x quantized (xq_i = d_x q_i), the kernel's sums per block are exact
// integers (|sum| < 2^31), so its only errors are f32 roundings: the product of the two scales,
// the int32 -> f32 conversion, the f32 sums over blocks and lanes, and for Q4_K/Q6_K the
// subtraction of the min/offset term. Each is at most 2^-24 relative to the magnitude of what it
// rounds, so, per output,
//   |y - ref| <= (nb + 8) * 2^-24 * S,   S = sum_i (|a_i| + |b_i|) |xq_i|,
// where w_i = a_i - b_i splits each weight into its scaled code and its min (Q4_K: d sc q and
// dmin m) or offset (Q6_K: d sc q and 32 d sc). The reference's own f32 weights (one rounding of
// the Q4_K subtraction) are within 2^-24 |w_i|, inside the same bound. A y rounded to bf16 adds
// half an ulp, at most 2^-8 |ref| (8 significant bits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/gemv_quant.h"
#include "kernels/cpu/isa.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/quant_ref.h"

namespace kiln {
namespace {

using quant::QuantType;
using test::supported_levels;

std::vector<float> random_x(std::int64_t n, std::uint32_t seed, float scale = 1.0f) {
  std::vector<float> x(n);
  std::uint32_t s = seed * 747796405u + 2891336453u;
  for (auto& v : x) {
    s ^= s << 13, s ^= s >> 17, s ^= s << 5;
    v = scale * (static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f);
  }
  return x;
}

const quant::QuantInfo& info(QuantType t) { return quant::quant_info(t); }

// Random blocks of t with finite scales (quant_ref.h's random_blocks).
std::vector<std::uint8_t> blocks_of(QuantType t, std::int64_t n, std::uint32_t seed) {
  switch (t) {
    case QuantType::Q8_0:
      return test::random_blocks(static_cast<int>(n), 34, {0}, seed);
    case QuantType::Q4_K:
      return test::random_blocks(static_cast<int>(n), 144, {0, 2}, seed);
    case QuantType::Q6_K:
      break;
  }
  return test::random_blocks(static_cast<int>(n), 210, {208}, seed);
}

// The weights of one block split as w = a - b (see the header), from the reference dequantizer.
void split_weights(QuantType t, const std::uint8_t* blk, std::vector<float>& a,
                   std::vector<float>& b) {
  const int bs = static_cast<int>(info(t).block_size);
  a.assign(bs, 0.0f);
  b.assign(bs, 0.0f);
  if (t == QuantType::Q8_0) {
    for (int j = 0; j < 32; ++j)
      a[j] = test::half_at(blk) * static_cast<float>(static_cast<std::int8_t>(blk[2 + j]));
    return;
  }
  std::vector<std::uint8_t> c(blk, blk + info(t).block_bytes);
  if (t == QuantType::Q4_K) {
    c[2] = c[3] = 0;  // dmin = 0: w = d sc q
    a = test::ref_q4_k(c.data());
    std::copy(blk, blk + 144, c.begin());
    c[0] = c[1] = 0;  // d = 0: w = -dmin m
    b = test::ref_q4_k(c.data());
    for (float& v : b) v = -v;
    return;
  }
  std::fill(c.begin(), c.begin() + 192, 0);  // every code 0: w = -32 d sc
  b = test::ref_q6_k(c.data());
  for (float& v : b) v = -v;
  const std::vector<float> w = test::ref_q6_k(blk);
  // w and b are each d sc times a code, rounded once in f32: a is within 2^-23 of d sc q.
  for (int j = 0; j < 256; ++j) a[j] = w[j] + b[j];
}

// The f64 reference of one W row times one quantized x row, and its error scale S.
struct Ref {
  double value = 0, scale = 0;
};

// xq: the dequantized quantized x row.
Ref reference_dot(QuantType t, const std::uint8_t* wrow, std::int64_t K,
                  const std::vector<double>& xq) {
  Ref r;
  const std::int64_t bs = info(t).block_size;
  std::vector<float> a, b;
  for (std::int64_t blk = 0; blk < K / bs; ++blk) {
    split_weights(t, wrow + blk * info(t).block_bytes, a, b);
    for (std::int64_t j = 0; j < bs; ++j) {
      const double x = xq[blk * bs + j];
      r.value += (static_cast<double>(a[j]) - b[j]) * x;
      r.scale += (std::fabs(a[j]) + std::fabs(b[j])) * std::fabs(x);
    }
  }
  return r;
}

// x quantized and dequantized the way gemv_quant does it (quantize_row_q8 / _q8_k).
std::vector<double> quantized_row(QuantType t, const float* x, std::int64_t K) {
  std::vector<double> out(K);
  if (t == QuantType::Q8_0) {
    std::vector<cpu::BlockQ8> q(K / 32);
    cpu::quantize_row_q8(x, K, q.data());
    for (std::int64_t i = 0; i < K; ++i) out[i] = double(q[i / 32].d) * q[i / 32].q[i % 32];
  } else {
    std::vector<cpu::BlockQ8K> q(K / 256);
    cpu::quantize_row_q8_k(x, K, q.data());
    for (std::int64_t i = 0; i < K; ++i) out[i] = double(q[i / 256].d) * q[i / 256].q[i % 256];
  }
  return out;
}

TEST(GemvQuant, QuantizersRoundEachValueToTheNearestCode) {
  for (float scale : {1.0f, 3e-5f, 4e4f}) {
    std::vector<float> x = random_x(512, 5, scale);
    x[7] = 0.0f;
    std::fill(x.begin() + 256, x.begin() + 288, 0.0f);  // an all-zero Q8 block
    std::vector<cpu::BlockQ8> q8(16);
    cpu::quantize_row_q8(x.data(), 512, q8.data());
    std::vector<cpu::BlockQ8K> qk(2);
    cpu::quantize_row_q8_k(x.data(), 512, qk.data());
    for (int b = 0; b < 16; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      EXPECT_EQ(q8[b].d, amax / 127.0f);
      for (int j = 0; j < 32; ++j) {
        ASSERT_LE(std::abs(int(q8[b].q[j])), 127);
        ASSERT_LE(std::fabs(double(q8[b].d) * q8[b].q[j] - x[32 * b + j]),
                  0.5 * q8[b].d * (1 + 1e-6) + 1e-30)
            << "scale " << scale << " block " << b << " value " << j;
      }
    }
    EXPECT_EQ(q8[8].d, 0.0f);
    for (int b = 0; b < 2; ++b) {
      for (int j = 0; j < 256; ++j)
        ASSERT_LE(std::fabs(double(qk[b].d) * qk[b].q[j] - x[256 * b + j]),
                  0.5 * qk[b].d * (1 + 1e-6));
      for (int g = 0; g < 16; ++g) {
        int s = 0;
        for (int j = 0; j < 16; ++j) s += qk[b].q[16 * g + j];
        EXPECT_EQ(qk[b].bsums[g], s);
      }
    }
  }
}

// The Q8 and Q8_K x quantizers give the same bytes at every level, for f32 and bf16 rows: random
// blocks, an all-zero block, and a block of exact ties (amax 127, so x * 127 / amax = x: k + 0.5
// rounds to even); Q8_K over the ties block and the 224 random values after it.
TEST(GemvQuant, Q8QuantizersAreTheSameBytesAtEveryLevel) {
  std::vector<float> x = random_x(32 * 12, 6, 2.0f);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
  for (int j = 0; j < 32; ++j) x[128 + j] = j == 0 ? 127.0f : (j % 2 ? 1 : -1) * (j / 2 + 0.5f);
  std::vector<bf16> xb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = cpu::from_compute<bf16>(x[i]);
  auto bytes = [&](bool half) {
    std::vector<cpu::BlockQ8> q(x.size() / 32);
    std::vector<cpu::BlockQ8K> qk(1);
    const std::int64_t n = static_cast<std::int64_t>(x.size());
    if (half) {
      cpu::quantize_row_q8(xb.data(), n, q.data());
      cpu::quantize_row_q8_k(xb.data() + 32 * 4, 256, qk.data());  // from the ties block
    } else {
      cpu::quantize_row_q8(x.data(), n, q.data());
      cpu::quantize_row_q8_k(x.data() + 32 * 4, 256, qk.data());
    }
    // Both quantizations' bytes, one after the other.
    const auto* qb = reinterpret_cast<const std::uint8_t*>(q.data());
    const auto* kb = reinterpret_cast<const std::uint8_t*>(qk.data());
    std::vector<std::uint8_t> out(qb, qb + q.size() * sizeof(cpu::BlockQ8));
    out.insert(out.end(), kb, kb + sizeof(cpu::BlockQ8K));
    return out;
  };
  for (bool half : {false, true}) {
    std::vector<std::uint8_t> scalar;
    {
      cpu::ScopedCpuIsa cap(cpu::CpuIsa::Scalar);
      scalar = bytes(half);
    }
    EXPECT_EQ(scalar[sizeof(cpu::BlockQ8) * 4 + 4 + 1], 0) << "0.5 rounds to even";
    EXPECT_EQ(scalar[sizeof(cpu::BlockQ8) * 4 + 4 + 3], 2) << "1.5 rounds to even";
    for (cpu::CpuIsa level : supported_levels()) {
      cpu::ScopedCpuIsa cap(level);
      EXPECT_EQ(bytes(half), scalar) << cpu::cpu_isa_name(level) << (half ? " bf16" : " f32");
    }
  }
}

// Each dot product at each level against the reference, for 1..9 blocks.
TEST(GemvQuant, EveryDotProductAtEveryLevelMatchesTheF64Reference) {
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
    for (std::int64_t nb : {1, 2, 3, 9}) {
      const std::int64_t K = nb * info(t).block_size;
      const auto w = blocks_of(t, nb, static_cast<std::uint32_t>(nb * 31 + int(t)));
      const std::vector<float> x = random_x(K, static_cast<std::uint32_t>(nb + 3 * int(t)));
      const std::vector<double> xq = quantized_row(t, x.data(), K);
      const Ref ref = reference_dot(t, w.data(), K, xq);
      std::vector<cpu::BlockQ8> q8(K / 32);
      std::vector<cpu::BlockQ8K> qk(K / 256 + 1);
      if (t == QuantType::Q8_0)
        cpu::quantize_row_q8(x.data(), K, q8.data());
      else
        cpu::quantize_row_q8_k(x.data(), K, qk.data());
      for (cpu::CpuIsa level : supported_levels()) {
        cpu::ScopedCpuIsa cap(level);
        const float y = t == QuantType::Q8_0   ? cpu::dot_q8_0(w.data(), q8.data(), nb)
                        : t == QuantType::Q4_K ? cpu::dot_q4_k(w.data(), qk.data(), nb)
                                               : cpu::dot_q6_k(w.data(), qk.data(), nb);
        const double tol = (nb + 8) * std::ldexp(1.0, -24) * ref.scale;
        EXPECT_LE(std::fabs(y - ref.value), tol)
            << info(t).name << " nb " << nb << " level " << cpu::cpu_isa_name(level)
            << (cpu::gemv_quant_uses_vnni() ? " (vnni)" : "") << ": " << y << " vs " << ref.value;
      }
    }
  }
}

// A weight code of -128 (which llama.cpp's quantizer never writes, but a file may hold) and
// x codes of +-127: the extremes of the u8 x i8 pair sums.
TEST(GemvQuant, Q8_0ExtremeCodesDoNotSaturate) {
  std::vector<std::uint8_t> w(34);
  w[0] = 0x00, w[1] = 0x3c;                                     // d = 1
  for (int j = 0; j < 32; ++j) w[2 + j] = j % 2 ? 0x80 : 0x7f;  // -128, 127
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = j % 4 < 2 ? -1.0f : 1.0f;
  std::vector<cpu::BlockQ8> q(1);
  cpu::quantize_row_q8(x.data(), 32, q.data());
  double want = 0;
  for (int j = 0; j < 32; ++j) want += (j % 2 ? -128.0 : 127.0) * q[0].d * q[0].q[j];
  for (cpu::CpuIsa level : supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    EXPECT_NEAR(cpu::dot_q8_0(w.data(), q.data(), 1), want, 1e-5 * std::fabs(want) + 1e-6)
        << cpu::cpu_isa_name(level);
  }
}

// The whole GEMV: M rows, bias, f32 and bf16, against the reference row by row.
template <typename T>
void check_gemv(QuantType t, std::int64_t M, std::int64_t N, std::int64_t K, bool with_bias,
                std::uint32_t seed) {
  const std::int64_t row_bytes = K / info(t).block_size * info(t).block_bytes;
  const auto w = blocks_of(t, N * K / info(t).block_size, seed);
  const std::vector<float> xf = random_x(M * K, seed + 1);
  const std::vector<float> bf = random_x(N, seed + 2);
  std::vector<T> x(M * K), bias(N), y(M * N);
  std::vector<float> xr(M * K);  // x as the kernel reads it
  for (std::int64_t i = 0; i < M * K; ++i) {
    x[i] = cpu::from_compute<T>(xf[i]);
    xr[i] = cpu::to_compute(x[i]);
  }
  for (std::int64_t i = 0; i < N; ++i) bias[i] = cpu::from_compute<T>(bf[i]);
  std::vector<std::uint8_t> scratch(cpu::gemv_quant_scratch_bytes(t, M, K));
  for (cpu::CpuIsa level : supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    cpu::gemv_quant<T, T>(t, M, N, K, x.data(), K, w.data(), with_bias ? bias.data() : nullptr,
                          y.data(), N, scratch.data());
    for (std::int64_t m = 0; m < M; ++m) {
      const std::vector<double> xq = quantized_row(t, xr.data() + m * K, K);
      for (std::int64_t n = 0; n < N; ++n) {
        Ref ref = reference_dot(t, w.data() + n * row_bytes, K, xq);
        if (with_bias) {
          ref.value += cpu::to_compute(bias[n]);
          ref.scale += std::fabs(cpu::to_compute(bias[n]));
        }
        double tol = (K / info(t).block_size + 9) * std::ldexp(1.0, -24) * ref.scale;
        if (std::is_same_v<T, bf16>) tol += std::ldexp(1.0, -8) * std::fabs(ref.value);
        ASSERT_LE(std::fabs(cpu::to_compute(y[m * N + n]) - ref.value), tol)
            << info(t).name << " level " << cpu::cpu_isa_name(level) << " M " << M << " N " << N
            << " K " << K << " row " << m << " col " << n << " y " << cpu::to_compute(y[m * N + n])
            << " ref " << ref.value << " scale " << ref.scale;
      }
    }
  }
}

TEST(GemvQuant, F32RowsWithAndWithoutBias) {
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K})
    for (std::int64_t M : {1, 3, 8})
      for (bool bias : {false, true})
        check_gemv<float>(t, M, 5, 2 * info(t).block_size, bias, 40 + M);
}

TEST(GemvQuant, Bf16RowsAndAThreadedShape) {
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
    check_gemv<bf16>(t, 2, 7, info(t).block_size, true, 70);
    check_gemv<float>(t, 1, 300, 4 * info(t).block_size, false, 80);  // parallel over rows
  }
}

// The tiles of 16 W rows (AVX512-VNNI) or 8 (AVX2), for every type, with a tail of 5 rows after
// the tiles, and more x rows than one pass over a tile takes (32), against the reference at every
// level.
TEST(GemvQuant, TilesOf16WeightRowsAndATail) {
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
    const std::int64_t K = 3 * info(t).block_size;
    for (std::int64_t M : {1, 5, 33}) check_gemv<float>(t, M, 37, K, true, 100 + M);
    check_gemv<bf16>(t, 4, 48, 2 * info(t).block_size, false, 110);
  }
}

// The tiles' arithmetic, as gemv_quant_tiles.cpp states it, evaluated here in scalar code from
// the quantized x: it must give the kernel's bits exactly.
//   Q8_0, per block in order:  acc = fma(float(sum_j w_j q_j), d_w * d_x, acc)
//   Q4_K, per super-block:     acc = fma(float(sum_s sc_s isum_s), d_w * d_x, acc);
//                              acc = fma(-float(sum_s m_s xs_s), dmin_w * d_x, acc)
//   Q6_K, per super-block:     acc = fma(float(sum_g sc_g isum_g - 32 sum_g sc_g bsums_g),
//                                        d_w * d_x, acc)
float tile_formula(QuantType t, const std::uint8_t* wrow, const std::uint8_t* xq, std::int64_t nb) {
  float acc = 0.0f;
  for (std::int64_t b = 0; b < nb; ++b) {
    if (t == QuantType::Q8_0) {
      const std::uint8_t* blk = wrow + b * 34;
      const auto& x = reinterpret_cast<const cpu::BlockQ8*>(xq)[b];
      std::int32_t isum = 0;
      for (int j = 0; j < 32; ++j) isum += static_cast<std::int8_t>(blk[2 + j]) * x.q[j];
      acc = std::fma(static_cast<float>(isum), test::half_at(blk) * x.d, acc);
      continue;
    }
    const auto& x = reinterpret_cast<const cpu::BlockQ8K*>(xq)[b];
    if (t == QuantType::Q6_K) {
      const std::uint8_t* blk = wrow + b * 210;
      const auto* sc = reinterpret_cast<const std::int8_t*>(blk + 192);
      std::int32_t sumi = 0, corr = 0;
      for (int g = 0; g < 16; ++g) {
        std::int32_t isum = 0;
        for (int i = 16 * g; i < 16 * g + 16; ++i) {
          const int h = i / 128, r = (i % 128) / 32, l = i % 32;
          const std::uint8_t low = blk[64 * h + l + 32 * (r & 1)];
          const int q =
              (r >= 2 ? low >> 4 : low & 0xF) | (((blk[128 + 32 * h + l] >> (2 * r)) & 3) << 4);
          isum += q * x.q[i];
        }
        sumi += sc[g] * isum;
        corr += sc[g] * x.bsums[g];
      }
      acc = std::fma(static_cast<float>(sumi - 32 * corr), test::half_at(blk + 208) * x.d, acc);
      continue;
    }
    const std::uint8_t* blk = wrow + b * 144;
    std::int32_t sumi = 0, summ = 0;
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      quant::q4_k_scale_min(blk, s, sc, m);
      std::int32_t isum = 0;
      for (int l = 0; l < 32; ++l) {
        const std::uint8_t byte = blk[16 + 32 * (s / 2) + l];
        isum += ((s & 1) ? byte >> 4 : byte & 0xF) * x.q[32 * s + l];
      }
      sumi += sc * isum;
      summ += m * (x.bsums[2 * s] + x.bsums[2 * s + 1]);
    }
    acc = std::fma(static_cast<float>(sumi), test::half_at(blk) * x.d, acc);
    acc = std::fma(-static_cast<float>(summ), test::half_at(blk + 2) * x.d, acc);
  }
  return acc;
}

TEST(GemvQuant, TilesComputeTheirStatedFormulaBitForBit) {
  if (!cpu::cpu_has(cpu::CpuIsa::Avx2))
    GTEST_SKIP() << "[expected-skip] the tiles run with AVX2 or AVX512-VNNI; this CPU has "
                 << cpu::cpu_isa_name(cpu::cpu_isa_detected());
  // M = 1 is decode's shape, which on AVX2 has its own kernels (sums kept in registers).
  for (cpu::CpuIsa level : supported_levels())
    for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K})
      for (const std::int64_t M : {1, 3}) {
        cpu::ScopedCpuIsa cap(level);
        if (cpu::gemv_quant_tile_width(t) == 0) continue;  // one W row at a time: another formula
        const std::int64_t N = 32, nb = 5, K = nb * info(t).block_size;
        const auto w = blocks_of(t, N * nb, 120);
        const std::vector<float> x = random_x(M * K, 121, 3.0f);
        std::vector<float> y(M * N);
        std::vector<std::uint8_t> scratch(cpu::gemv_quant_scratch_bytes(t, M, K));
        cpu::gemv_quant<float, float>(t, M, N, K, x.data(), K, w.data(), nullptr, y.data(), N,
                                      scratch.data());
        const std::int64_t xbytes =
            t == QuantType::Q8_0 ? sizeof(cpu::BlockQ8) : sizeof(cpu::BlockQ8K);
        for (std::int64_t m = 0; m < M; ++m) {
          std::vector<std::uint8_t> xq(nb * xbytes);
          if (t == QuantType::Q8_0)
            cpu::quantize_row_q8(x.data() + m * K, K, reinterpret_cast<cpu::BlockQ8*>(xq.data()));
          else
            cpu::quantize_row_q8_k(x.data() + m * K, K,
                                   reinterpret_cast<cpu::BlockQ8K*>(xq.data()));
          for (std::int64_t n = 0; n < N; ++n)
            ASSERT_EQ(y[m * N + n],
                      tile_formula(t, w.data() + n * nb * info(t).block_bytes, xq.data(), nb))
                << info(t).name << " row " << m << " col " << n << " level "
                << cpu::cpu_isa_name(level);
        }
      }
}

// The largest codes against x = 127 everywhere, through whole tiles (16 W rows) at every level:
// the i16 sums the AVX2 tiles and kernels keep before widening are at their limits here (Q8_0
// pairs 128 * 127 * 2, Q4_K 8 chunks of 15 * 127 * 2, Q6_K 2 chunks of 63 * 127 * 2), so a
// saturating or overflowing sum shows as a wrong output.
TEST(GemvQuant, TilesDoNotSaturateAtTheExtremeCodes) {
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
    const std::int64_t N = 16, nb = 2, K = nb * info(t).block_size;
    std::vector<std::uint8_t> w(N * nb * info(t).block_bytes, 0xFF);
    for (std::int64_t b = 0; b < N * nb; ++b) {
      std::uint8_t* blk = w.data() + b * info(t).block_bytes;
      if (t == QuantType::Q8_0) {
        blk[0] = 0x00, blk[1] = 0x3c;                    // d = 1
        for (int j = 0; j < 32; ++j) blk[2 + j] = 0x80;  // -128: |w| * sign(x, w) pairs -32512
      } else if (t == QuantType::Q4_K) {
        blk[0] = 0x00, blk[1] = 0x3c;  // d = 1
        blk[2] = 0x00, blk[3] = 0x00;  // dmin = 0; scales and codes all ones: 63 and 15
      } else {
        for (int g = 0; g < 16; ++g) blk[192 + g] = g % 2 ? 0x80 : 0x7f;  // scales -128, 127
        blk[208] = 0x00, blk[209] = 0x3c;                                 // d = 1; codes 63
      }
    }
    const std::vector<float> x(K, 1.0f);  // every code 127
    const std::vector<double> xq = quantized_row(t, x.data(), K);
    std::vector<float> y(N);
    std::vector<std::uint8_t> scratch(cpu::gemv_quant_scratch_bytes(t, 1, K));
    for (cpu::CpuIsa level : supported_levels()) {
      cpu::ScopedCpuIsa cap(level);
      cpu::gemv_quant<float, float>(t, 1, N, K, x.data(), K, w.data(), nullptr, y.data(), N,
                                    scratch.data());
      for (std::int64_t n = 0; n < N; ++n) {
        const Ref r = reference_dot(t, w.data() + n * nb * info(t).block_bytes, K, xq);
        ASSERT_NEAR(y[n], r.value, (nb + 9) * std::ldexp(1.0, -24) * r.scale)
            << info(t).name << " level " << cpu::cpu_isa_name(level) << " col " << n;
      }
    }
  }
}

// Serving's batch invariance rests on this: a row's output is bit-identical whether the GEMV
// runs it alone or with others (the VNNI path takes 16 W rows per tile and 32 x rows per pass
// over a tile, and for Q8_0 4 x rows per pass over a tail row), at every level and every type.
TEST(GemvQuant, EachRowIsBitIdenticalAloneOrWithOthers) {
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
    const std::int64_t N = 41, K = 3 * info(t).block_size;
    const auto w = blocks_of(t, N * K / info(t).block_size, 90);
    const std::vector<float> x = random_x(34 * K, 91);
    for (cpu::CpuIsa level : supported_levels()) {
      cpu::ScopedCpuIsa cap(level);
      for (std::int64_t M : {2, 3, 5, 8, 34}) {
        std::vector<float> y(M * N), one(N);
        std::vector<std::uint8_t> scratch(cpu::gemv_quant_scratch_bytes(t, M, K));
        cpu::gemv_quant<float, float>(t, M, N, K, x.data(), K, w.data(), nullptr, y.data(), N,
                                      scratch.data());
        for (std::int64_t m = 0; m < M; ++m) {
          cpu::gemv_quant<float, float>(t, 1, N, K, x.data() + m * K, K, w.data(), nullptr,
                                        one.data(), N, scratch.data());
          for (std::int64_t n = 0; n < N; ++n)
            ASSERT_EQ(y[m * N + n], one[n]) << info(t).name << " level " << cpu::cpu_isa_name(level)
                                            << " M " << M << " row " << m << " col " << n;
        }
      }
    }
  }
}

// A NaN or an infinity in x makes its block's scale NaN and its codes 0 (never a NaN converted to
// an integer), at every level: the rows of y it reaches are NaN, and the other rows keep the bits
// they have alone.
TEST(GemvQuant, NonFiniteXGivesNanRowsAtEveryLevel) {
  const float inf = std::numeric_limits<float>::infinity();
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
    const std::int64_t N = 21, K = 2 * info(t).block_size, M = 4;
    const auto w = blocks_of(t, N * K / info(t).block_size, 92);
    std::vector<float> x = random_x(M * K, 93);
    x[1 * K + K - 1] = std::numeric_limits<float>::quiet_NaN();  // row 1, last block
    x[2 * K + 3] = inf;                                          // row 2, first block
    x[3 * K + 5] = -inf;                                         // row 3
    for (cpu::CpuIsa level : supported_levels()) {
      cpu::ScopedCpuIsa cap(level);
      const std::string where =
          std::string(info(t).name) + " level " + std::string(cpu::cpu_isa_name(level));
      std::vector<float> y(M * N), alone(N);
      std::vector<std::uint8_t> scratch(cpu::gemv_quant_scratch_bytes(t, M, K));
      cpu::gemv_quant<float, float>(t, M, N, K, x.data(), K, w.data(), nullptr, y.data(), N,
                                    scratch.data());
      cpu::gemv_quant<float, float>(t, 1, N, K, x.data(), K, w.data(), nullptr, alone.data(), N,
                                    scratch.data());
      for (std::int64_t n = 0; n < N; ++n) {
        EXPECT_TRUE(std::isfinite(y[n])) << where << " col " << n;
        EXPECT_EQ(y[n], alone[n]) << where << " col " << n;
        for (std::int64_t m = 1; m < M; ++m)
          EXPECT_TRUE(std::isnan(y[m * N + n])) << where << " row " << m << " col " << n;
      }
      // The quantized blocks themselves: d NaN, every code and block sum 0.
      std::vector<cpu::BlockQ8> q(K / 32);
      cpu::quantize_row_q8(x.data() + 3 * K, K, q.data());
      EXPECT_TRUE(std::isnan(q[0].d)) << where;
      for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].q[j], 0) << where;
      EXPECT_TRUE(std::isfinite(q[1].d)) << where << ": a finite block is unaffected";
      if (K % 256 == 0) {
        std::vector<cpu::BlockQ8K> qk(K / 256);
        cpu::quantize_row_q8_k(x.data() + 2 * K, K, qk.data());
        EXPECT_TRUE(std::isnan(qk[0].d)) << where;
        for (int j = 0; j < 256; ++j) EXPECT_EQ(qk[0].q[j], 0) << where;
        for (int g = 0; g < 16; ++g) EXPECT_EQ(qk[0].bsums[g], 0) << where;
        EXPECT_TRUE(std::isfinite(qk[1].d)) << where;
      }
    }
  }
}

// End to end against the unquantized x: quantizing x moves each value by at most d_x / 2, so
// |y - sum w x| <= sum_i |w_i| d_x,i / 2 plus the rounding bound above.
TEST(GemvQuant, QuantizingXCostsAtMostHalfACodePerValue) {
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K}) {
    const std::int64_t K = 2 * info(t).block_size, N = 3;
    const auto w = blocks_of(t, N * K / info(t).block_size, 90 + int(t));
    const std::vector<float> x = random_x(K, 91);
    std::vector<float> y(N);
    std::vector<std::uint8_t> scratch(cpu::gemv_quant_scratch_bytes(t, 1, K));
    cpu::gemv_quant<float, float>(t, 1, N, K, x.data(), K, w.data(), nullptr, y.data(), N,
                                  scratch.data());
    const std::vector<double> xq = quantized_row(t, x.data(), K);
    const std::int64_t bs = info(t).block_size;
    for (std::int64_t n = 0; n < N; ++n) {
      double exact = 0, bound = 0;
      std::vector<float> a, b;
      for (std::int64_t blk = 0; blk < K / bs; ++blk) {
        split_weights(t, w.data() + (n * K / bs + blk) * info(t).block_bytes, a, b);
        float amax = 0;
        for (std::int64_t j = 0; j < bs; ++j) amax = std::max(amax, std::fabs(x[blk * bs + j]));
        for (std::int64_t j = 0; j < bs; ++j) {
          const double wv = static_cast<double>(a[j]) - b[j];
          exact += wv * x[blk * bs + j];
          bound += std::fabs(wv) * amax / 127.0 / 2.0;
        }
      }
      const Ref r = reference_dot(t, w.data() + n * K / bs * info(t).block_bytes, K, xq);
      bound += (K / bs + 8) * std::ldexp(1.0, -24) * r.scale;
      EXPECT_LE(std::fabs(y[n] - exact), bound * (1 + 1e-6)) << info(t).name << " row " << n;
    }
  }
}

}  // namespace
}  // namespace kiln
