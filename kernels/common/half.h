// 16-bit float storage types shared by the CPU and CUDA backends.
//   bf16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an IEEE float).
//   f16:  IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits, with subnormals.
// Conversions from float round to nearest, ties to even. NaN stays NaN: the sign and the top
// payload bits are kept and the quiet bit is set (a signalling NaN comes back quiet).
// Conversions from double go through float (so they may round twice; fine for storage).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

KILN_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
KILN_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- bf16 ---------------------------------------------------------------------------------------
KILN_HOST_DEVICE inline float bf16_to_float(bf16 h) { return bits_float(uint32_t(h.bits) << 16); }

KILN_HOST_DEVICE inline bf16 float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep sign and top payload, force quiet bit
    return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Overflow past
  // the largest finite bf16 carries into the exponent and gives inf, as IEEE rounding does.
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(rounded >> 16)};
}

// ---- f16 ----------------------------------------------------------------------------------------
KILN_HOST_DEVICE inline float f16_to_float(f16 h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));        // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));  // normal
  if (mant == 0) return bits_float(sign);                                       // +-0
  // Subnormal: mant * 2^-24. Normalize so the leading 1 becomes the implicit bit.
  uint32_t e = 113;  // biased float exponent of 2^-14
  while (!(mant & 0x400u)) {
    mant <<= 1;
    --e;
  }
  return bits_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

// An f16 held as its 16 bits in an integer (a register, a packed word).
KILN_HOST_DEVICE inline float f16_bits_to_float(uint16_t bits) {
  f16 h;
  h.bits = bits;
  return f16_to_float(h);
}

KILN_HOST_DEVICE inline f16 float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t x = u & 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN
    const uint16_t nan = x > 0x7f800000u ? static_cast<uint16_t>(0x200u | ((x >> 13) & 0x3ffu)) : 0;
    return f16{static_cast<uint16_t>(sign | 0x7c00u | nan)};
  }
  if (x >= 0x47800000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65536: inf
  if (x >= 0x38800000u) {
    // Normal half range [2^-14, 65536): rebias the exponent (127 -> 15) and round off 13 bits.
    // A carry out of the mantissa bumps the exponent; at the top it lands exactly on inf.
    uint32_t h = (x - (112u << 23)) >> 13;
    const uint32_t rem = x & 0x1fffu;
    h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u;
    return f16{static_cast<uint16_t>(sign | h)};
  }
  // Subnormal half (or zero): result = round(value * 2^24) in units of 2^-24.
  const uint32_t exp = x >> 23;     // biased float exponent, <= 112 here
  if (exp < 102) return f16{sign};  // value < 2^-25: rounds to zero (2^-25 itself ties to 0)
  const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // in [14, 24]
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  h += (rem > half || (rem == half && (h & 1u))) ? 1u : 0u;
  return f16{static_cast<uint16_t>(sign | h)};
}

}  // namespace kiln
