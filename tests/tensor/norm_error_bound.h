// How close two implementations of a norm's backward dx can be, element by element, from an
// error analysis instead of one machine's observed error (kernels/cpu/norm.h has the formulas):
//
//   RMSNorm:   dx_i = rstd g_i - x_i rstd^3 mean_j(g_j x_j),                       g = w dy
//   LayerNorm: dx_i = rstd (g_i - mean_j g_j - xhat_i mean_j(g_j xhat_j)),  xhat = (x - mean) rstd
//
// Each dx_i is a difference of terms that can cancel: at dim 1, RMSNorm's two terms agree to
// eps / x^2 (about 4e-5 of their size) and LayerNorm's are exactly equal (xhat = 0, dx = 0) while
// rstd = 1/sqrt(eps) = 316 makes each term large. Rounding each term in f32 (u = 2^-24) then
// leaves an error of a few u times the terms' size, which is far above the result: an NMSE bound
// relative to dx (1e-10) cannot hold for any f32 implementation, the CPU's own f32 kernel
// included (NormErrorBound.F32CpuBackwardCancelsAtDimOne shows it against f64).
//
// The bound: |got_i - want_i| <= c u M_i + u_out |want_i|, where M_i is the sum of the absolute
// values of the terms dx_i is made of (the formulas above with |.| everywhere, plus the rounding
// of x - mean in LayerNorm's xhat), u = 2^-24 (the math is f32 for f32 and bf16 storage), u_out
// the output's relative rounding (0 for f32, 2^-7 for bf16: both sides round once, one bf16 ulp
// apart at most), and c = 32 + 2 ceil(log2(dim)): a few roundings per term, three factors of an
// rstd that two implementations compute a few ulps apart, and each mean's f32 sum over dim
// elements in per-thread partial sums and a log2(threads) tree. A wrong kernel misses by about
// M_i (the size of the terms), about 2^24 / c times the bound.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace kiln::test {

inline std::vector<double> values_of(const Tensor& t) {
  return t.to(Device::cpu()).to_double_vector();
}

// M_i of RMSNorm's dx for x, w, dy of (rows, dim) and rstd of (rows).
inline std::vector<double> rmsnorm_dx_magnitude(const Tensor& x, const Tensor& w,
                                                const Tensor& rstd, const Tensor& dy) {
  const std::int64_t dim = x.size(-1), rows = x.numel() / dim;
  const auto xv = values_of(x), wv = values_of(w), rv = values_of(rstd), dv = values_of(dy);
  std::vector<double> m(xv.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean_gx = 0;
    for (std::int64_t j = 0; j < dim; ++j)
      mean_gx += std::fabs(wv[j] * dv[r * dim + j] * xv[r * dim + j]);
    mean_gx /= static_cast<double>(dim);
    const double s = rv[r];
    for (std::int64_t j = 0; j < dim; ++j) {
      const std::int64_t i = r * dim + j;
      m[i] = s * std::fabs(wv[j] * dv[i]) + std::fabs(xv[i]) * s * s * s * mean_gx;
    }
  }
  return m;
}

// M_i of LayerNorm's dx for x, w, dy of (rows, dim) and mean, rstd of (rows).
inline std::vector<double> layernorm_dx_magnitude(const Tensor& x, const Tensor& w,
                                                  const Tensor& mean, const Tensor& rstd,
                                                  const Tensor& dy) {
  const std::int64_t dim = x.size(-1), rows = x.numel() / dim;
  const auto xv = values_of(x), wv = values_of(w), mv = values_of(mean), rv = values_of(rstd),
             dv = values_of(dy);
  std::vector<double> m(xv.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    const double s = rv[r], mu = mv[r];
    // mean|g|, mean|g xhat|, and mean|g| |xhat's rounding scale| (x - mean rounds at |x| + |mean|).
    double mg = 0, mgx = 0, mgerr = 0;
    for (std::int64_t j = 0; j < dim; ++j) {
      const std::int64_t i = r * dim + j;
      const double g = std::fabs(wv[j] * dv[i]);
      mg += g;
      mgx += g * std::fabs((xv[i] - mu) * s);
      mgerr += g * s * (std::fabs(xv[i]) + std::fabs(mu));
    }
    mg /= static_cast<double>(dim);
    mgx /= static_cast<double>(dim);
    mgerr /= static_cast<double>(dim);
    for (std::int64_t j = 0; j < dim; ++j) {
      const std::int64_t i = r * dim + j;
      const double xhat = std::fabs((xv[i] - mu) * s),
                   xerr = s * (std::fabs(xv[i]) + std::fabs(mu));
      m[i] = s * (std::fabs(wv[j] * dv[i]) + mg + (xhat + xerr) * mgx + xhat * mgerr);
    }
  }
  return m;
}

// got against want within c u M_i + u_out |want_i| (the header comment), element by element.
inline ::testing::AssertionResult norm_dx_within_bound(const Tensor& got, const Tensor& want,
                                                       const std::vector<double>& magnitude,
                                                       DType storage) {
  const std::vector<double> g = values_of(got), w = values_of(want);
  if (g.size() != w.size() || g.size() != magnitude.size())
    return ::testing::AssertionFailure()
           << "sizes " << g.size() << ", " << w.size() << ", " << magnitude.size();
  const std::int64_t dim = got.size(-1);
  const double u = std::ldexp(1.0, -24);
  const double c = 32 + 2 * std::ceil(std::log2(static_cast<double>(dim > 1 ? dim : 2)));
  const double u_out = storage == DType::F32 ? 0.0 : std::ldexp(1.0, -7);
  double worst = 0;  // largest |err| / bound
  std::size_t at = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i]) || !std::isfinite(w[i]))
      return ::testing::AssertionFailure()
             << "non-finite at " << i << ": " << g[i] << " vs " << w[i];
    const double bound = c * u * magnitude[i] + u_out * std::fabs(w[i]);
    const double err = std::fabs(g[i] - w[i]);
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
    if (ratio > worst) {
      worst = ratio;
      at = i;
    }
  }
  if (worst <= 1) return ::testing::AssertionSuccess() << "worst error " << worst << " of bound";
  return ::testing::AssertionFailure()
         << "element " << at << ": got " << g[at] << ", want " << w[at] << ", |err| "
         << std::fabs(g[at] - w[at]) << " is " << worst << " x the bound (c " << c << ", M "
         << magnitude[at] << ")";
}

}  // namespace kiln::test
