// The f32 attention's block products (kernels/cpu/attention_sgemm.cpp) against an f64 product
// of the same inputs: every op(A)/op(B) combination, sizes around the 6 x 16 tile and the
// 256-column panel of op(B) = B^T, k = 0, leading dimensions wider than the rows, accumulate and
// overwrite, and C's elements outside the product left as they were.
//
// Bound (a dot product's forward error, Higham, Accuracy and Stability, 3.1): each output is
// summed in nb = ceil(k / 256) blocks, each block's sum fl(sum_p A(i,p) B(p,j)) in order, times
// alpha, then added to C (C0 when accumulating), so every term passes through at most k + 2 nb
// roundings:
//   |C - C_exact| <= gamma_{k + 2 nb} (|alpha| sum_p |A(i,p) B(p,j)| + |C0|),
// gamma_n = n u / (1 - n u), u = 2^-24. The f64 reference's own error is below 1e-15 of that.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/isa.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  bool accumulate;
  float alpha;
  int64_t lda = 0, ldb = 0;  // 0: the width plus a few; else this (512: rows that alias in L1)
};

void check_case(const Case& c) {
  // Leading dimensions wider than needed, so a stride bug reads or writes the padding.
  const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const int64_t lda = c.lda ? c.lda : a_cols + 3, ldb = c.ldb ? c.ldb : b_cols + 5;
  const int64_t ldc = c.n + 7;
  auto a = random_normal_vec<float>(std::max<int64_t>(a_rows * lda, 1), 11 + c.m + c.k);
  auto b = random_normal_vec<float>(std::max<int64_t>(b_rows * ldb, 1), 13 + c.n + c.k);
  auto c0 = random_normal_vec<float>(c.m * ldc, 17 + c.m + c.n);
  std::vector<float> out = c0;
  cpu::attn::block_sgemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb,
                         c.accumulate, out.data(), ldc);
  const int64_t nb = std::max<int64_t>(1, (c.k + 255) / 256), rounds = c.k + 2 * nb;
  const double u = std::ldexp(1.0, -24), gamma = rounds * u / (1 - rounds * u);
  int64_t bad = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const double got = out[i * ldc + j];
      if (j >= c.n) {  // the padding of C is not written
        if (got != double(c0[i * ldc + j])) ++bad;
        continue;
      }
      double exact = 0, mag = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double av = c.ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = c.tb ? b[j * ldb + p] : b[p * ldb + j];
        exact += av * bv;
        mag += std::abs(av * bv);
      }
      exact *= c.alpha;
      mag *= std::abs(c.alpha);
      if (c.accumulate) {
        exact += c0[i * ldc + j];
        mag += std::abs(double(c0[i * ldc + j]));
      }
      if (!(std::abs(got - exact) <= gamma * mag)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << "ta=" << c.ta << " tb=" << c.tb << " m=" << c.m << " n=" << c.n
                    << " k=" << c.k << " accumulate=" << c.accumulate << " alpha=" << c.alpha
                    << " lda=" << lda << " ldb=" << ldb;
}

TEST(AttentionBlockSgemm, MatchesF64WithinTheDotProductBound) {
  if (!cpu::attn::block_sgemm_available())
    GTEST_SKIP() << "block_sgemm needs AVX2 + FMA; this CPU's level is "
                 << cpu::cpu_isa_name(cpu::cpu_isa());
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t m : {1, 5, 6, 7, 13, 64})
        for (int64_t n : {1, 8, 9, 16, 17, 48, 130})
          for (int64_t k : {0, 1, 7, 48, 129}) {
            check_case({ta, tb, m, n, k, false, 0.37f});
            check_case({ta, tb, m, n, k, true, 1.0f});
          }
  // op(B) = B^T wider than one 256-column panel, and a partial last panel.
  check_case({false, true, 64, 300, 48, false, 0.125f});
  check_case({false, true, 9, 513, 20, true, -2.0f});
  // k past one 256 block (partial sums added to C), and row strides of 512 floats, which the
  // kernel copies to padded rows (A^T and B; A and B^T are read in place or transposed).
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case({ta, tb, 13, 37, 600, false, 0.5f});
      check_case({ta, tb, 64, 64, 300, true, 1.0f, 0, 0});
      check_case({ta, tb, 64, 48, 257, false, 1.0f, 600, 600});
      check_case({ta, tb, 70, 40, 300, true, -1.0f, 512, 512});
    }
  // A^T wider than the copy's bound at an aliasing stride: read in place.
  check_case({true, false, 300, 16, 40, false, 1.0f, 512, 0});
}

TEST(AttentionBlockSgemm, TakesHeadDimsUpTo64UnlessToldOpenblas) {
  const bool avx2 = cpu::attn::block_sgemm_available();
  EXPECT_EQ(cpu::attn::block_sgemm_takes(48), avx2);
  EXPECT_EQ(cpu::attn::block_sgemm_takes(64), avx2);
  EXPECT_FALSE(cpu::attn::block_sgemm_takes(65));
  EXPECT_FALSE(cpu::attn::block_sgemm_takes(128));
  const bool on = true;
  cpu::attn::set_attention_gemm_openblas(&on);
  EXPECT_FALSE(cpu::attn::block_sgemm_takes(48));
  cpu::attn::set_attention_gemm_openblas(nullptr);
  EXPECT_EQ(cpu::attn::block_sgemm_takes(48), avx2);
  cpu::ScopedCpuIsa cap(cpu::CpuIsa::Scalar);
  EXPECT_FALSE(cpu::attn::block_sgemm_takes(48));
}

TEST(AttentionBlockSgemm, RefusesBelowAvx2) {
  cpu::ScopedCpuIsa cap(cpu::CpuIsa::Scalar);
  EXPECT_FALSE(cpu::attn::block_sgemm_available());
  float x = 0;
  EXPECT_THROW(cpu::attn::block_sgemm(false, false, 1, 1, 1, 1.0f, &x, 1, &x, 1, false, &x, 1),
               Error);
}

}  // namespace
}  // namespace kiln
