// RoPE: both pairings against an explicit rotation written from the definition, positions from
// an array or an offset, in place, forward-then-backward identity, finite differences, and the
// tables against a float64 formula (and, for float, the float32 recipe step by step).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/half.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/rope.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
KILN_OP_TESTED(Op::Rope);

namespace {
using namespace kiln::test;
using cpu::RopeStyle;

// Reference: element pairs rotated by angle pos * theta^(-2i/D), all in float64.
std::vector<double> ref_rope(RopeStyle style, int64_t B, int64_t T, int64_t H, int64_t D,
                             double theta, const std::vector<int64_t>& pos,
                             const std::vector<double>& x, double sign = 1.0) {
  std::vector<double> y(x.size());
  const int64_t half = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double ang = sign * double(pos[b * T + t]) * std::pow(theta, -2.0 * i / D);
          const int64_t base = ((b * T + t) * H + h) * D;
          const int64_t ia = style == RopeStyle::Interleaved ? base + 2 * i : base + i;
          const int64_t ib = style == RopeStyle::Interleaved ? base + 2 * i + 1 : base + i + half;
          y[ia] = x[ia] * std::cos(ang) - x[ib] * std::sin(ang);
          y[ib] = x[ia] * std::sin(ang) + x[ib] * std::cos(ang);
        }
  return y;
}

template <typename F>
void check_rope(RopeStyle style, double tol) {
  struct Case {
    int64_t B, T, H, D;
  };
  for (Case c : {Case{1, 1, 1, 2}, Case{2, 7, 3, 8}, Case{3, 33, 2, 48}, Case{1, 5, 6, 32}}) {
    const int64_t max_pos = 300, half = c.D / 2, n = c.B * c.T * c.H * c.D;
    const double theta = 10000.0;
    std::vector<F> cos(max_pos * half), sin(max_pos * half);
    cpu::rope_tables<F>(max_pos, c.D, theta, cos.data(), sin.data());
    const auto x = random_normal_vec<F>(n, n + c.D);
    for (bool explicit_pos : {false, true}) {
      const int64_t offset = explicit_pos ? 0 : 17;
      std::vector<int64_t> pos(c.B * c.T);
      auto rnd = random_int_vec<int64_t>(c.B * c.T, 5 + n, 0, max_pos);
      for (int64_t i = 0; i < c.B * c.T; ++i) pos[i] = explicit_pos ? rnd[i] : offset + i % c.T;
      const int64_t* pp = explicit_pos ? pos.data() : nullptr;
      std::vector<F> y(n);
      cpu::rope_forward<F>(style, c.B, c.T, c.H, c.D, cos.data(), sin.data(), pp, offset, x.data(),
                           y.data());
      const auto yr = ref_rope(style, c.B, c.T, c.H, c.D, theta, pos, to_f64(x));
      // Float tables carry the float32 angle rounding: |err| ~ pos * ulp(1) for large pos.
      EXPECT_TRUE(all_close(y, yr, tol, tol)) << c.B << "," << c.T << "," << c.H << "," << c.D;
      // In place gives the same bits.
      std::vector<F> inplace = x;
      cpu::rope_forward<F>(style, c.B, c.T, c.H, c.D, cos.data(), sin.data(), pp, offset,
                           inplace.data(), inplace.data());
      EXPECT_EQ(inplace, y);
      // Backward = rotation by -angle; forward then backward is the identity.
      std::vector<F> back(n);
      cpu::rope_backward<F>(style, c.B, c.T, c.H, c.D, cos.data(), sin.data(), pp, offset, y.data(),
                            back.data());
      EXPECT_TRUE(all_close(back, to_f64(x), 10 * default_atol<F>(), 10 * default_rtol<F>()));
      const auto br = ref_rope(style, c.B, c.T, c.H, c.D, theta, pos, to_f64(x), -1.0);
      std::vector<F> bx(n);
      cpu::rope_backward<F>(style, c.B, c.T, c.H, c.D, cos.data(), sin.data(), pp, offset, x.data(),
                            bx.data());
      EXPECT_TRUE(all_close(bx, br, tol, tol));
    }
  }
}

TEST(Rope, InterleavedMatchesRotation) {
  check_rope<float>(RopeStyle::Interleaved, 1e-4);
  check_rope<double>(RopeStyle::Interleaved, 1e-12);
}

TEST(Rope, RotateHalfMatchesRotation) {
  check_rope<float>(RopeStyle::RotateHalf, 1e-4);
  check_rope<double>(RopeStyle::RotateHalf, 1e-12);
}

// bf16 heads at every ISA level this machine has (AVX-512 RotateHalf heads for D % 32 == 0
// from avx512 up, the widening loop otherwise), forward and backward, in place too, against
// float64 on the same bf16 values and f32 tables: the result is rounded once to bf16 (2^-9
// relative), the f32 table angles add ~pos * 2^-24: 2^-8.
TEST(Rope, Bf16AtEveryIsa) {
  const int64_t B = 2, T = 37, H = 3, max_pos = 300;
  const double theta = 1000000.0;
  for (int64_t D : {int64_t(8), int64_t(64), int64_t(128)}) {
    const int64_t half = D / 2, n = B * T * H * D;
    std::vector<float> cos(max_pos * half), sin(max_pos * half);
    cpu::rope_tables<float>(max_pos, D, theta, cos.data(), sin.data());
    const auto xd = random_normal_vec<double>(n, n + D);
    std::vector<bf16> x(n);
    std::vector<double> xr(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = float_to_bf16(float(xd[i]));
      xr[i] = bf16_to_float(x[i]);
    }
    std::vector<int64_t> pos(B * T);
    for (int64_t i = 0; i < B * T; ++i) pos[i] = 250 + i % T;  // offset 250
    for (cpu::CpuIsa level : test::supported_levels()) {
      cpu::ScopedCpuIsa cap(level);
      const std::string at = std::string(cpu::cpu_isa_name(level)) + " D=" + std::to_string(D);
      for (double sign : {1.0, -1.0}) {
        std::vector<bf16> y = x;  // in place
        (sign > 0 ? cpu::rope_forward<bf16>
                  : cpu::rope_backward<bf16>)(RopeStyle::RotateHalf, B, T, H, D, cos.data(),
                                              sin.data(), nullptr, 250, y.data(), y.data());
        std::vector<double> yd(n);
        for (int64_t i = 0; i < n; ++i) yd[i] = bf16_to_float(y[i]);
        const auto ref = ref_rope(RopeStyle::RotateHalf, B, T, H, D, theta, pos, xr, sign);
        EXPECT_TRUE(all_close(yd, ref, 1.0 / 256, 1.0 / 256)) << at << " sign " << sign;
      }
    }
  }
}

// The two pairings are the same rotation up to a permutation of the head dimension: the
// interleaved pair (2i, 2i+1) goes to (i, i + D/2).
TEST(Rope, StylesAgreeUnderPermutation) {
  const int64_t B = 2, T = 9, H = 3, D = 16, half = D / 2, n = B * T * H * D;
  std::vector<double> cos(64 * half), sin(64 * half);
  cpu::rope_tables<double>(64, D, 500000.0, cos.data(), sin.data());
  const auto x = random_normal_vec<double>(n, 3);
  std::vector<double> xp(n), yi(n), yh(n);
  for (int64_t r = 0; r < n / D; ++r)
    for (int64_t i = 0; i < half; ++i) {
      xp[r * D + i] = x[r * D + 2 * i];
      xp[r * D + i + half] = x[r * D + 2 * i + 1];
    }
  cpu::rope_forward<double>(RopeStyle::Interleaved, B, T, H, D, cos.data(), sin.data(), nullptr, 3,
                            x.data(), yi.data());
  cpu::rope_forward<double>(RopeStyle::RotateHalf, B, T, H, D, cos.data(), sin.data(), nullptr, 3,
                            xp.data(), yh.data());
  for (int64_t r = 0; r < n / D; ++r)
    for (int64_t i = 0; i < half; ++i) {
      EXPECT_EQ(yh[r * D + i], yi[r * D + 2 * i]);
      EXPECT_EQ(yh[r * D + i + half], yi[r * D + 2 * i + 1]);
    }
}

TEST(Rope, BackwardFiniteDifferences) {
  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::RotateHalf}) {
    const int64_t B = 2, T = 3, H = 2, D = 6, n = B * T * H * D;
    std::vector<double> cos(16 * 3), sin(16 * 3);
    cpu::rope_tables<double>(16, D, 10000.0, cos.data(), sin.data());
    auto x = random_normal_vec<double>(n, 1);
    const auto dy = random_normal_vec<double>(n, 2);
    std::vector<double> dx(n), yp(n), ym(n);
    cpu::rope_backward<double>(style, B, T, H, D, cos.data(), sin.data(), nullptr, 4, dy.data(),
                               dx.data());
    const double h = 1e-6;
    std::vector<double> g(n);
    for (int64_t i = 0; i < n; ++i) {
      const double x0 = x[i];
      x[i] = x0 + h;
      cpu::rope_forward<double>(style, B, T, H, D, cos.data(), sin.data(), nullptr, 4, x.data(),
                                yp.data());
      x[i] = x0 - h;
      cpu::rope_forward<double>(style, B, T, H, D, cos.data(), sin.data(), nullptr, 4, x.data(),
                                ym.data());
      x[i] = x0;
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += dy[j] * (yp[j] - ym[j]);
      g[i] = s / (2 * h);
    }
    EXPECT_TRUE(all_close(dx, g, 1e-8, 1e-6));
  }
}

TEST(Rope, TablesFloat32Recipe) {
  // Float tables follow HF's float32 steps exactly; double tables match the float64 formula.
  for (double theta : {10000.0, 1000000.0}) {
    const int64_t max_pos = 257, D = 48, half = D / 2;
    std::vector<float> cf(max_pos * half), sf(max_pos * half);
    std::vector<double> cd(max_pos * half), sd(max_pos * half);
    cpu::rope_tables<float>(max_pos, D, theta, cf.data(), sf.data());
    cpu::rope_tables<double>(max_pos, D, theta, cd.data(), sd.data());
    for (int64_t p = 0; p < max_pos; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const float inv = 1.0f / std::pow(float(theta), float(2 * i) / float(D));
        const float ang = float(p) * inv;
        EXPECT_EQ(cf[p * half + i], std::cos(ang));
        EXPECT_EQ(sf[p * half + i], std::sin(ang));
        const double a = double(p) * std::pow(theta, -2.0 * double(i) / double(D));
        EXPECT_NEAR(cd[p * half + i], std::cos(a), 1e-13);
        EXPECT_NEAR(sd[p * half + i], std::sin(a), 1e-13);
        // float angle rounding: within a few ulp of the angle itself
        EXPECT_NEAR(cf[p * half + i], std::cos(a), 4e-7 * (1 + a));
      }
  }
}

TEST(Rope, BadArgumentsThrow) {
  std::vector<float> cos(8), sin(8), x(6), y(6);
  EXPECT_THROW(cpu::rope_forward<float>(RopeStyle::Interleaved, 1, 1, 2, 3, cos.data(), sin.data(),
                                        nullptr, 0, x.data(), y.data()),
               Error);  // odd D
  const int64_t pos = -1;
  EXPECT_THROW(cpu::rope_forward<float>(RopeStyle::RotateHalf, 1, 1, 3, 2, cos.data(), sin.data(),
                                        &pos, 0, x.data(), y.data()),
               Error);
  EXPECT_THROW(cpu::rope_tables<float>(4, 3, 10000.0, cos.data(), sin.data()), Error);
  EXPECT_THROW(cpu::rope_tables<float>(4, 4, -1.0, cos.data(), sin.data()), Error);
}

}  // namespace
}  // namespace kiln
