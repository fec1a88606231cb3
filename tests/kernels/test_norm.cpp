// RMSNorm and LayerNorm against float64 references; backward by central differences in double;
// dw/db accumulate (+=) and do not depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/half.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/norm.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
KILN_OP_TESTED(Op::RmsNorm);
KILN_OP_TESTED(Op::LayerNorm);

namespace {
using namespace kiln::test;

struct NormRef {
  std::vector<double> y, mean, rstd;
};

NormRef ref_rmsnorm(int64_t rows, int64_t dim, double eps, const std::vector<double>& x,
                    const std::vector<double>& w) {
  NormRef r{std::vector<double>(x.size()), {}, std::vector<double>(rows)};
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += x[i * dim + j] * x[i * dim + j];
    r.rstd[i] = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j) r.y[i * dim + j] = x[i * dim + j] * r.rstd[i] * w[j];
  }
  return r;
}

NormRef ref_layernorm(int64_t rows, int64_t dim, double eps, const std::vector<double>& x,
                      const std::vector<double>& w, const std::vector<double>* b) {
  NormRef r{std::vector<double>(x.size()), std::vector<double>(rows), std::vector<double>(rows)};
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0, ss = 0;
    for (int64_t j = 0; j < dim; ++j) s += x[i * dim + j];
    const double mu = s / dim;
    for (int64_t j = 0; j < dim; ++j) ss += (x[i * dim + j] - mu) * (x[i * dim + j] - mu);
    r.mean[i] = mu;
    r.rstd[i] = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j)
      r.y[i * dim + j] = (x[i * dim + j] - mu) * r.rstd[i] * w[j] + (b ? (*b)[j] : 0.0);
  }
  return r;
}

// Gradient of L = sum(dy * f(x)) wrt every element of `in`, by central differences.
std::vector<double> fd_grad(const std::function<std::vector<double>()>& f, std::vector<double>& in,
                            const std::vector<double>& dy) {
  const double h = 1e-6;
  std::vector<double> g(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const double v0 = in[i];
    in[i] = v0 + h;
    const auto yp = f();
    in[i] = v0 - h;
    const auto ym = f();
    in[i] = v0;
    double s = 0;
    for (size_t j = 0; j < dy.size(); ++j) s += dy[j] * (yp[j] - ym[j]);
    g[i] = s / (2 * h);
  }
  return g;
}

template <typename T>
void check_rmsnorm_forward(double tol) {
  for (int64_t rows : {int64_t(1), int64_t(5), int64_t(130)})
    for (int64_t dim : {int64_t(1), int64_t(7), int64_t(33), int64_t(288)}) {
      const double eps = 1e-5;
      auto x = random_normal_vec<T>(rows * dim, rows * 100 + dim, 0.5, 2.0);
      auto w = random_uniform_vec<T>(dim, dim, 0.5, 1.5);
      std::vector<T> y(rows * dim), rstd(rows);
      cpu::rmsnorm_forward<T>(rows, dim, eps, x.data(), w.data(), y.data(), rstd.data());
      const auto r = ref_rmsnorm(rows, dim, eps, to_f64(x), to_f64(w));
      EXPECT_TRUE(all_close(y, r.y, tol, tol)) << rows << "x" << dim;
      EXPECT_TRUE(all_close(rstd, r.rstd, tol, tol)) << rows << "x" << dim;
      // In place (y aliases x).
      std::vector<T> xin = x;
      cpu::rmsnorm_forward<T>(rows, dim, eps, xin.data(), w.data(), xin.data(), rstd.data());
      EXPECT_EQ(xin, y);
    }
}

TEST(Norm, RmsNormForward) {
  check_rmsnorm_forward<float>(2e-6);
  check_rmsnorm_forward<double>(1e-13);
}

// bf16 rows at every ISA level this machine has (AVX-512 rows for dim % 16 == 0 from avx512 up,
// the widening loop otherwise), against float64 on the same bf16 values. Tolerances: y is
// rounded once to bf16 (2^-9 relative): 2^-8; rstd is f32 from a double sum: 1e-6. Both
// paths give the same bits (the same f32 products and rounding).
TEST(Norm, RmsNormForwardBf16AtEveryIsa) {
  for (int64_t rows : {int64_t(3), int64_t(130)})
    for (int64_t dim : {int64_t(7), int64_t(128), int64_t(1024)}) {
      const double eps = 1e-6;
      std::vector<bf16> x(rows * dim), w(dim);
      const auto xd = random_normal_vec<double>(rows * dim, rows + dim, 0.5, 2.0);
      const auto wd = random_uniform_vec<double>(dim, dim, 0.5, 1.5);
      for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(float(xd[i]));
      for (size_t i = 0; i < w.size(); ++i) w[i] = float_to_bf16(float(wd[i]));
      std::vector<double> xr(x.size()), wr(w.size());
      for (size_t i = 0; i < x.size(); ++i) xr[i] = bf16_to_float(x[i]);
      for (size_t i = 0; i < w.size(); ++i) wr[i] = bf16_to_float(w[i]);
      const auto r = ref_rmsnorm(rows, dim, eps, xr, wr);
      std::vector<bf16> first;
      for (cpu::CpuIsa level : test::supported_levels()) {
        cpu::ScopedCpuIsa cap(level);
        std::vector<bf16> y(rows * dim);
        std::vector<float> rstd(rows);
        cpu::rmsnorm_forward<bf16>(rows, dim, eps, x.data(), w.data(), y.data(), rstd.data());
        std::vector<double> yd(y.size());
        for (size_t i = 0; i < y.size(); ++i) yd[i] = bf16_to_float(y[i]);
        const auto name = cpu::cpu_isa_name(level);
        EXPECT_TRUE(all_close(yd, r.y, 1.0 / 256, 1.0 / 256)) << rows << "x" << dim << " " << name;
        EXPECT_TRUE(all_close(rstd, r.rstd, 1e-6, 1e-6)) << rows << "x" << dim << " " << name;
        if (level == cpu::CpuIsa::Scalar) first = y;
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_EQ(y[i].bits, first[i].bits) << rows << "x" << dim << " " << name << " at " << i;
      }
    }
}

template <typename T>
void check_layernorm_forward(double tol) {
  for (bool bias : {true, false})
    for (int64_t rows : {int64_t(1), int64_t(5), int64_t(130)})
      for (int64_t dim : {int64_t(1), int64_t(7), int64_t(33), int64_t(288)}) {
        const double eps = 1e-5;
        // A large mean checks the two-pass variance.
        auto x = random_normal_vec<T>(rows * dim, rows * 100 + dim, 30.0, 2.0);
        auto w = random_uniform_vec<T>(dim, dim, 0.5, 1.5);
        auto b = random_uniform_vec<T>(dim, dim + 1);
        std::vector<T> y(rows * dim), mean(rows), rstd(rows);
        cpu::layernorm_forward<T>(rows, dim, eps, x.data(), w.data(), bias ? b.data() : nullptr,
                                  y.data(), mean.data(), rstd.data());
        const auto bd = to_f64(b);
        const auto r = ref_layernorm(rows, dim, eps, to_f64(x), to_f64(w), bias ? &bd : nullptr);
        // x ~ 30 in float: x - mean loses ~log2(30) bits before normalizing.
        const double t = std::is_same_v<T, float> ? 50 * tol : tol;
        EXPECT_TRUE(all_close(y, r.y, t, t)) << rows << "x" << dim;
        EXPECT_TRUE(all_close(mean, r.mean, t, tol)) << rows << "x" << dim;
        EXPECT_TRUE(all_close(rstd, r.rstd, t, t)) << rows << "x" << dim;
      }
}

TEST(Norm, LayerNormForward) {
  check_layernorm_forward<float>(2e-6);
  check_layernorm_forward<double>(1e-12);
}

TEST(Norm, RmsNormBackwardFiniteDifferences) {
  for (int64_t rows : {int64_t(1), int64_t(3), int64_t(70)})
    for (int64_t dim : {int64_t(1), int64_t(6), int64_t(17)}) {
      const double eps = 1e-5;
      auto x = random_normal_vec<double>(rows * dim, rows + 7 * dim);
      auto w = random_uniform_vec<double>(dim, dim + 3, 0.5, 1.5);
      auto dy = random_uniform_vec<double>(rows * dim, rows + 11 * dim);
      std::vector<double> y(rows * dim), rstd(rows), dx(rows * dim);
      auto f = [&] {
        std::vector<double> yy(rows * dim), rs(rows);
        cpu::rmsnorm_forward<double>(rows, dim, eps, x.data(), w.data(), yy.data(), rs.data());
        return yy;
      };
      cpu::rmsnorm_forward<double>(rows, dim, eps, x.data(), w.data(), y.data(), rstd.data());
      std::vector<double> dw(dim, 0.25);  // += : starts from a nonzero value
      cpu::rmsnorm_backward<double>(rows, dim, x.data(), w.data(), rstd.data(), dy.data(),
                                    dx.data(), dw.data());
      const auto gx = fd_grad(f, x, dy);
      auto gw = fd_grad(f, w, dy);
      for (auto& g : gw) g += 0.25;
      EXPECT_TRUE(all_close(dx, gx, 1e-8, 1e-6)) << rows << "x" << dim;
      EXPECT_TRUE(all_close(dw, gw, 1e-8, 1e-6)) << rows << "x" << dim;
    }
}

TEST(Norm, LayerNormBackwardFiniteDifferences) {
  for (bool bias : {true, false})
    for (int64_t rows : {int64_t(1), int64_t(3), int64_t(70)})
      for (int64_t dim : {int64_t(2), int64_t(6), int64_t(17)}) {
        const double eps = 1e-5;
        auto x = random_normal_vec<double>(rows * dim, rows + 7 * dim, 1.0, 1.0);
        auto w = random_uniform_vec<double>(dim, dim + 3, 0.5, 1.5);
        auto b = random_uniform_vec<double>(dim, dim + 4);
        auto dy = random_uniform_vec<double>(rows * dim, rows + 11 * dim);
        std::vector<double> y(rows * dim), mean(rows), rstd(rows), dx(rows * dim);
        const double* bp = bias ? b.data() : nullptr;
        auto f = [&] {
          std::vector<double> yy(rows * dim), m(rows), rs(rows);
          cpu::layernorm_forward<double>(rows, dim, eps, x.data(), w.data(), bp, yy.data(),
                                         m.data(), rs.data());
          return yy;
        };
        cpu::layernorm_forward<double>(rows, dim, eps, x.data(), w.data(), bp, y.data(),
                                       mean.data(), rstd.data());
        std::vector<double> dw(dim, 0.5), db(dim, -0.5);
        cpu::layernorm_backward<double>(rows, dim, x.data(), w.data(), mean.data(), rstd.data(),
                                        dy.data(), dx.data(), dw.data(),
                                        bias ? db.data() : nullptr);
        const auto gx = fd_grad(f, x, dy);
        auto gw = fd_grad(f, w, dy);
        for (auto& g : gw) g += 0.5;
        EXPECT_TRUE(all_close(dx, gx, 1e-8, 1e-6)) << rows << "x" << dim;
        EXPECT_TRUE(all_close(dw, gw, 1e-8, 1e-6)) << rows << "x" << dim;
        if (bias) {
          auto gb = fd_grad(f, b, dy);
          for (auto& g : gb) g -= 0.5;
          EXPECT_TRUE(all_close(db, gb, 1e-8, 1e-6)) << rows << "x" << dim;
        }
      }
}

// Float backward against the float64 formula on a training-sized shape; dw sums must not
// depend on the number of threads.
TEST(Norm, BackwardFloatDeterministic) {
  const int64_t rows = 12 * 64, dim = 288;
  auto x = random_normal_vec<float>(rows * dim, 1);
  auto w = random_uniform_vec<float>(dim, 2, 0.5, 1.5);
  auto b = random_uniform_vec<float>(dim, 3);
  auto dy = random_normal_vec<float>(rows * dim, 4);
  std::vector<float> y(rows * dim), mean(rows), rstd(rows), dx(rows * dim);

  cpu::rmsnorm_forward<float>(rows, dim, 1e-5, x.data(), w.data(), y.data(), rstd.data());
  std::vector<float> dw1(dim, 0.f), dw2(dim, 0.f), dx2(rows * dim);
  cpu::rmsnorm_backward<float>(rows, dim, x.data(), w.data(), rstd.data(), dy.data(), dx.data(),
                               dw1.data());
  const int nt = omp_get_max_threads();
  omp_set_num_threads(nt == 1 ? 3 : 1);
  cpu::rmsnorm_backward<float>(rows, dim, x.data(), w.data(), rstd.data(), dy.data(), dx2.data(),
                               dw2.data());
  omp_set_num_threads(nt);
  EXPECT_EQ(dw1, dw2);
  EXPECT_EQ(dx, dx2);
  // Reference dw, dx in float64.
  std::vector<double> dw_ref(dim, 0.0), dx_ref(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0, dot = 0;
    for (int64_t j = 0; j < dim; ++j) ss += double(x[r * dim + j]) * x[r * dim + j];
    const double rs = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int64_t j = 0; j < dim; ++j) dot += double(w[j]) * dy[r * dim + j] * x[r * dim + j];
    for (int64_t j = 0; j < dim; ++j) {
      dw_ref[j] += double(dy[r * dim + j]) * x[r * dim + j] * rs;
      dx_ref[r * dim + j] = rs * w[j] * dy[r * dim + j] - x[r * dim + j] * rs * rs * rs * dot / dim;
    }
  }
  EXPECT_TRUE(all_close(dw1, dw_ref, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(dx, dx_ref, 1e-5, 1e-4));

  cpu::layernorm_forward<float>(rows, dim, 1e-5, x.data(), w.data(), b.data(), y.data(),
                                mean.data(), rstd.data());
  std::vector<float> lw1(dim, 0.f), lb1(dim, 0.f), lw2(dim, 0.f), lb2(dim, 0.f);
  cpu::layernorm_backward<float>(rows, dim, x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                 dx.data(), lw1.data(), lb1.data());
  omp_set_num_threads(nt == 1 ? 3 : 1);
  cpu::layernorm_backward<float>(rows, dim, x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                 dx2.data(), lw2.data(), lb2.data());
  omp_set_num_threads(nt);
  EXPECT_EQ(lw1, lw2);
  EXPECT_EQ(lb1, lb2);
  EXPECT_EQ(dx, dx2);
}

TEST(Norm, BadSizesThrow) {
  std::vector<float> x(4), w(4), y(4), r(1);
  EXPECT_THROW(cpu::rmsnorm_forward<float>(1, 0, 1e-5, x.data(), w.data(), y.data(), r.data()),
               Error);
  EXPECT_THROW(cpu::rmsnorm_forward<float>(-1, 4, 1e-5, x.data(), w.data(), y.data(), r.data()),
               Error);
}

}  // namespace
}  // namespace kiln
