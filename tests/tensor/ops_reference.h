// Helpers of the op front-end tests (test_ops.cpp, test_ops_nn.cpp): seeded float64 inputs,
// row-major index arithmetic and an element-wise closeness check against float64 references.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tensor/ops.h"

namespace kiln::ops_ref {

using V = std::vector<double>;

inline Tensor randt(const Shape& shape, std::uint64_t seed, DType dtype = DType::F64,
                    double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  V v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(g);
  Tensor t = ops::from_vector(v, shape, DType::F64);
  return dtype == DType::F64 ? t : t.to(dtype);
}

// Row-major index of a multi-index.
inline std::int64_t flat(const Shape& shape, const std::vector<std::int64_t>& idx) {
  std::int64_t f = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}
inline std::vector<std::int64_t> unravel(std::int64_t i, const Shape& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

inline ::testing::AssertionResult close(const V& got, const V& want, double rtol, double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    double tol = atol + rtol * std::abs(want[i]);
    if (!(std::abs(got[i] - want[i]) <= tol))
      return ::testing::AssertionFailure()
             << "index " << i << ": got " << got[i] << " want " << want[i];
  }
  return ::testing::AssertionSuccess();
}
inline ::testing::AssertionResult close(const Tensor& got, const V& want, double rtol = 1e-12,
                                        double atol = 1e-12) {
  return close(got.to_double_vector(), want, rtol, atol);
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace kiln::ops_ref
