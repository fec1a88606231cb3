// The backend-ops test's case type (tests/tensor/test_backend_ops.cpp), shared so that an op's own
// test file can add its CPU-versus-CUDA case beside its other tests:
//
//   [[maybe_unused]] static const bool kRegistered = backend_ops::register_case(
//       {Op::Foo, "foo", backend_ops::Tol::Elementwise, [](const backend_ops::Env& e) {...}});
//
// Registered cases join the table every backend-ops test iterates (EveryOpHasACase included).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/op_list.h"
#include "tensor/ops.h"

namespace kiln::backend_ops {

// The agreement thresholds by kind (the table and its reasoning: test_backend_ops.cpp).
enum class Tol { Elementwise, Reduction, Matmul, Attention };

// Inputs are made on the CPU in f32 from a seed, rounded to the case's dtype
// there, and then moved to the device: both backends see bit-identical inputs.
struct Env {
  Device dev;
  DType dt;
  Tensor in(const Shape &s, std::uint64_t seed, double lo = -1.0, double hi = 1.0) const {
    Generator g(seed);
    return ops::rand_uniform(s, g, lo, hi, DType::F32).to(dt).to(dev);
  }
  Tensor in_f32(const Shape &s, std::uint64_t seed, double lo = -1.0, double hi = 1.0) const {
    Generator g(seed);
    return ops::rand_uniform(s, g, lo, hi, DType::F32).to(dev);
  }
  Tensor ids(std::int64_t n, std::int32_t vocab, std::uint64_t seed) const {
    std::vector<std::int32_t> v(static_cast<std::size_t>(n));
    std::uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (auto &t : v) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      t = static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(vocab));
    }
    return ops::from_vector(v, {n}).to(dev);
  }
};

struct Case {
  Op op;
  std::string name;
  Tol tol;
  // Runs the op on env.dev and returns every output (gradients and in-place
  // results included).
  std::function<std::vector<Tensor>(const Env &)> run;
};

// The cases registered from other files (static initialization, before main).
std::vector<Case> &registered_cases();
inline bool register_case(Case c) {
  registered_cases().push_back(std::move(c));
  return true;
}

}  // namespace kiln::backend_ops
