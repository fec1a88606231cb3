// The CUDA loss family (kernels/cuda/cross_entropy.cu, optimizer.cu, tensor/kernels_cuda_loss.cpp)
// against the CPU ops from the same inputs: cross-entropy forward and backward (f32, bf16;
// V = 7, 1000, 32000, 151936; ignored rows; row-strided logits; in place; bad targets), AdamW
// single and multi-tensor (mixed f32 and bf16/f16-with-master items, odd sizes, misaligned
// views), SGD, and the multi-tensor sum of squares (nn::AdamW and clip_grad_norm on CUDA are in
// tests/nn/test_optim_multi.cpp). Without a GPU these skip with a message; the host-side part
// (the bad-target code) runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace kiln {
namespace {

#undef KILN_REQUIRE_GPU  // each file skips with its own message (unity batches share macros)
#define KILN_REQUIRE_GPU()                                                   \
  do {                                                                       \
    if (cuda::device_count() == 0)                                           \
      GTEST_SKIP() << "no CUDA device: the CUDA loss/optimizer kernels are " \
                      "not checked";                                         \
  } while (0)

constexpr std::int32_t kIgnore = -100;

// ---- host side (no GPU needed) ------------------------------------------------------------------

TEST(CudaLossHost, BadTargetCodeRoundTrip) {
  EXPECT_FALSE(cuda::decode_bad_target(cuda::kNoBadTarget).has_value());
  for (auto [row, target] : {std::pair<std::int64_t, std::int32_t>{0, 0},
                             {17, 40000},
                             {5, -3},
                             {2147483647, -2147483647 - 1},
                             {123456, 2147483647}}) {
    const std::uint64_t code = cuda::encode_bad_target(row, target);
    EXPECT_NE(code, cuda::kNoBadTarget);
    auto bad = cuda::decode_bad_target(code);
    ASSERT_TRUE(bad.has_value());
    EXPECT_EQ(bad->row, row);
    EXPECT_EQ(bad->target, target);
  }
}

// The device keeps the atomicMin of the codes: the smallest row must win whatever the targets.
TEST(CudaLossHost, BadTargetCodeOrdersByRow) {
  EXPECT_LT(cuda::encode_bad_target(3, -1), cuda::encode_bad_target(4, 0));
  EXPECT_LT(cuda::encode_bad_target(0, 2147483647), cuda::encode_bad_target(1, -5));
  EXPECT_LT(cuda::encode_bad_target(2147483646, -1), cuda::kNoBadTarget);
  EXPECT_EQ(cuda::encode_bad_target(1, 0), std::uint64_t{1} << 32);
}

// ---- helpers ------------------------------------------------------------------------------------

const Device kCuda0 = Device::cuda(0);

Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

// |got - want| <= abs + rel * |want| everywhere, no NaN/Inf unless want has it at that spot.
void expect_close(const Tensor& got, const Tensor& want, double rel, double abs,
                  const std::string& what) {
  auto g = host(got).to_double_vector(), w = host(want).to_double_vector();
  ASSERT_EQ(g.size(), w.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const bool ok =
        std::isnan(w[i]) ? std::isnan(g[i]) : std::abs(g[i] - w[i]) <= abs + rel * std::abs(w[i]);
    if (!ok && ++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: " << g[i] << " vs " << w[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

Tensor rand_t(const Shape& s, std::uint64_t seed, double lo, double hi, DType dt = DType::F32) {
  Generator g(seed);
  return ops::rand_uniform(s, g, lo, hi, DType::F32).to(dt);
}

Tensor targets_for(std::int64_t N, std::int64_t V, std::uint64_t seed) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(N));
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < t.size(); ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    t[i] = static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(V));
  }
  t[0] = static_cast<std::int32_t>(V - 1);  // the last column is a target too
  if (N > 2) t[2] = kIgnore;
  if (N > 1) t.back() = kIgnore;
  return ops::from_vector(t, {N});
}

// dlogits: per element |got - want| <= rel |want| + 1e-5 |dloss[n]| [v == t_n]: softmax values
// carry a relative error (exp2f vs the CPU's exp, lse one f32 ulp apart), and at the target p - 1
// cancels, so there the error is relative to dloss, not to the result.
void expect_dlogits_close(const Tensor& got, const Tensor& want, const Tensor& dloss,
                          const Tensor& targets, double rel, const std::string& what) {
  auto g = host(got).to_double_vector(), w = host(want).to_double_vector();
  auto dl = host(dloss).to_double_vector();
  auto t = host(targets).to_double_vector();
  const std::size_t N = t.size(), V = g.size() / N;
  ASSERT_EQ(g.size(), w.size()) << what;
  int bad = 0;
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t v = 0; v < V; ++v) {
      const std::size_t i = n * V + v;
      const double tol =
          rel * std::abs(w[i]) + (static_cast<double>(v) == t[n] ? 1e-5 * std::abs(dl[n]) : 0.0);
      if (!(std::abs(g[i] - w[i]) <= tol) && ++bad <= 5)
        ADD_FAILURE() << what << "[" << n << ", " << v << "]: " << g[i] << " vs " << w[i];
    }
  EXPECT_EQ(bad, 0) << what;
}

// ---- cross-entropy ------------------------------------------------------------------------------

struct CeShape {
  std::int64_t N, V;
};

class CudaCrossEntropy : public ::testing::TestWithParam<std::tuple<CeShape, DType>> {};

TEST_P(CudaCrossEntropy, MatchesCpu) {
  KILN_REQUIRE_GPU();
  (void)cuda::cross_entropy_take_bad_target();  // no stale flag from another test
  const auto [shape, dt] = GetParam();
  const std::int64_t N = shape.N, V = shape.V;
  const double tol = 2e-5;  // f32 math on both sides, from identical (bf16-rounded) inputs
  // Logits with a per-row offset (rows up to +-40) so the max subtraction matters.
  Tensor x = rand_t({N, V}, 1, -4, 4);
  Tensor offs = rand_t({N, 1}, 2, -40, 40);
  x = ops::binary(ops::Binary::Add, x, offs).to(dt);
  Tensor t = targets_for(N, V, 3);
  Tensor dloss = rand_t({N}, 4, 0.5, 2.0);
  Tensor xg = x.to(kCuda0), tg = t.to(kCuda0), dlg = dloss.to(kCuda0);

  auto [loss_c, lse_c] = ops::cross_entropy(x, t, kIgnore);
  auto [loss_g, lse_g] = ops::cross_entropy(xg, tg, kIgnore);
  ASSERT_EQ(loss_g.dtype(), DType::F32);
  expect_close(loss_g, loss_c, tol, tol, "loss");
  expect_close(lse_g, lse_c, tol, tol, "lse");
  auto lv = host(loss_g).to_double_vector();
  if (N > 1) EXPECT_EQ(lv.back(), 0.0);  // ignored rows
  if (N > 2) EXPECT_EQ(lv[2], 0.0);

  Tensor d_c = ops::cross_entropy_backward(x, lse_c, t, dloss, kIgnore);
  Tensor d_g = ops::cross_entropy_backward(xg, lse_g, tg, dlg, kIgnore, false);
  ASSERT_EQ(d_g.dtype(), dt);
  // f32: softmax values from exp2f vs the CPU's exp; bf16: both round an f32 value once, and values
  // that differ in the last f32 bits may land one bf16 ulp (2^-8 relative) apart.
  const double drel = dt == DType::F32 ? 1e-5 : 8e-3;
  expect_dlogits_close(d_g, d_c, dloss, t, drel, "dlogits");
  auto dv = host(d_g).to_double_vector();
  if (N > 1)
    for (std::int64_t v = 0; v < V; ++v)
      ASSERT_EQ(dv[static_cast<std::size_t>((N - 1) * V + v)], 0.0) << "ignored row, col " << v;

  // In place over a fresh copy of the logits: the same bits as out of place.
  Tensor xg2 = x.to(kCuda0);
  Tensor d_ip = ops::cross_entropy_backward(xg2, lse_g, tg, dlg, kIgnore, true);
  EXPECT_EQ(d_ip.raw_data(), xg2.raw_data()) << "in place did not reuse the logits";
  expect_close(d_ip, d_g, 0, 0, "in place");

  // Row-strided logits (a narrowed view: row stride V + 5, first column 2).
  Tensor wide = rand_t({N, V + 5}, 5, -6, 6, dt);
  Tensor xs = wide.narrow(1, 2, V), xsg = wide.to(kCuda0).narrow(1, 2, V);
  auto [ls_c, lses_c] = ops::cross_entropy(xs, t, kIgnore);
  auto [ls_g, lses_g] = ops::cross_entropy(xsg, tg, kIgnore);
  expect_close(ls_g, ls_c, tol, tol, "strided loss");
  Tensor ds_c = ops::cross_entropy_backward(xs, lses_c, t, dloss, kIgnore);
  Tensor ds_g = ops::cross_entropy_backward(xsg, lses_g, tg, dlg, kIgnore);
  expect_dlogits_close(ds_g, ds_c, dloss, t, drel, "strided dlogits");
  EXPECT_EQ(cuda::cross_entropy_take_bad_target(), cuda::kNoBadTarget);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaCrossEntropy,
                         ::testing::Combine(::testing::Values(CeShape{13, 7}, CeShape{9, 1000},
                                                              CeShape{6, 32000}, CeShape{3, 151936},
                                                              CeShape{1, 33}),
                                            ::testing::Values(DType::F32, DType::BF16)));

// A broadcast upstream gradient (stride 0), as a mean's backward would give.
TEST(CudaCrossEntropyExtra, BroadcastDloss) {
  KILN_REQUIRE_GPU();
  const std::int64_t N = 5, V = 301;
  Tensor x = rand_t({N, V}, 11, -3, 3), t = targets_for(N, V, 12);
  auto [loss_c, lse_c] = ops::cross_entropy(x, t, kIgnore);
  Tensor g1 = ops::full({1}, 0.25);
  Tensor d_c = ops::cross_entropy_backward(x, lse_c, t, g1.expand({N}), kIgnore);
  Tensor xg = x.to(kCuda0);
  auto [loss_g, lse_g] = ops::cross_entropy(xg, t.to(kCuda0), kIgnore);
  Tensor d_g =
      ops::cross_entropy_backward(xg, lse_g, t.to(kCuda0), g1.to(kCuda0).expand({N}), kIgnore);
  expect_dlogits_close(d_g, d_c, ops::full({N}, 0.25), t, 1e-5, "dlogits");
}

// Out-of-range targets: the forward marks the row with a NaN loss, the next backward throws the
// CPU's message (smallest bad row) before writing, and the flag is then clear.
TEST(CudaCrossEntropyExtra, BadTargetsFailLoudly) {
  KILN_REQUIRE_GPU();
  (void)cuda::cross_entropy_take_bad_target();
  const std::int64_t N = 6, V = 50;
  Tensor x = rand_t({N, V}, 21, -2, 2);
  std::vector<std::int32_t> tv = {1, 2, 3, 4, 5, 6};
  tv[4] = static_cast<std::int32_t>(V + 5);
  tv[1] = -7;
  Tensor t = ops::from_vector(tv, {N});
  EXPECT_THROW(ops::cross_entropy(x, t, kIgnore),
               Error);  // the CPU refuses outright
  Tensor xg = x.to(kCuda0), tg = t.to(kCuda0);
  auto [loss, lse] = ops::cross_entropy(xg, tg, kIgnore);
  auto lv = host(loss).to_double_vector();
  EXPECT_TRUE(std::isnan(lv[1]));
  EXPECT_TRUE(std::isnan(lv[4]));
  EXPECT_TRUE(std::isfinite(lv[0]) && std::isfinite(lv[5]));
  Tensor before = host(xg);
  Tensor dl = ops::full({N}, 1.0, DType::F32, kCuda0);
  try {
    (void)ops::cross_entropy_backward(xg, lse, tg, dl, kIgnore, true);
    ADD_FAILURE() << "backward with bad targets did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[cross_entropy] target -7 out of range [0, 50) at row 1"),
              std::string::npos)
        << e.what();
  }
  expect_close(xg, before, 0, 0, "logits untouched by the failed in-place backward");
  EXPECT_EQ(cuda::cross_entropy_take_bad_target(), cuda::kNoBadTarget);
  // A good batch works again.
  Tensor good = targets_for(N, V, 22);
  auto [l2, lse2] = ops::cross_entropy(xg, good.to(kCuda0), kIgnore);
  EXPECT_NO_THROW(ops::cross_entropy_backward(xg, lse2, good.to(kCuda0), dl, kIgnore));
  // The backward kernel itself also flags (NaN gradient row) when handed bad targets directly.
  Tensor d = ops::cross_entropy_backward(xg, lse2, tg, dl, kIgnore);
  EXPECT_TRUE(std::isnan(host(d).to_double_vector()[static_cast<std::size_t>(1 * V)]));
  auto bad = cuda::decode_bad_target(cuda::cross_entropy_take_bad_target());
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->row, 1);
  EXPECT_EQ(bad->target, -7);
}

// ---- optimizers ---------------------------------------------------------------------------------

// 4 f32 ulps: the kernels do the CPU's operations in the CPU's order with explicit rounding, so
// they should agree bit for bit; the slack covers a CPU build with FMA contraction (-march).
constexpr double kOptRel = 5e-7;

TEST(CudaOptim, AdamWSingleMatchesCpu) {
  KILN_REQUIRE_GPU();
  for (std::int64_t n : {1, 7, 16385, 40001}) {
    SCOPED_TRACE(n);
    Tensor p = rand_t({n}, 31, -1, 1), m = ops::zeros({n}), v = ops::zeros({n});
    Tensor pg = p.to(kCuda0), mg = m.to(kCuda0), vg = v.to(kCuda0);
    for (int step = 1; step <= 3; ++step) {
      Tensor g = rand_t({n}, 40 + static_cast<std::uint64_t>(step), -2, 2);
      ops::adamw_step_(p, g, m, v, 1e-2, 0.9, 0.95, 1e-8, 0.1, step);
      Tensor gg = g.to(kCuda0);
      ops::adamw_step_(pg, gg, mg, vg, 1e-2, 0.9, 0.95, 1e-8, 0.1, step);
    }
    expect_close(pg, p, kOptRel, 1e-30, "param");
    expect_close(mg, m, kOptRel, 1e-30, "m");
    expect_close(vg, v, kOptRel, 1e-30, "v");
  }
}

struct OptItem {
  Tensor param, master, m, v;
  DType grad_dt;
  double wd;
};

// Mixed items on one device: f32 (odd sizes, one misaligned view), bf16 and f16 with masters, grads
// in the param's dtype or f32.
std::vector<OptItem> make_items(Device d) {
  std::vector<OptItem> items;
  auto add = [&](std::int64_t n, DType dt, DType gdt, double wd, std::uint64_t seed,
                 std::int64_t offset) {
    Tensor w = rand_t({n + offset}, seed, -1, 1).to(d).narrow(0, offset, n);  // offset: misaligned
    OptItem it;
    it.master = dt == DType::F32 ? Tensor() : w;
    it.param = dt == DType::F32 ? w : w.to(dt);
    it.m = ops::zeros({n + offset}, DType::F32, d).narrow(0, offset, n);
    it.v = ops::zeros({n + offset}, DType::F32, d).narrow(0, offset, n);
    it.grad_dt = gdt;
    it.wd = wd;
    items.push_back(it);
  };
  add(7, DType::F32, DType::F32, 0.1, 51, 0);
  add(16385, DType::F32, DType::F32, 0.0, 52, 0);
  add(99, DType::F32, DType::F32, 0.1, 53, 1);
  add(40001, DType::BF16, DType::BF16, 0.1, 54, 0);
  add(33, DType::BF16, DType::F32, 0.0, 55, 0);
  add(1029, DType::BF16, DType::BF16, 0.1, 56, 3);
  add(5, DType::F16, DType::F16, 0.1, 57, 0);
  add(70000, DType::F16, DType::F32, 0.05, 58, 0);
  return items;
}

TEST(CudaOptim, AdamWMultiMatchesCpuFallback) {
  KILN_REQUIRE_GPU();
  auto cpu_items = make_items(Device::cpu()), gpu_items = make_items(kCuda0);
  for (int step = 1; step <= 3; ++step) {
    std::vector<ops::AdamWTensors> a, b;
    for (std::size_t i = 0; i < cpu_items.size(); ++i) {
      const OptItem& c = cpu_items[i];
      const OptItem& g = gpu_items[i];
      Tensor grad = rand_t(c.param.shape(), 100 + 10 * step + i, -2, 2, c.grad_dt);
      a.push_back({c.param, grad, c.master, c.m, c.v, c.wd});
      b.push_back({g.param, grad.to(kCuda0), g.master, g.m, g.v, g.wd});
    }
    ops::adamw_multi_step_(a, 3e-3, 0.9, 0.999, 1e-8, step);
    ops::adamw_multi_step_(b, 3e-3, 0.9, 0.999, 1e-8, step);
  }
  for (std::size_t i = 0; i < cpu_items.size(); ++i) {
    SCOPED_TRACE(i);
    const OptItem &c = cpu_items[i], &g = gpu_items[i];
    // Low-precision params: the rounded masters may straddle a rounding boundary only if the
    // masters differ, which kOptRel allows; a bf16 ulp is 2^-8.
    const double prel = c.param.dtype() == DType::F32 ? kOptRel : 4e-3;
    expect_close(g.param, c.param, prel, 1e-30, "param");
    if (c.master.defined()) expect_close(g.master, c.master, kOptRel, 1e-30, "master");
    expect_close(g.m, c.m, kOptRel, 1e-30, "m");
    expect_close(g.v, c.v, kOptRel, 1e-30, "v");
  }
}

TEST(CudaOptim, SgdMatchesCpu) {
  KILN_REQUIRE_GPU();
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (const Case& k : {Case{0.9, 0.0, 0.05, false}, Case{0.9, 0.0, 0.05, true},
                        Case{0.8, 0.25, 0.0, false}, Case{0.0, 0.0, 0.1, false}}) {
    const std::int64_t n = 16387;
    Tensor p = rand_t({n}, 61, -1, 1), buf = ops::zeros({n});
    Tensor pg = p.to(kCuda0), bufg = buf.to(kCuda0);
    Tensor none;
    Tensor& bc = k.momentum != 0 ? buf : none;
    Tensor& bg = k.momentum != 0 ? bufg : none;
    for (int step = 1; step <= 3; ++step) {
      Tensor g = rand_t({n}, 70 + static_cast<std::uint64_t>(step), -2, 2);
      Tensor gg = g.to(kCuda0);
      ops::sgd_step_(p, g, bc, 0.05, k.momentum, k.dampening, k.wd, k.nesterov, step);
      ops::sgd_step_(pg, gg, bg, 0.05, k.momentum, k.dampening, k.wd, k.nesterov, step);
    }
    expect_close(pg, p, kOptRel, 1e-30, "sgd param");
    if (k.momentum != 0) expect_close(bufg, buf, kOptRel, 1e-30, "sgd buf");
  }
}

TEST(CudaOptim, SumSquaresMultiMatchesCpu) {
  KILN_REQUIRE_GPU();
  std::vector<Tensor> cpu = {rand_t({7}, 81, -1, 1),
                             rand_t({40001}, 82, -1, 1, DType::BF16),
                             rand_t({129}, 83, -3, 3, DType::F16),
                             rand_t({33, 17}, 84, -1, 1).transpose(0, 1),  // not contiguous
                             Tensor(),
                             rand_t({0}, 85, 0, 1)};
  double want = 0;
  std::vector<Tensor> gpu;
  for (const Tensor& t : cpu) {
    gpu.push_back(t.defined() ? t.to(kCuda0) : Tensor());
    if (t.defined()) want += ops::sum_squares(t);
  }
  const double got = ops::sum_squares_multi(gpu);
  EXPECT_NEAR(got, want, 1e-5 * want);
  // Deterministic: the same bits every time.
  EXPECT_EQ(ops::sum_squares_multi(gpu), got);
  EXPECT_EQ(ops::sum_squares_multi(std::vector<Tensor>{}), 0.0);
}

}  // namespace
}  // namespace kiln
