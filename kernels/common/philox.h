// Philox4x32-10 counter-based RNG (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), shared by the CPU and CUDA backends so both draw the same bits.
//
// Stream layout (the contract every random kernel follows, on every backend):
//   A tensor filled with (seed, offset) gives element i the Philox block
//     counter = {lo32(offset + i/4), hi32(offset + i/4), 0, 0},  key = {lo32(seed), hi32(seed)}
//   and uses output lane i % 4 of that block.
//   - uniform: lane i%4 -> uniform01(lane) in [0, 1).
//   - normal:  Box-Muller on lane pairs. Elements 4j+0 and 4j+1 share lanes (0, 1); elements 4j+2
//     and 4j+3 share lanes (2, 3). With u1 = uniform01_oc(lane 2p) in (0, 1] and
//     u2 = uniform01(lane 2p+1): r = sqrt(-2 ln u1); the even element gets r*cos(2*pi*u2), the
//     odd one r*sin(2*pi*u2).
//   So n elements consume ceil(n/4) counters: a caller that draws again from the same seed
//   advances offset by ceil(n/4). The bits (and uniforms) match exactly across backends; normals
//   match to a few float ulps (log/sin/cos differ by a few ulps between libm and CUDA).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/half.h"  // KILN_HOST_DEVICE

namespace kiln {

struct Philox4 {
  uint32_t v[4];
};

namespace philox_detail {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

KILN_HOST_DEVICE inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace philox_detail

// Ten rounds of Philox4x32 on counter c with key k (the key is bumped by the Weyl constants
// between rounds).
KILN_HOST_DEVICE inline Philox4 philox4x32(const uint32_t counter[4], const uint32_t key[2]) {
  using namespace philox_detail;
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c0, hi0, lo0);
    mulhilo(kMul1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The block for counter index `ctr` (= offset + i/4) under `seed`, per the layout above.
KILN_HOST_DEVICE inline Philox4 philox_block(uint64_t seed, uint64_t ctr) {
  const uint32_t c[4] = {static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), 0u, 0u};
  const uint32_t k[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  return philox4x32(c, k);
}

// Top 24 bits -> float in [0, 1): exact multiples of 2^-24.
KILN_HOST_DEVICE inline float uniform01(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}
// Top 24 bits -> float in (0, 1]: never 0, so log() is finite.
KILN_HOST_DEVICE inline float uniform01_oc(uint32_t x) {
  return static_cast<float>((x >> 8) + 1u) * (1.0f / 16777216.0f);
}

// Box-Muller: two standard normals from one lane pair (a -> radius, b -> angle).
KILN_HOST_DEVICE inline void box_muller(uint32_t a, uint32_t b, float& z0, float& z1) {
  const float r = sqrtf(-2.0f * logf(uniform01_oc(a)));
  const float theta = 6.2831853071795864769f * uniform01(b);
  z0 = r * cosf(theta);
  z1 = r * sinf(theta);
}

// Element i's uniform in [0, 1) and standard normal under (seed, offset), per the layout above.
KILN_HOST_DEVICE inline float philox_uniform_at(uint64_t seed, uint64_t offset, uint64_t i) {
  const Philox4 b = philox_block(seed, offset + i / 4);
  return uniform01(b.v[i % 4]);
}
KILN_HOST_DEVICE inline float philox_normal_at(uint64_t seed, uint64_t offset, uint64_t i) {
  const Philox4 b = philox_block(seed, offset + i / 4);
  const unsigned p = static_cast<unsigned>(i % 4) / 2;
  float z0, z1;
  box_muller(b.v[2 * p], b.v[2 * p + 1], z0, z1);
  return (i % 2 == 0) ? z0 : z1;
}

}  // namespace kiln
