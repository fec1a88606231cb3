// Reference dequantizers for the tests, written the way llama.cpp's dequantize_row_q4_K and
// dequantize_row_q6_K walk a block (ggml-quants.c): by groups and by lanes, not by weight index
// as kernels/common/quant.h does, in the same f32 arithmetic. The f16 scales are decoded here
// bit by bit, without kiln's conversion.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/half.h"

namespace kiln::test {

inline float half_bits_value(std::uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  const double v = exponent == 0    ? std::ldexp(mantissa, -24)
                   : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                    : std::ldexp(1024 + mantissa, exponent - 25);
  return static_cast<float>(sign ? -v : v);
}
inline float half_at(const std::uint8_t* p) {
  return half_bits_value(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
}

// The 256 weights of one Q4_K block (144 bytes).
inline std::vector<float> ref_q4_k(const std::uint8_t* x) {
  std::vector<float> y;
  const float d = half_at(x), min = half_at(x + 2);
  const std::uint8_t* scales = x + 4;
  const std::uint8_t* q = x + 16;
  auto scale_min = [&](int j, int& sc, int& m) {
    if (j < 4) {
      sc = scales[j] & 63;
      m = scales[j + 4] & 63;
    } else {
      sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
      m = (scales[j + 4] >> 4) | ((scales[j - 0] >> 6) << 4);
    }
  };
  int is = 0;
  for (int j = 0; j < 256; j += 64) {
    int sc, m;
    scale_min(is + 0, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
    scale_min(is + 1, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) y.push_back(d1 * static_cast<float>(q[l] & 0xF) - m1);
    for (int l = 0; l < 32; ++l) y.push_back(d2 * static_cast<float>(q[l] >> 4) - m2);
    q += 32;
    is += 2;
  }
  return y;
}

// The 256 weights of one Q6_K block (210 bytes).
inline std::vector<float> ref_q6_k(const std::uint8_t* x) {
  std::vector<float> y(256);
  const float d = half_at(x + 208);
  const std::uint8_t* ql = x;
  const std::uint8_t* qh = x + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(x + 192);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[n + l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[n + l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[n + l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[n + l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    ql += 64;
    qh += 32;
    sc += 8;
  }
  return y;
}

// llama.cpp's quantize_row_q8_0: d = max|x| / 127 (stored as f16), q = round(x / d), for a
// row of floats whose length is a multiple of 32.
inline std::vector<std::uint8_t> quantize_q8_0(const std::vector<float>& x) {
  std::vector<std::uint8_t> out;
  for (std::size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const f16 dh = float_to_f16(d);
    out.push_back(static_cast<std::uint8_t>(dh.bits & 0xff));
    out.push_back(static_cast<std::uint8_t>(dh.bits >> 8));
    for (int j = 0; j < 32; ++j)
      out.push_back(
          static_cast<std::uint8_t>(static_cast<std::int8_t>(std::lround(x[b * 32 + j] * id))));
  }
  return out;
}

// Random blocks of `bytes` each whose f16 fields at `half_offsets` are finite (exponent < 31).
inline std::vector<std::uint8_t> random_blocks(int n, int bytes, std::vector<int> half_offsets,
                                               std::uint32_t seed) {
  std::vector<std::uint8_t> b(static_cast<std::size_t>(n) * bytes);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& v : b) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    v = static_cast<std::uint8_t>(x >> 11);
  }
  for (int k = 0; k < n; ++k)
    for (int o : half_offsets) {
      std::uint8_t& hi = b[static_cast<std::size_t>(k) * bytes + o + 1];
      if (((hi >> 2) & 31) == 31) hi = static_cast<std::uint8_t>(hi & ~0x40);  // exponent 31 -> 15
    }
  return b;
}

}  // namespace kiln::test
