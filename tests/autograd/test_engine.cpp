// The backward engine: accumulation into .grad, no-grad mode, shared inputs, grad(), release of
// saved tensors during backward, and activation checkpointing (exact gradients, less memory).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"

namespace kiln {
namespace {

using V = std::vector<double>;
using ops::RopeStyle;
using ops::Unary;

Tensor randt(const Shape& shape, std::uint64_t seed, DType dtype = DType::F64, bool grad = true) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  V v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(g);
  Tensor t = ops::from_vector(v, shape, DType::F64);
  if (dtype != DType::F64) t = t.to(dtype);
  if (grad) t.set_requires_grad(true);
  return t;
}

std::int64_t cpu_bytes(MemCategory c) {
  return MemoryTracker::get(DeviceType::CPU).stats().current[static_cast<std::size_t>(c)];
}

TEST(Engine, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = randt({3, 4}, 1), w = randt({5, 4}, 2), b = randt({5}, 3);
  auto loss_fn = [&] { return ag::sum_all(ag::mul(ag::linear(x, w, b), ag::linear(x, w, b))); };
  backward(loss_fn());
  V gx1 = x.grad().to_double_vector(), gw1 = w.grad().to_double_vector(),
    gb1 = b.grad().to_double_vector();
  EXPECT_EQ(w.grad().storage()->category(), MemCategory::Gradients);
  EXPECT_EQ(x.grad().storage()->category(), MemCategory::Gradients);
  Tensor gw_handle = w.grad();
  backward(loss_fn());
  EXPECT_EQ(w.grad().impl(), gw_handle.impl());  // same buffer, accumulated in place
  V gx2 = x.grad().to_double_vector(), gw2 = w.grad().to_double_vector(),
    gb2 = b.grad().to_double_vector();
  for (std::size_t i = 0; i < gx1.size(); ++i) EXPECT_NEAR(gx2[i], 2 * gx1[i], 1e-12);
  for (std::size_t i = 0; i < gw1.size(); ++i) EXPECT_NEAR(gw2[i], 2 * gw1[i], 1e-12);
  for (std::size_t i = 0; i < gb1.size(); ++i) EXPECT_NEAR(gb2[i], 2 * gb1[i], 1e-12);
  // f32 path (direct GEMM accumulation into the weight's .grad).
  Tensor x32 = randt({3, 4}, 4, DType::F32), w32 = randt({5, 4}, 5, DType::F32);
  backward(ag::sum_all(ag::linear(x32, w32)));
  V g1 = w32.grad().to_double_vector();
  backward(ag::sum_all(ag::linear(x32, w32)));
  V g2 = w32.grad().to_double_vector();
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(g2[i], 2 * g1[i], 1e-5);
}

// The grad-ready hook (data parallelism's bucket trigger): once per leaf, only after every node
// that feeds the leaf's .grad has run, with the final gradient already there.
TEST(Engine, GradReadyHookFiresOncePerLeafWhenItsGradientIsFinal) {
  Tensor x = randt({3, 4}, 1), w = randt({5, 4}, 2), b = randt({5}, 3), unused = randt({2}, 4);
  // w feeds two linears (two nodes accumulate into w.grad); b one; x is a leaf too.
  auto loss_fn = [&] { return ag::sum_all(ag::mul(ag::linear(x, w, b), ag::linear(x, w))); };
  std::vector<std::pair<TensorImpl*, V>> seen;
  {
    GradReadyHookScope hook(
        [&](TensorImpl* leaf) { seen.emplace_back(leaf, Tensor(leaf->grad).to_double_vector()); });
    backward(loss_fn());
  }
  ASSERT_EQ(seen.size(), 3u);  // x, w, b; `unused` is in no graph
  for (const Tensor* t : {&x, &w, &b}) {
    int n = 0;
    for (const auto& [leaf, g] : seen)
      if (leaf == t->impl()) {
        ++n;
        EXPECT_EQ(g, t->grad().to_double_vector());  // final when reported
      }
    EXPECT_EQ(n, 1);
  }
  // Out of the scope, backward reports nothing.
  seen.clear();
  backward(loss_fn());
  EXPECT_TRUE(seen.empty());
  (void)unused;
}

TEST(Engine, NoGradGuardRecordsNothing) {
  Tensor x = randt({2, 3}, 6), w = randt({4, 3}, 7);
  {
    NoGradGuard ng;
    EXPECT_FALSE(grad_enabled());
    Tensor y = ag::silu(ag::linear(x, w));
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_FALSE(y.requires_grad());
    Tensor r = ag::reshape(ag::transpose(x, 0, 1), {-1});
    EXPECT_EQ(r.grad_fn(), nullptr);
    {
      EnableGradGuard eg;
      EXPECT_TRUE(grad_enabled());
      EXPECT_NE(ag::mul(x, x).grad_fn(), nullptr);
    }
    EXPECT_FALSE(grad_enabled());
    EXPECT_THROW(backward(ag::sum_all(y)), Error);  // nothing to differentiate
  }
  EXPECT_TRUE(grad_enabled());
  Tensor y = ag::mul(x, x);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "binary");
  // Inputs that do not require grad record nothing either.
  Tensor c = randt({2, 3}, 8, DType::F64, false);
  EXPECT_EQ(ag::unary(Unary::Exp, c).grad_fn(), nullptr);
}

TEST(Engine, DiamondGraphSumsGradients) {
  Tensor x = randt({5}, 9);
  auto xv = x.to_double_vector();
  // x used twice by one op.
  backward(ag::sum_all(ag::mul(x, x)));
  V g = x.grad().to_double_vector();
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(g[i], 2 * xv[i], 1e-14);
  x.impl()->grad.reset();
  // h = 3x feeds two branches that meet again: L = sum(h * exp(h) + h).
  Tensor h = ag::affine(x, 3.0);
  Tensor l = ag::sum_all(ag::add(ag::mul(h, ag::unary(Unary::Exp, h)), h));
  backward(l);
  g = x.grad().to_double_vector();
  for (int i = 0; i < 5; ++i) {
    double hv = 3 * xv[i];
    EXPECT_NEAR(g[i], 3 * (std::exp(hv) + hv * std::exp(hv) + 1), 1e-12);
  }
  // Two roots at once, with explicit upstream gradients.
  x.impl()->grad.reset();
  Tensor a = ag::affine(x, 2.0), b = ag::mul(x, x);
  Tensor ga = ops::full({5}, 0.5, DType::F64), gb = ops::ones({5}, DType::F64);
  backward({a, b}, {ga, gb});
  g = x.grad().to_double_vector();
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(g[i], 1.0 + 2 * xv[i], 1e-14);
  EXPECT_THROW(backward(b), Error);  // non-scalar root without a gradient
}

TEST(Engine, GradReturnsWithoutAccumulating) {
  Tensor x = randt({3}, 10), w = randt({3}, 11);
  Tensor l = ag::sum_all(ag::mul(ag::mul(x, x), w));
  auto gs = grad({l}, {Tensor()}, {x});
  ASSERT_EQ(gs.size(), 1u);
  auto xv = x.to_double_vector(), wv = w.to_double_vector(), gv = gs[0].to_double_vector();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(gv[i], 2 * xv[i] * wv[i], 1e-14);
  EXPECT_FALSE(x.grad().defined());
  ASSERT_TRUE(w.grad().defined());  // other leaves accumulate as usual
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w.grad().to_double_vector()[i], xv[i] * xv[i], 1e-14);
  Tensor nonleaf = ag::affine(x, 2.0);
  EXPECT_THROW(grad({ag::sum_all(nonleaf)}, {}, {nonleaf}), Error);
}

// Forward of a small MLP-ish graph under MemoryScope(Activations); returns only the loss, so
// every intermediate is held by the graph alone.
Tensor small_graph(const Tensor& x, const Tensor& w1, const Tensor& w2, const Tensor& n) {
  MemoryScope act(MemCategory::Activations);
  Tensor h = ag::rmsnorm(x, n, 1e-5);
  h = ag::silu(ag::linear(h, w1));
  h = ag::linear(h, w2);
  h = ag::softmax(ag::add(h, x));
  return ag::mean_all(ag::mul(h, h));
}

TEST(Engine, SavedTensorsReleasedDuringBackward) {
  Tensor x = randt({16, 32}, 12, DType::F32), w1 = randt({64, 32}, 13, DType::F32),
         w2 = randt({32, 64}, 14, DType::F32), n = randt({32}, 15, DType::F32);
  std::int64_t act0 = cpu_bytes(MemCategory::Activations);
  const std::int64_t tmp0 = cpu_bytes(MemCategory::Temporaries);
  Tensor loss = small_graph(x, w1, w2, n);
  std::int64_t act_fwd = cpu_bytes(MemCategory::Activations) - act0;
  // At least the saved (16, 64) hidden states are alive.
  EXPECT_GT(act_fwd, 3 * 16 * 64 * 4);
  backward(loss);
  std::int64_t act_after = cpu_bytes(MemCategory::Activations) - act0;
  // Only the 0-d loss itself (one 64-byte block) is left while `loss` is alive.
  EXPECT_LE(act_after, 64) << "forward " << act_fwd;
  // Backward's activation gradients and scratch are Temporaries, all freed when it returns.
  EXPECT_EQ(cpu_bytes(MemCategory::Temporaries), tmp0);
  EXPECT_TRUE(w1.grad().defined());
  loss = Tensor();
  EXPECT_EQ(cpu_bytes(MemCategory::Activations), act0);
  // The graph is consumed: a second backward through released nodes is not silently wrong.
}

TEST(Engine, BackwardPhaseAndTemporariesReturn) {
  Tensor x = randt({8, 16}, 16, DType::F32), w1 = randt({24, 16}, 17, DType::F32),
         w2 = randt({16, 24}, 18, DType::F32), n = randt({16}, 19, DType::F32);
  // Allocate the .grad buffers once so the second pass allocates no Gradients.
  backward(small_graph(x, w1, w2, n));
  std::int64_t tmp0 = cpu_bytes(MemCategory::Temporaries);
  std::int64_t grad0 = cpu_bytes(MemCategory::Gradients);
  auto& tr = MemoryTracker::get(DeviceType::CPU);
  tr.reset_peaks();
  backward(small_graph(x, w1, w2, n));
  EXPECT_EQ(cpu_bytes(MemCategory::Temporaries), tmp0);
  EXPECT_EQ(cpu_bytes(MemCategory::Gradients), grad0);
  auto s = tr.stats();
  EXPECT_GT(s.peak[static_cast<std::size_t>(MemCategory::Temporaries)], tmp0);
}

// The dry run: backward on meta tensors allocates exactly what the CPU run allocates.
TEST(Engine, MetaBackwardMatchesCpuAllocations) {
  auto run = [](Device d) {
    auto& tr = MemoryTracker::get(d.type);
    std::int64_t base = tr.stats().total;
    std::vector<std::int64_t> totals;
    {
      MemoryScope w(MemCategory::Weights);
      Tensor x = Tensor::empty({6, 10}, DType::F32, d), m = Tensor::empty({12, 10}, DType::F32, d);
      if (d.is_cpu()) {
        ops::fill_(x, 0.5);
        ops::fill_(m, 0.25);
      }
      x.set_requires_grad(true);
      m.set_requires_grad(true);
      Tensor loss;
      {
        MemoryScope act(MemCategory::Activations);
        Tensor h = ag::softmax(ag::linear(x, m));
        loss = ag::add(ag::mean_all(ag::mul(h, h)), ag::sum_all(ag::mean(h, 0)));
      }
      totals.push_back(tr.stats().total - base);
      backward(loss);
      totals.push_back(tr.stats().total - base);
      EXPECT_EQ(x.grad().device(), d);
    }
    totals.push_back(tr.stats().total - base);
    return totals;
  };
  auto cpu = run(Device::cpu());
  auto meta = run(Device::meta());
  EXPECT_EQ(cpu, meta);
  EXPECT_EQ(meta.back(), 0);
}

// ---- checkpointing --------------------------------------------------------------------------

struct Block {
  Tensor w1, w2, n;
  Tensor operator()(const Tensor& h) const {
    Tensor y = ag::linear(ag::silu(ag::linear(ag::rmsnorm(h, n, 1e-5), w1)), w2);
    return ag::add(h, y);
  }
};

TEST(Engine, CheckpointExactGradientsAndLessMemory) {
  const std::int64_t T = 24, C = 16, H = 48;
  Tensor x0 = randt({T, C}, 20, DType::F32);
  std::vector<Block> blocks;
  for (int l = 0; l < 3; ++l)
    blocks.push_back({randt({H, C}, 21 + l, DType::F32), randt({C, H}, 31 + l, DType::F32),
                      randt({C}, 41 + l, DType::F32)});
  auto& tr = MemoryTracker::get(DeviceType::CPU);
  auto run = [&](bool ckpt, std::int64_t& act_peak, std::int64_t& act_kept) {
    Tensor x = x0.detach().clone();
    x.set_requires_grad(true);
    for (auto& b : blocks) {
      b.w1.impl()->grad.reset();
      b.w2.impl()->grad.reset();
      b.n.impl()->grad.reset();
    }
    std::int64_t act0 = cpu_bytes(MemCategory::Activations);
    tr.reset_peaks();
    Tensor loss;
    {
      MemoryScope act(MemCategory::Activations);
      Tensor h = x;
      for (const auto& b : blocks) {
        if (ckpt)
          h = ag::checkpoint([b](const std::vector<Tensor>& in) { return b(in[0]); }, {h});
        else
          h = b(h);
      }
      loss = ag::mean_all(ag::mul(h, h));
    }
    act_peak = tr.stats().peak[static_cast<std::size_t>(MemCategory::Activations)] - act0;
    act_kept = cpu_bytes(MemCategory::Activations) - act0;
    backward(loss);
    std::vector<V> grads = {x.grad().to_double_vector()};
    for (auto& b : blocks) {
      grads.push_back(b.w1.grad().to_double_vector());
      grads.push_back(b.w2.grad().to_double_vector());
      grads.push_back(b.n.grad().to_double_vector());
    }
    grads.push_back({loss.item()});
    return grads;
  };
  std::int64_t peak_plain = 0, peak_ckpt = 0, kept_plain = 0, kept_ckpt = 0;
  auto plain = run(false, peak_plain, kept_plain);
  auto ckpt = run(true, peak_ckpt, kept_ckpt);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], ckpt[i]) << "tensor " << i;
  // Checkpointing keeps only each block's output (T x C) instead of its internals (several
  // T x C and T x H buffers); the forward peak adds one block's transient internals.
  EXPECT_LT(peak_ckpt, peak_plain);
  EXPECT_LE(kept_ckpt, 3 * T * C * 4 + 4 * 64) << "plain " << kept_plain;
  EXPECT_LT(2 * kept_ckpt, kept_plain);
}

}  // namespace
}  // namespace kiln
