// The multi-tensor optimizer path, on the CPU:
//  - the launch planner of the CUDA multi-tensor kernels (kernels/common/multi_tensor_plan.h):
//    chunk boundaries, launch splits, and every element covered exactly once;
//  - the host half of the CUDA AdamW (kernels/cuda/optimizer.h: the per-step scalars) against
//    the CPU kernel, bit for bit;
//  - nn::AdamW with a mix of f32 and bf16 (master) parameters, and ops::adamw_multi_step_'s CPU
//    fallback, against per-parameter adamw_step_ (bit for bit) and a hand-computed step;
//  - AdamW on meta (the CUDA path's dry run) allocates no f32 gradient copies;
//  - clip_grad_norm on the CPU;
//  - with a GPU only: nn::AdamW and clip_grad_norm on CUDA parameters against the CPU.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/multi_tensor_plan.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/cuda/runtime.h"
#include "nn/optim.h"
#include "tensor/memory.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln::nn {
namespace {

using mt::Launch;
using mt::Slot;

using test::random_uniform_vec;

void expect_slot(const Slot& s, int tensor, std::int64_t first, std::int64_t count) {
  EXPECT_EQ(s.tensor, tensor);
  EXPECT_EQ(s.first, first);
  EXPECT_EQ(s.count, count);
}

// ---- planner ------------------------------------------------------------------------------------

TEST(MultiTensorPlan, OneLaunchWithRealLimits) {
  const std::vector<std::int64_t> numels = {5, 0, 40000, 16384, 1};
  const auto plan = mt::plan(numels, 16384, 512, INT_MAX);
  ASSERT_EQ(plan.size(), 1u);
  const Launch& l = plan[0];
  ASSERT_EQ(l.slots.size(), 4u);  // the empty tensor gets no slot
  expect_slot(l.slots[0], 0, 0, 5);
  expect_slot(l.slots[1], 2, 0, 40000);
  expect_slot(l.slots[2], 3, 0, 16384);
  expect_slot(l.slots[3], 4, 0, 1);
  EXPECT_EQ(l.chunk_start, (std::vector<std::int64_t>{0, 1, 4, 5, 6}));
  EXPECT_EQ(l.chunks(), 6);
}

TEST(MultiTensorPlan, SplitsBySlotsAndChunks) {
  // chunk 4, at most 3 slots and 5 chunks per launch.
  const std::vector<std::int64_t> numels = {10, 3, 0, 9, 1};
  const auto plan = mt::plan(numels, 4, 3, 5);
  ASSERT_EQ(plan.size(), 2u);
  // Launch 0: t0 (3 chunks), t1 (1 chunk), then only 1 chunk of room: t3's first 4 elements.
  ASSERT_EQ(plan[0].slots.size(), 3u);
  expect_slot(plan[0].slots[0], 0, 0, 10);
  expect_slot(plan[0].slots[1], 1, 0, 3);
  expect_slot(plan[0].slots[2], 3, 0, 4);
  EXPECT_EQ(plan[0].chunk_start, (std::vector<std::int64_t>{0, 3, 4, 5}));
  // Launch 1: the rest of t3 (elements 4..8, 2 chunks), then t4.
  ASSERT_EQ(plan[1].slots.size(), 2u);
  expect_slot(plan[1].slots[0], 3, 4, 5);
  expect_slot(plan[1].slots[1], 4, 0, 1);
  EXPECT_EQ(plan[1].chunk_start, (std::vector<std::int64_t>{0, 2, 3}));
}

TEST(MultiTensorPlan, SlotLimitOpensLaunches) {
  const std::vector<std::int64_t> numels(7, 3);
  const auto plan = mt::plan(numels, 8, 2, 1000);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[3].slots.size(), 1u);
  expect_slot(plan[3].slots[0], 6, 0, 3);
  EXPECT_EQ(plan[1].chunk_start, (std::vector<std::int64_t>{0, 1, 2}));
}

TEST(MultiTensorPlan, EmptyAndBadInputs) {
  EXPECT_TRUE(mt::plan(std::vector<std::int64_t>{}, 4, 3, 5).empty());
  EXPECT_TRUE(mt::plan(std::vector<std::int64_t>{0, 0}, 4, 3, 5).empty());
  EXPECT_THROW(mt::plan(std::vector<std::int64_t>{-1}, 4, 3, 5), Error);
  EXPECT_THROW(mt::plan(std::vector<std::int64_t>{1}, 0, 3, 5), Error);
  EXPECT_THROW(mt::plan(std::vector<std::int64_t>{1}, 4, 0, 5), Error);
}

TEST(MultiTensorPlan, FindSlot) {
  const std::int32_t starts[] = {0, 1, 4, 5, 6};
  const int want[] = {0, 1, 1, 1, 2, 3};
  for (int c = 0; c < 6; ++c) EXPECT_EQ(mt::find_slot(starts, 4, c), want[c]) << c;
  const std::int64_t one[] = {0, 9};
  for (int c = 0; c < 9; ++c) EXPECT_EQ(mt::find_slot(one, 1, c), 0);
  // Equal starts (an empty slot) resolve to the slot that holds the chunk.
  const std::int32_t eq[] = {0, 2, 2, 3};
  EXPECT_EQ(mt::find_slot(eq, 3, 1), 0);
  EXPECT_EQ(mt::find_slot(eq, 3, 2), 2);
}

// Walks every block of every launch the way the kernels do and counts element visits.
TEST(MultiTensorPlan, EveryElementExactlyOnce) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int ntensors = static_cast<int>(rng() % 12);
    std::vector<std::int64_t> numels;
    for (int t = 0; t < ntensors; ++t) numels.push_back(static_cast<std::int64_t>(rng() % 60));
    const std::int64_t chunk = 1 + static_cast<std::int64_t>(rng() % 9);
    const int max_slots = 1 + static_cast<int>(rng() % 5);
    const std::int64_t max_chunks = 1 + static_cast<std::int64_t>(rng() % 12);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " chunk " << chunk << " slots "
                                      << max_slots << " chunks " << max_chunks);
    std::vector<std::vector<int>> seen;
    for (auto n : numels) seen.emplace_back(static_cast<std::size_t>(n), 0);
    std::int64_t blocks = 0;
    for (const Launch& l : mt::plan(numels, chunk, max_slots, max_chunks)) {
      const int ns = static_cast<int>(l.slots.size());
      ASSERT_GE(ns, 1);
      ASSERT_LE(ns, max_slots);
      ASSERT_LE(l.chunks(), max_chunks);
      ASSERT_EQ(l.chunk_start.size(), l.slots.size() + 1);
      for (const Slot& s : l.slots) {
        EXPECT_GT(s.count, 0);
        EXPECT_EQ(s.first % chunk,
                  0);  // pieces start on chunk boundaries (keeps alignment)
      }
      for (std::int64_t c = 0; c < l.chunks(); ++c, ++blocks) {
        const int s = mt::find_slot(l.chunk_start.data(), ns, c);
        const Slot& sl = l.slots[static_cast<std::size_t>(s)];
        const std::int64_t begin = (c - l.chunk_start[static_cast<std::size_t>(s)]) * chunk;
        const std::int64_t end = std::min(sl.count, begin + chunk);
        ASSERT_LT(begin, end) << "block " << c << " has no elements";
        for (std::int64_t i = begin; i < end; ++i)
          seen[static_cast<std::size_t>(sl.tensor)][static_cast<std::size_t>(sl.first + i)]++;
      }
    }
    std::int64_t want_blocks = 0;
    for (std::size_t t = 0; t < numels.size(); ++t) {
      want_blocks += mt::chunks_of(numels[t], chunk);
      for (std::size_t i = 0; i < seen[t].size(); ++i)
        ASSERT_EQ(seen[t][i], 1) << "tensor " << t << " element " << i;
    }
    EXPECT_EQ(blocks, want_blocks);  // no block is wasted by a split
  }
}

// ---- AdamW --------------------------------------------------------------------------------------

// The CUDA kernel's element arithmetic, run on the host with the host-computed scalars, gives
// exactly cpu::adamw_step's bits (so the scalars are computed as the CPU kernel does).
TEST(MultiTensorAdamW, HostScalarsMatchCpuKernel) {
  const std::int64_t n = 1003;
  for (std::int64_t step : {1, 2, 17}) {
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    auto p = random_uniform_vec(n, 1), g = random_uniform_vec(n, 2),
         m = random_uniform_vec(n, 3, 0, 0.1), v = random_uniform_vec(n, 4, 0, 0.01);
    auto p2 = p, m2 = m, v2 = v;
    cpu::adamw_step(n, p.data(), g.data(), m.data(), v.data(), lr, b1, b2, eps, wd, step);
    const cuda::AdamWConsts c = cuda::adamw_consts(lr, b1, b2, eps, step);
    const float decay = cuda::adamw_decay(lr, wd);
    // One rounding per operation (volatile stops any contraction into FMA), as on the GPU.
    auto mul = [](float a, float b) {
      volatile float r = a * b;
      return float(r);
    };
    auto add = [](float a, float b) {
      volatile float r = a + b;
      return float(r);
    };
    auto div = [](float a, float b) {
      volatile float r = a / b;
      return float(r);
    };
    for (std::int64_t i = 0; i < n; ++i) {
      const float pp = mul(p2[i], decay);
      const float mi = add(mul(m2[i], c.beta1), mul(c.one_m_b1, g[i]));
      const float vi = add(mul(v2[i], c.beta2), mul(mul(c.one_m_b2, g[i]), g[i]));
      const float denom = add(div(std::sqrt(vi), c.bc2_sqrt), c.eps);
      p2[i] = add(pp, div(mul(c.neg_step_size, mi), denom));
      m2[i] = mi;
      v2[i] = vi;
    }
    EXPECT_EQ(std::memcmp(p.data(), p2.data(), 4 * n), 0) << "step " << step;
    EXPECT_EQ(std::memcmp(m.data(), m2.data(), 4 * n), 0) << "step " << step;
    EXPECT_EQ(std::memcmp(v.data(), v2.data(), 4 * n), 0) << "step " << step;
  }
  EXPECT_THROW(cuda::adamw_consts(1e-3f, 0.9f, 0.999f, 1e-8f, 0), Error);
}

// One step by hand: p=1, g=0.5, lr=0.1, wd=0.01, b1=0.9, b2=0.999, step 1: p*(1-lr*wd) = 0.999; m =
// 0.05; v = 0.00025; step size lr/(1-b1) = 1; denom = sqrt(0.00025)/sqrt(0.001) + 1e-8 = 0.5 +
// 1e-8; p = 0.999 - 0.05/denom = 0.899.
TEST(MultiTensorAdamW, HandComputedStep) {
  Tensor w = ops::from_vector(std::vector<float>{1.0f, 1.0f}, {1, 2});
  w.set_requires_grad(true);
  AdamWOptions o;
  o.lr = 0.1, o.beta1 = 0.9, o.beta2 = 0.999, o.eps = 1e-8, o.weight_decay = 0.01;
  AdamW opt({{"w", w}}, o);
  w.set_grad(ops::from_vector(std::vector<float>{0.5f, -0.5f}, {1, 2}));
  opt.step();
  auto got = w.to_double_vector();
  EXPECT_NEAR(got[0], 0.899, 2e-7);
  EXPECT_NEAR(got[1], 0.999 + 0.1, 2e-7);
  // The moments carry the f32 roundings of 1 - b1 = 0.100000024 and 1 - b2 = 0.00099998713.
  const float omb1 = static_cast<float>(1.0 - double(0.9f)),
              omb2 = static_cast<float>(1.0 - double(0.999f));
  EXPECT_EQ(opt.state()[0].m.to_double_vector()[0], double(omb1 * 0.5f));
  EXPECT_EQ(opt.state()[0].v.to_double_vector()[0], double((omb2 * 0.5f) * 0.5f));
  EXPECT_NEAR(opt.state()[0].m.to_double_vector()[0], 0.05, 2e-8);
  EXPECT_NEAR(opt.state()[0].v.to_double_vector()[0], 0.00025, 5e-9);
}

struct Mixed {
  std::vector<std::pair<std::string, Tensor>> params;
  std::vector<std::vector<std::vector<float>>> grads;  // [step][param], f32 values
};

// f32 matrix, f32 vector, bf16 matrix (f32 master), bf16 vector, an odd-sized f32 tensor, and one
// parameter that never gets a gradient.
Mixed make_mixed(int steps) {
  Mixed mx;
  struct Spec {
    const char* name;
    Shape shape;
    DType dt;
  };
  const std::vector<Spec> specs = {{"w", {3, 5}, DType::F32},      {"b", {5}, DType::F32},
                                   {"wb", {4, 7}, DType::BF16},    {"nb", {7}, DType::BF16},
                                   {"odd", {1, 1031}, DType::F32}, {"frozen", {2, 2}, DType::F32}};
  std::uint64_t seed = 10;
  for (const Spec& s : specs) {
    Tensor t = ops::from_vector(random_uniform_vec(shape_numel(s.shape), seed++), s.shape).to(s.dt);
    t.set_requires_grad(true);
    mx.params.emplace_back(s.name, t);
  }
  for (int st = 0; st < steps; ++st) {
    std::vector<std::vector<float>> gs;
    for (const Spec& s : specs)
      gs.push_back(random_uniform_vec(shape_numel(s.shape), seed++, -2, 2));
    mx.grads.push_back(std::move(gs));
  }
  return mx;
}

void set_grads(Mixed& mx, int step) {
  for (std::size_t i = 0; i + 1 < mx.params.size(); ++i) {  // "frozen" keeps no gradient
    Tensor& p = mx.params[i].second;
    p.set_grad(
        ops::from_vector(mx.grads[static_cast<std::size_t>(step)][i], p.shape()).to(p.dtype()));
  }
}

std::vector<float> bits_of(const Tensor& t) { return t.to(DType::F32).to_float_vector(); }

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  auto x = bits_of(a), y = bits_of(b);
  ASSERT_EQ(x.size(), y.size()) << what;
  EXPECT_EQ(std::memcmp(x.data(), y.data(), 4 * x.size()), 0) << what;
}

// nn::AdamW (CPU path) == per-parameter adamw_step_ on f32 weights (masters for bf16), which is
// what AdamW::step did before the multi-tensor path existed.
TEST(MultiTensorAdamW, NnAdamWEqualsPerParameterSteps) {
  const int steps = 3;
  Mixed mx = make_mixed(steps);
  AdamWOptions o;
  o.lr = 2e-2, o.beta1 = 0.85, o.beta2 = 0.97, o.eps = 1e-6, o.weight_decay = 0.1;
  // Reference state: f32 weights and moments per parameter.
  struct Ref {
    Tensor w, m, v;
    bool decay;
  };
  std::vector<Ref> ref;
  for (auto& [name, p] : mx.params)
    ref.push_back(
        {p.to(DType::F32).clone(), ops::zeros(p.shape()), ops::zeros(p.shape()), p.dim() >= 2});
  AdamW opt(mx.params, o);
  for (int st = 0; st < steps; ++st) {
    set_grads(mx, st);
    opt.lr = o.lr * (1.0 + st);
    opt.step();
    for (std::size_t i = 0; i + 1 < ref.size(); ++i) {
      Tensor g = mx.params[i].second.grad().to(DType::F32);
      ops::adamw_step_(ref[i].w, g, ref[i].m, ref[i].v, opt.lr, o.beta1, o.beta2, o.eps,
                       ref[i].decay ? o.weight_decay : 0.0, st + 1);
    }
  }
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const auto& [name, p] = mx.params[i];
    const ParamState& s = opt.state()[i];
    expect_same_bits(s.weights(), ref[i].w, name + " weights");
    expect_same_bits(p, ref[i].w.to(p.dtype()), name + " param");
    expect_same_bits(s.m, ref[i].m, name + " m");
    expect_same_bits(s.v, ref[i].v, name + " v");
  }
  // The frozen parameter never moved.
  expect_same_bits(mx.params.back().second, ref.back().w, "frozen");
}

// ops::adamw_multi_step_'s CPU fallback (one call, mixed items, grads in the param's dtype) gives
// nn::AdamW's bits.
TEST(MultiTensorAdamW, MultiStepFallbackEqualsNnAdamW) {
  const int steps = 2;
  Mixed a = make_mixed(steps), b = make_mixed(steps);
  AdamWOptions o;
  o.lr = 1e-2, o.weight_decay = 0.05;
  AdamW opt(a.params, o);
  AdamW holder(b.params, o);  // only for its masters and zeroed moments
  for (int st = 0; st < steps; ++st) {
    set_grads(a, st);
    set_grads(b, st);
    opt.step();
    std::vector<ops::AdamWTensors> items;
    for (auto& s : holder.state()) {
      Tensor g = s.param.grad();
      if (!g.defined()) continue;
      items.push_back({s.param, g, s.master, s.m, s.v, s.decay ? o.weight_decay : 0.0});
    }
    ops::adamw_multi_step_(items, o.lr, o.beta1, o.beta2, o.eps, st + 1);
  }
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    expect_same_bits(a.params[i].second, b.params[i].second, a.params[i].first);
    expect_same_bits(opt.state()[i].weights(), holder.state()[i].weights(), a.params[i].first);
  }
}

// The Temporaries peak of one AdamW step on a bf16 parameter, on meta simulating `sim`.
std::int64_t meta_step_temporaries(DeviceType sim) {
  const DeviceType prev = meta_simulates();
  set_meta_simulates(sim);
  std::int64_t extra = -1;
  {
    Tensor w = ops::zeros({64, 64}, DType::BF16, Device::meta());
    w.set_requires_grad(true);
    AdamW opt({{"w", w}}, AdamWOptions{});
    w.set_grad(ops::zeros({64, 64}, DType::BF16, Device::meta()));
    MemoryTracker& tr = MemoryTracker::get(DeviceType::Meta);
    tr.reset_peaks();
    const std::int64_t before =
        tr.stats().current[static_cast<std::size_t>(MemCategory::Temporaries)];
    opt.step();
    extra = tr.stats().peak[static_cast<std::size_t>(MemCategory::Temporaries)] - before;
    EXPECT_EQ(opt.step_count, 1);
  }
  set_meta_simulates(prev);
  return extra;
}

// The dry run follows the kernel table of the backend it simulates: both CUDA's and the CPU's
// multi-tensor AdamW read bf16 gradients as they are (the CPU widens a chunk at a time on the
// stack), so neither allocates f32 copies.
TEST(MultiTensorAdamW, MetaStepChargesWhatTheSimulatedBackendAllocates) {
  EXPECT_EQ(meta_step_temporaries(DeviceType::CUDA), 0);
  EXPECT_EQ(meta_step_temporaries(DeviceType::CPU), 0);
}

TEST(MultiTensorAdamW, ClipGradNormCpu) {
  Tensor a = ops::from_vector(std::vector<float>{3.0f, 0.0f}, {2});
  Tensor b = ops::from_vector(std::vector<float>{0.0f, 4.0f, 0.0f}, {3}).to(DType::BF16);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  a.set_grad(ops::from_vector(std::vector<float>{3.0f, 0.0f}, {2}));
  b.set_grad(ops::from_vector(std::vector<float>{0.0f, 4.0f, 0.0f}, {3}).to(DType::BF16));
  EXPECT_DOUBLE_EQ(clip_grad_norm({a, b}, 10.0),
                   5.0);  // under the limit: unchanged
  EXPECT_EQ(a.grad().to_double_vector()[0], 3.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm({a, b}, 1.0), 5.0);
  EXPECT_NEAR(a.grad().to_double_vector()[0], 0.6, 1e-6);
  EXPECT_NEAR(b.grad().to_double_vector()[1], 0.8, 4e-3);  // bf16
}

// nn::AdamW and clip_grad_norm with CUDA parameters (the multi-tensor path, ops::
// sum_squares_multi) against the same parameters on the CPU. Skips without a GPU.
TEST(MultiTensorAdamW, CudaMatchesCpu) {
  if (cuda::device_count() == 0)
    GTEST_SKIP() << "no CUDA device: nn::AdamW / clip_grad_norm on CUDA are not checked";
  const Device gpu = Device::cuda(0);
  struct Spec {
    Shape shape;
    DType dt;
  };
  const std::vector<Spec> specs = {{{3, 5}, DType::F32},
                                   {{5}, DType::F32},
                                   {{64, 33}, DType::BF16},
                                   {{33}, DType::BF16},
                                   {{3, 20000}, DType::F32}};
  std::vector<std::pair<std::string, Tensor>> pc, pg;
  std::uint64_t seed = 90;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    Tensor t =
        ops::from_vector(random_uniform_vec(shape_numel(specs[i].shape), seed++), specs[i].shape)
            .to(specs[i].dt);
    Tensor a = t.clone(), b = t.to(gpu);
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    pc.emplace_back("p" + std::to_string(i), a);
    pg.emplace_back("p" + std::to_string(i), b);
  }
  AdamWOptions o;
  o.lr = 1e-2, o.weight_decay = 0.1;
  AdamW oc(pc, o), og(pg, o);
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> lc, lg;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      Tensor g = ops::from_vector(random_uniform_vec(shape_numel(specs[i].shape), seed++, -3, 3),
                                  specs[i].shape)
                     .to(specs[i].dt);
      pc[i].second.set_grad(g);
      pg[i].second.set_grad(g.to(gpu));
      lc.push_back(pc[i].second);
      lg.push_back(pg[i].second);
    }
    const double nc = clip_grad_norm(lc, 2.0), ng = clip_grad_norm(lg, 2.0);
    EXPECT_NEAR(ng, nc, 1e-6 * nc) << "step " << step;
    oc.step();
    og.step();
  }
  EXPECT_EQ(og.step_count, 3);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    // The clip scales agree to ~1e-7, so the weights agree to a few f32 ulps; bf16 params may
    // then round one bf16 ulp (2^-8) apart.
    const double prel = specs[i].dt == DType::F32 ? 1e-5 : 8e-3;
    auto close = [&](const Tensor& got, const Tensor& want, double rel, const std::string& what) {
      auto g = got.to(Device::cpu()).to_double_vector(), w = want.to_double_vector();
      ASSERT_EQ(g.size(), w.size()) << what;
      int bad = 0;
      for (std::size_t j = 0; j < g.size(); ++j)
        if (!(std::abs(g[j] - w[j]) <= 1e-7 + rel * std::abs(w[j])) && ++bad <= 5)
          ADD_FAILURE() << what << "[" << j << "]: " << g[j] << " vs " << w[j];
    };
    close(pg[i].second, pc[i].second, prel, pc[i].first);
    close(og.state()[i].weights(), oc.state()[i].weights(), 1e-5, pc[i].first + " weights");
    close(og.state()[i].m, oc.state()[i].m, 1e-5, pc[i].first + " m");
  }
}

}  // namespace
}  // namespace kiln::nn
