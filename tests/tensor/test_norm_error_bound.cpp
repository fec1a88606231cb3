// The norm backward's error bound (norm_error_bound.h), checked on the CPU: the CPU's own f32
// kernels against f64, the truth to f32's eyes.
//
// The first GPU run (H200, 2026-11-26) failed CudaNn.RmsNorm and CudaNn.LayerNorm at dim 1: dx
// NMSE 1.5e-4 and 7.6e-6 against a tolerance of 1e-10, and 3.4e-5 where the reference is exactly
// 0. These tests show that this was the tolerance, not the CUDA kernel: the CPU's f32 kernel
// misses f64 by as much at dim 1, and both sit inside the bound that the error analysis gives,
// which CudaNn.* now applies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tests/tensor/norm_error_bound.h"

namespace kiln {
namespace {

Tensor uniform(const Shape& shape, std::uint64_t seed, double lo, double hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(g);
  return ops::from_vector(v, shape, DType::F64);
}

// Normalized MSE of got against want.
double nmse(const Tensor& got, const Tensor& want) {
  const auto g = got.to_double_vector(), w = want.to_double_vector();
  double e = 0, r = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    e += (g[i] - w[i]) * (g[i] - w[i]);
    r += w[i] * w[i];
  }
  return r > 0 ? e / r : (e > 0 ? INFINITY : 0.0);
}

TEST(NormErrorBound, F32CpuBackwardCancelsAtDimOne) {
  // The CUDA test's inputs: x in [-2, 2), w in [0.5, 1.5), dy in [-2, 2); eps 1e-5.
  // 7 rows, as the CUDA test's 7x1 case (over many rows, the few with x near 0, where nothing
  // cancels, dominate a normalized MSE and hide the others).
  const Tensor x = uniform({7, 1}, 3, -2, 2), w = uniform({1}, 4, 0.5, 1.5),
               dy = uniform({7, 1}, 5, -2, 2);
  auto [y64, rstd64] = ops::rmsnorm(x, w, 1e-5);
  const Tensor dx64 = ops::rmsnorm_backward(x, w, rstd64, dy, nullptr);
  auto [y32, rstd32] = ops::rmsnorm(x.to(DType::F32), w.to(DType::F32), 1e-5);
  const Tensor dx32 =
      ops::rmsnorm_backward(x.to(DType::F32), w.to(DType::F32), rstd32, dy.to(DType::F32), nullptr);
  // The old tolerance could not hold: the CPU's own f32 misses f64 by more than 1e-10 NMSE.
  EXPECT_GT(nmse(dx32, dx64), 1e-10);
  std::printf("NormErrorBound: RMSNorm dx at dim 1, f32 CPU vs f64: NMSE %.3g\n", nmse(dx32, dx64));
  // The bound holds, and it is tight enough to mean something: the f32 result is far from it
  // only because it is right; a result off by one term (x rstd^3 g x dropped) is far outside.
  const std::vector<double> mag = test::rmsnorm_dx_magnitude(x, w, rstd64, dy);
  EXPECT_TRUE(test::norm_dx_within_bound(dx32, dx64, mag, DType::F32));
  const Tensor wrong = ops::mul(ops::mul(dy, w), rstd64.view({7, 1}));  // the first term
  EXPECT_FALSE(test::norm_dx_within_bound(wrong, dx64, mag, DType::F32));

  // LayerNorm at dim 1: dx is exactly 0 (x - mean = 0), rstd = 1/sqrt(eps) = 316.
  auto [ly64, mean64, lrstd64] = ops::layernorm(x, w, Tensor(), 1e-5);
  const Tensor ldx64 = ops::layernorm_backward(x, w, mean64, lrstd64, dy, nullptr, nullptr);
  for (double v : ldx64.to_double_vector()) ASSERT_EQ(v, 0.0);
  auto [ly32, mean32, lrstd32] = ops::layernorm(x.to(DType::F32), w.to(DType::F32), Tensor(), 1e-5);
  const Tensor ldx32 = ops::layernorm_backward(x.to(DType::F32), w.to(DType::F32), mean32, lrstd32,
                                               dy.to(DType::F32), nullptr, nullptr);
  const std::vector<double> lmag = test::layernorm_dx_magnitude(x, w, mean64, lrstd64, dy);
  EXPECT_TRUE(test::norm_dx_within_bound(ldx32, ldx64, lmag, DType::F32));
  // 3.4e-5 (what the GPU returned) is inside the bound for these magnitudes: about 316 * 1.5 * 2
  // (rstd |g| twice) * 32 * 2^-24 = 1.8e-3.
  const std::vector<double> one_mag = {lmag[0]};
  EXPECT_TRUE(test::norm_dx_within_bound(ops::full({1, 1}, 3.4e-5, DType::F64),
                                         ops::zeros({1, 1}, DType::F64), one_mag, DType::F32));
}

// Wider rows: f32 and bf16 against f64 within the bound, for RMSNorm and LayerNorm.
TEST(NormErrorBound, CpuF32AndBf16WithinTheBoundAtEverySize) {
  for (std::int64_t dim : {1, 7, 64, 129, 4097}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " dim " + std::to_string(dim));
      // Inputs exactly representable in dt, so both sides start from the same values.
      const Tensor x = uniform({7, dim}, 10 + dim, -1, 3).to(dt).to(DType::F64);
      const Tensor w = uniform({dim}, 11, 0.5, 1.5).to(dt).to(DType::F64);
      const Tensor dy = uniform({7, dim}, 12, -2, 2).to(dt).to(DType::F64);
      auto [y64, rstd64] = ops::rmsnorm(x, w, 1e-5);
      const Tensor dx64 = ops::rmsnorm_backward(x, w, rstd64, dy, nullptr);
      auto [y, rstd] = ops::rmsnorm(x.to(dt), w.to(dt), 1e-5);
      const Tensor dx = ops::rmsnorm_backward(x.to(dt), w.to(dt), rstd, dy.to(dt), nullptr);
      EXPECT_TRUE(
          test::norm_dx_within_bound(dx, dx64, test::rmsnorm_dx_magnitude(x, w, rstd64, dy), dt));
      auto [ly64, m64, lr64] = ops::layernorm(x, w, Tensor(), 1e-5);
      const Tensor ldx64 = ops::layernorm_backward(x, w, m64, lr64, dy, nullptr, nullptr);
      auto [ly, m, lr] = ops::layernorm(x.to(dt), w.to(dt), Tensor(), 1e-5);
      const Tensor ldx =
          ops::layernorm_backward(x.to(dt), w.to(dt), m, lr, dy.to(dt), nullptr, nullptr);
      EXPECT_TRUE(test::norm_dx_within_bound(
          ldx, ldx64, test::layernorm_dx_magnitude(x, w, m64, lr64, dy), dt));
    }
  }
}

}  // namespace
}  // namespace kiln
