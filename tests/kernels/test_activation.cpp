// Every pointwise activation (kernels/op_list.h: kActivations) and SwiGLU against float64
// references; backward by central differences in double; exp_fast against std::exp over its
// whole range.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/isa.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
KILN_OP_TESTED(Op::SwiGlu);
// Every activation: EveryActivationForwardBackward fails for one without a float64 reference.
[[maybe_unused]] static const bool kActivationsTested = [] {
  for (Op op : kActivations) test::tested_ops().insert(op);
  return true;
}();

namespace {
using namespace kiln::test;

double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }
double ref_silu_grad(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}
double ref_gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double ref_gelu_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
const double kC = std::sqrt(2.0 / M_PI);
double ref_gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(kC * (x + 0.044715 * x * x * x)));
}
double ref_gelu_tanh_grad(double x) {
  const double t = std::tanh(kC * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kC * (1 + 3 * 0.044715 * x * x);
}

// d/dx_i of sum_j dy_j f(x)_j by central differences, f elementwise (n outputs from n inputs).
std::vector<double> fd_grad(
    const std::function<void(const std::vector<double>&, std::vector<double>&)>& f,
    std::vector<double> x, const std::vector<double>& dy) {
  const double h = 1e-6;
  std::vector<double> g(x.size()), yp(dy.size()), ym(dy.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    f(x, yp);
    x[i] = x0 - h;
    f(x, ym);
    x[i] = x0;
    double s = 0;
    for (size_t j = 0; j < dy.size(); ++j) s += dy[j] * (yp[j] - ym[j]);
    g[i] = s / (2 * h);
  }
  return g;
}

// The float64 reference of each activation: y = f(x), dy/dx = grad(x).
struct ActivationRef {
  Op op;
  double (*f)(double);
  double (*grad)(double);
};
const ActivationRef kRefs[] = {
    {Op::Silu, ref_silu, ref_silu_grad},
    {Op::GeluTanh, ref_gelu_tanh, ref_gelu_tanh_grad},
    {Op::Gelu, ref_gelu, ref_gelu_grad},
};
const ActivationRef* find_ref(Op op) {
  for (const auto& r : kRefs)
    if (r.op == op) return &r;
  return nullptr;
}

template <typename T>
void check_unary(Op op, const ActivationRef& ref, double tol) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(33), int64_t(129), int64_t(70000)}) {
    // Wide range: saturation on both sides, and the region around 0.
    auto x = random_uniform_vec<T>(n, 11 + n, -12.0, 12.0);
    if (n > 3) x[0] = T(0), x[1] = T(-100), x[2] = T(100);
    std::vector<T> y(n);
    cpu::activation_forward<T>(op, n, x.data(), y.data());
    std::vector<double> yr(n);
    for (int64_t i = 0; i < n; ++i) yr[i] = ref.f(double(x[i]));
    EXPECT_TRUE(all_close(y, yr, tol, tol)) << op_name(op) << " n=" << n;
    auto dy = random_uniform_vec<T>(n, 99 + n);
    std::vector<T> dx(n);
    cpu::activation_backward<T>(op, n, x.data(), dy.data(), dx.data());
    std::vector<double> dxr(n);
    for (int64_t i = 0; i < n; ++i) dxr[i] = double(dy[i]) * ref.grad(double(x[i]));
    EXPECT_TRUE(all_close(dx, dxr, tol, tol)) << op_name(op) << " n=" << n;
    // In place: dx aliases dy.
    std::vector<T> inplace = dy;
    cpu::activation_backward<T>(op, n, x.data(), inplace.data(), inplace.data());
    EXPECT_EQ(inplace, dx) << op_name(op);
  }
}

TEST(Activation, EveryActivationForwardBackward) {
  for (Op op : kActivations) {
    const ActivationRef* ref = find_ref(op);
    ASSERT_NE(ref, nullptr) << op_name(op) << " has no float64 reference here";
    check_unary<float>(op, *ref, 2e-6);
    check_unary<double>(op, *ref, 1e-14);
  }
}

TEST(Activation, FiniteDifferencesDouble) {
  const int64_t n = 41;
  auto x = random_uniform_vec<double>(n, 5, -4.0, 4.0);
  auto dy = random_uniform_vec<double>(n, 6);
  std::vector<double> dx(n);
  for (Op op : kActivations) {
    cpu::activation_backward<double>(op, n, x.data(), dy.data(), dx.data());
    auto g =
        fd_grad([&](const auto& in,
                    auto& out) { cpu::activation_forward<double>(op, n, in.data(), out.data()); },
                x, dy);
    EXPECT_TRUE(all_close(dx, g, 1e-8, 1e-6)) << op_name(op);
  }
}

template <typename T>
void check_swiglu(double tol) {
  for (int64_t n : {int64_t(1), int64_t(33), int64_t(40000)}) {
    auto gate = random_uniform_vec<T>(n, 1 + n, -10.0, 10.0);
    auto up = random_uniform_vec<T>(n, 2 + n, -2.0, 2.0);
    auto dout = random_uniform_vec<T>(n, 3 + n);
    std::vector<T> out(n), dgate(n), dup(n);
    cpu::swiglu_forward<T>(n, gate.data(), up.data(), out.data());
    cpu::swiglu_backward<T>(n, gate.data(), up.data(), dout.data(), dgate.data(), dup.data());
    std::vector<double> out_r(n), dgate_r(n), dup_r(n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i], u = up[i], d = dout[i], s = 1.0 / (1.0 + std::exp(-g));
      out_r[i] = g * s * u;
      dgate_r[i] = d * u * s * (1 + g * (1 - s));
      dup_r[i] = d * g * s;
    }
    EXPECT_TRUE(all_close(out, out_r, tol, tol));
    EXPECT_TRUE(all_close(dgate, dgate_r, tol, tol));
    EXPECT_TRUE(all_close(dup, dup_r, tol, tol));
  }
}

TEST(Activation, SwiGlu) {
  check_swiglu<float>(3e-6);
  check_swiglu<double>(1e-14);
}

TEST(Activation, SwiGluFiniteDifferencesDouble) {
  const int64_t n = 29;
  auto gate = random_uniform_vec<double>(n, 7, -4.0, 4.0);
  auto up = random_uniform_vec<double>(n, 8, -2.0, 2.0);
  auto dout = random_uniform_vec<double>(n, 9);
  std::vector<double> dgate(n), dup(n);
  cpu::swiglu_backward<double>(n, gate.data(), up.data(), dout.data(), dgate.data(), dup.data());
  auto g_gate =
      fd_grad([&](const auto& in,
                  auto& out) { cpu::swiglu_forward<double>(n, in.data(), up.data(), out.data()); },
              gate, dout);
  auto g_up = fd_grad(
      [&](const auto& in, auto& out) {
        cpu::swiglu_forward<double>(n, gate.data(), in.data(), out.data());
      },
      up, dout);
  EXPECT_TRUE(all_close(dgate, g_gate, 1e-8, 1e-6));
  EXPECT_TRUE(all_close(dup, g_up, 1e-8, 1e-6));
}

TEST(Activation, ExpFastMatchesExp) {
  // A fine grid over [-87, 88]: relative error below 2 ulp; then the special values.
  std::vector<float> xs;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) xs.push_back(x);
  double worst = 0;
  for (float x : xs) {
    const double r = std::exp(double(x));
    worst = std::max(worst, std::abs(double(cpu::detail::exp_fast(x)) - r) / r);
  }
  EXPECT_LT(worst, 2.4e-7);
  EXPECT_EQ(cpu::detail::exp_fast(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(cpu::detail::exp_fast(-200.0f), 0.0f);
  EXPECT_EQ(cpu::detail::exp_fast(0.0f), 1.0f);
  EXPECT_EQ(cpu::detail::exp_fast(200.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(cpu::detail::exp_fast(std::nanf(""))));
}

#if KILN_CPU_X86
KILN_TARGET_AVX512 void exp_fast16_at(const float* x, float* y) {
  _mm512_storeu_ps(y, cpu::detail::exp_fast16(_mm512_loadu_ps(x)));
}

// exp_fast16 (the 16-lane exp of the AVX-512 kernels): the same grid and special values.
TEST(Activation, ExpFast16MatchesExp) {
  if (cpu::cpu_isa_detected() < cpu::CpuIsa::Avx512) GTEST_SKIP() << "no AVX-512 here";
  std::vector<float> xs;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {-std::numeric_limits<float>::infinity(), -200.0f, -103.5f, 0.0f, 88.8f, 200.0f,
                  std::numeric_limits<float>::infinity(), std::nanf("")})
    xs.push_back(x);
  while (xs.size() % 16) xs.push_back(0.0f);
  std::vector<float> ys(xs.size());
  for (size_t i = 0; i < xs.size(); i += 16) exp_fast16_at(xs.data() + i, ys.data() + i);
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double r = std::exp(double(xs[i]));
    if (std::isnan(xs[i]))
      EXPECT_TRUE(std::isnan(ys[i]));
    else if (r < 1e-38)  // 0, or a subnormal at most
      EXPECT_LT(std::abs(ys[i]), 1e-38f) << xs[i];
    else if (r > 3.5e38)
      EXPECT_EQ(ys[i], std::numeric_limits<float>::infinity()) << xs[i];
    else
      worst = std::max(worst, std::abs(double(ys[i]) - r) / r);
  }
  EXPECT_LT(worst, 2.4e-7);
}
#endif

// bf16 SwiGLU forward at every ISA level this machine has (AVX-512 from avx512 up, f32 blocks
// below), against float64 on the same bf16 values: one rounding to bf16 (2^-9 relative) over
// f32 math: 2^-8. Lengths cover the 16-lane tails and several threads' chunks; gates reach
// +-100 (sigmoid saturated both ways).
TEST(Activation, SwiGluBf16AtEveryIsa) {
  for (int64_t n : {int64_t(7), int64_t(33), int64_t(70001)}) {
    const auto gd = random_uniform_vec<double>(n, 11 + n, -12.0, 12.0);
    const auto ud = random_uniform_vec<double>(n, 12 + n, -2.0, 2.0);
    std::vector<bf16> gate(n), up(n);
    for (int64_t i = 0; i < n; ++i) {
      gate[i] = float_to_bf16(float(i % 97 == 3 ? (i % 2 ? 100.0 : -100.0) : gd[i]));
      up[i] = float_to_bf16(float(ud[i]));
    }
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = bf16_to_float(gate[i]), u = bf16_to_float(up[i]);
      ref[i] = g / (1.0 + std::exp(-g)) * u;
    }
    for (cpu::CpuIsa level : test::supported_levels()) {
      cpu::ScopedCpuIsa cap(level);
      std::vector<bf16> out(n, float_to_bf16(7.0f));
      cpu::swiglu_forward<bf16>(n, gate.data(), up.data(), out.data());
      std::vector<double> got(n);
      for (int64_t i = 0; i < n; ++i) got[i] = bf16_to_float(out[i]);
      EXPECT_TRUE(all_close(got, ref, 1.0 / 256, 1.0 / 256))
          << "n=" << n << " isa " << cpu::cpu_isa_name(level);
    }
  }
}

}  // namespace
}  // namespace kiln
