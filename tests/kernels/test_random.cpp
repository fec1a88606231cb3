// Tests for kernels/common/philox.h (Random123 known-answer vectors, stream layout) and
// kernels/cpu/random.h (values follow the documented layout; distribution moments).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/common/philox.h"
#include "kernels/cpu/random.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

KILN_OP_TESTED(Op::Random);

TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  // Random123 kat_vectors, philox4x32 with 10 rounds.
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) {
    const Philox4 r = philox4x32(k.ctr, k.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.out[i]) << "lane " << i;
  }
}

TEST(Philox, BlockSplitsCounterAndSeed) {
  const uint64_t seed = 0x123456789abcdef0ull, ctr = 0x100000002ull;
  const uint32_t c[4] = {2, 1, 0, 0}, k[2] = {0x9abcdef0u, 0x12345678u};
  const Philox4 a = philox_block(seed, ctr), b = philox4x32(c, k);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.v[i], b.v[i]);
}

TEST(Philox, UniformHelpersRange) {
  EXPECT_EQ(uniform01(0u), 0.0f);
  EXPECT_LT(uniform01(0xffffffffu), 1.0f);
  EXPECT_GT(uniform01_oc(0u), 0.0f);
  EXPECT_EQ(uniform01_oc(0xffffffffu), 1.0f);
}

TEST(RandomUniform, FollowsLayoutAndOffsets) {
  const uint64_t seed = 42;
  for (int64_t n : {1, 7, 33, 129, 20001}) {
    std::vector<float> out(n);
    cpu::random_uniform<float>(n, -2.0, 3.0, seed, 5, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const Philox4 b = philox_block(seed, 5 + uint64_t(i) / 4);
      ASSERT_EQ(out[i], -2.0f + 5.0f * uniform01(b.v[i % 4])) << i;
      ASSERT_GE(out[i], -2.0f);
      ASSERT_LT(out[i], 3.0f);
    }
  }
  // A second draw at offset + ceil(n/4) continues the stream of one long draw.
  std::vector<double> whole(22), first(10), second(12);
  cpu::random_uniform<double>(22, 0, 1, 7, 0, whole.data());
  cpu::random_uniform<double>(10, 0, 1, 7, 0, first.data());
  cpu::random_uniform<double>(12, 0, 1, 7, 3, second.data());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(first[i], whole[i]);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(second[i], whole[12 + i]);
  // Different seeds differ.
  std::vector<double> other(22);
  cpu::random_uniform<double>(22, 0, 1, 8, 0, other.data());
  int same = 0;
  for (int i = 0; i < 22; ++i) same += other[i] == whole[i];
  EXPECT_LT(same, 2);
}

TEST(RandomUniform, Moments) {
  const int64_t n = 200000;
  std::vector<float> u(n);
  cpu::random_uniform<float>(n, 0.0, 1.0, 123, 0, u.data());
  double s = 0, s2 = 0;
  for (float x : u) s += x, s2 += double(x) * x;
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(var, 1.0 / 12, 0.002);
}

TEST(RandomNormal, FollowsBoxMullerLayout) {
  const uint64_t seed = 0xdeadbeefcafeull;
  for (int64_t n : {1, 7, 33, 129, 20001}) {
    std::vector<float> out(n);
    std::vector<double> outd(n);
    cpu::random_normal<float>(n, 1.5, 2.0, seed, 11, out.data());
    cpu::random_normal<double>(n, 1.5, 2.0, seed, 11, outd.data());
    for (int64_t i = 0; i < n; ++i) {
      // Reference in double from the same lanes: pair (2p, 2p+1) of block offset + i/4.
      const Philox4 b = philox_block(seed, 11 + uint64_t(i) / 4);
      const int p = int(i % 4) / 2;
      const double u1 = ((b.v[2 * p] >> 8) + 1.0) / 16777216.0;
      const double u2 = (b.v[2 * p + 1] >> 8) / 16777216.0;
      const double r = std::sqrt(-2 * std::log(u1)), th = 2 * M_PI * u2;
      const double z = (i % 2 == 0) ? r * std::cos(th) : r * std::sin(th);
      ASSERT_NEAR(out[i], 1.5 + 2.0 * z, 2e-5 * (1 + std::abs(z))) << i;
      ASSERT_NEAR(outd[i], 1.5 + 2.0 * z, 2e-5 * (1 + std::abs(z))) << i;
      ASSERT_EQ(out[i], 1.5f + 2.0f * philox_normal_at(seed, 11, uint64_t(i))) << i;
    }
  }
}

TEST(RandomNormal, Moments) {
  const int64_t n = 200000;
  std::vector<double> z(n);
  cpu::random_normal<double>(n, 0.0, 1.0, 99, 0, z.data());
  double s = 0, s2 = 0, s4 = 0;
  int64_t within1 = 0;
  for (double x : z) s += x, s2 += x * x, s4 += x * x * x * x, within1 += std::abs(x) < 1;
  EXPECT_NEAR(s / n, 0.0, 5 / std::sqrt(double(n)));
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
  EXPECT_NEAR(s4 / n, 3.0, 0.1);
  EXPECT_NEAR(double(within1) / n, 0.682689, 0.005);
}

}  // namespace
}  // namespace kiln
