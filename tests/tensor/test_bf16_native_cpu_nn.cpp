// The CPU's native bf16 attention, cross-entropy and mixed-precision AdamW, through the front
// ends: the table says native, a call charges no f32 conversion copies (Temporaries) on the
// CPU or in the dry run that simulates it, and the results agree with the f32 kernels run on
// the same (bf16-valued) inputs within bf16 rounding.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "tensor/op_args.h"
#include "tensor/ops.h"
#include "tests/tensor/mem_measure.h"

namespace kiln::ops {
namespace {

using test::kTemps;

// Peak Temporaries (above what was live before) while f runs on `dev`; outputs of f are
// charged to Activations, so what Temporaries hold is conversion or kernel scratch.
template <class F>
std::int64_t peak_scratch(Device dev, F&& f) {
  MemoryTracker& tr = MemoryTracker::get(dev.type);
  tr.reset_peaks();
  const std::int64_t before = tr.stats().current[kTemps];
  MemoryScope outputs(MemCategory::Activations);
  f();
  return tr.stats().peak[kTemps] - before;
}

struct SimulateCpu : MetaSimulatesScope {
  SimulateCpu() : MetaSimulatesScope(DeviceType::CPU) {}
};

// Deterministic values in about [-2, 2), bf16 on `dev` (meta: shape only).
Tensor bf16_values(const Shape& shape, int seed, Device dev) {
  if (dev.is_meta()) return Tensor::empty(shape, DType::BF16, dev);
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = 2.0f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
  return from_vector(v, shape).to(DType::BF16);
}

void expect_near_f32(const Tensor& got, const Tensor& want, double tol, const char* what) {
  const auto a = got.to_float_vector(), b = want.to_float_vector();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * (1.0 + std::abs(b[i]))) << what << " at " << i;
}

TEST(Bf16NativeCpu, TheTableTakesBf16Natively) {
  EXPECT_TRUE(has_native_kernel<AttentionArgs>(Device::cpu(), DType::BF16));
  EXPECT_TRUE(has_native_kernel<AttentionBackwardArgs>(Device::cpu(), DType::BF16));
  EXPECT_TRUE(has_native_kernel<CrossEntropyArgs>(Device::cpu(), DType::BF16));
  EXPECT_TRUE(has_native_kernel<CrossEntropyBackwardArgs>(Device::cpu(), DType::BF16));
}

TEST(Bf16NativeCpu, CrossEntropyChargesNoConversionsAndMatchesF32) {
  const std::int64_t N = 6, V = 5000;
  const std::vector<std::int32_t> kTargets{1, 7, 4999, -100, 2500, 3};
  auto run_on = [&](Device dev, Tensor* loss, Tensor* dlogits) {
    Tensor logits = bf16_values({N, V}, 1, dev);
    Tensor targets =
        dev.is_meta() ? Tensor::empty({N}, DType::I32, dev) : from_vector(kTargets, {N});
    Tensor dloss = dev.is_meta() ? Tensor::empty({N}, DType::F32, dev)
                                 : ops::full({N}, 1.0 / N, DType::F32, dev);
    return peak_scratch(dev, [&] {
      auto [l, lse] = cross_entropy(logits, targets, -100);
      EXPECT_EQ(l.dtype(), DType::F32);
      EXPECT_EQ(lse.dtype(), DType::F32);
      Tensor d = cross_entropy_backward(logits, lse, targets, dloss, -100, /*in_place=*/true);
      EXPECT_EQ(d.dtype(), DType::BF16);
      if (loss) *loss = l, *dlogits = d;
    });
  };
  Tensor loss, dlogits;
  EXPECT_EQ(run_on(Device::cpu(), &loss, &dlogits), 0) << "no f32 copy of the (N, V) logits";
  {
    SimulateCpu sim;
    EXPECT_EQ(run_on(Device::meta(), nullptr, nullptr), 0);
  }
  // The f32 kernels on the same values.
  Tensor l32 = bf16_values({N, V}, 1, Device::cpu()).to(DType::F32);
  Tensor t32 = from_vector(kTargets, {N});
  auto [loss_ref, lse_ref] = cross_entropy(l32, t32, -100);
  Tensor d_ref = cross_entropy_backward(l32, lse_ref, t32,
                                        ops::full({N}, 1.0 / N, DType::F32, Device::cpu()), -100);
  expect_near_f32(loss, loss_ref, 1e-5, "loss");
  expect_near_f32(dlogits, d_ref, 1.0 / 256, "dlogits");
}

TEST(Bf16NativeCpu, AttentionChargesNoConversionsAndMatchesF32) {
  const std::int64_t B = 2, T = 40, Hq = 4, Hkv = 2, D = 16;
  const double scale = 0.25;
  auto inputs = [&](Device dev) {
    return std::array<Tensor, 4>{
        bf16_values({B, T, Hq, D}, 1, dev), bf16_values({B, T, Hkv, D}, 2, dev),
        bf16_values({B, T, Hkv, D}, 3, dev), bf16_values({B, T, Hq, D}, 4, dev)};
  };
  std::array<Tensor, 4> got;
  auto run_on = [&](Device dev) {
    // Named, not a structured binding: clang 14 cannot capture one in a lambda.
    const std::array<Tensor, 4> in = inputs(dev);
    const Tensor &q = in[0], &k = in[1], &v = in[2], &dout = in[3];
    return peak_scratch(dev, [&] {
      auto [out, lse] = attention(q, k, v, scale, 0);
      EXPECT_EQ(out.dtype(), DType::BF16);
      EXPECT_EQ(lse.dtype(), DType::F32) << "the saved statistics stay f32, as on CUDA";
      auto [dq, dk, dv] = attention_backward(q, k, v, out, lse, dout, scale);
      EXPECT_EQ(dq.dtype(), DType::BF16);
      got = {out, dq, dk, dv};
    });
  };
  EXPECT_EQ(run_on(Device::cpu()), 0);
  const std::array<Tensor, 4> bf = got;
  {
    SimulateCpu sim;
    EXPECT_EQ(run_on(Device::meta()), 0);
  }
  auto [q, k, v, dout] = inputs(Device::cpu());
  auto f32 = [](const Tensor& t) { return t.to(DType::F32); };
  auto [out, lse] = attention(f32(q), f32(k), f32(v), scale, 0);
  auto [dq, dk, dv] = attention_backward(f32(q), f32(k), f32(v), out, lse, f32(dout), scale);
  expect_near_f32(bf[0], out, 1.0 / 128, "out");
  expect_near_f32(bf[1], dq, 1.0 / 64, "dq");
  expect_near_f32(bf[2], dk, 1.0 / 64, "dk");
  expect_near_f32(bf[3], dv, 1.0 / 64, "dv");
}

// A bf16 parameter with its f32 master and moments: the step reads the bf16 gradient as it is
// (no widened copy) and leaves param == bf16(master).
TEST(Bf16NativeCpu, AdamWWithMastersChargesNoConversions) {
  const std::int64_t n = 10000;
  Tensor param = bf16_values({n}, 5, Device::cpu());
  Tensor grad = bf16_values({n}, 6, Device::cpu());
  Tensor master = param.to(DType::F32).clone();
  Tensor m = zeros({n}, DType::F32, Device::cpu()), v = zeros({n}, DType::F32, Device::cpu());
  std::vector<AdamWTensors> items{{param, grad, master, m, v, 0.1}};
  const std::int64_t scratch =
      peak_scratch(Device::cpu(), [&] { adamw_multi_step_(items, 1e-2, 0.9, 0.95, 1e-8, 1); });
  EXPECT_EQ(scratch, 0);
  EXPECT_EQ(param.to_float_vector(), master.to(DType::BF16).to_float_vector());
  // The same step on an f32 copy with an f32 gradient gives the same master.
  Tensor m2 = zeros({n}, DType::F32, Device::cpu()), v2 = zeros({n}, DType::F32, Device::cpu());
  Tensor w = bf16_values({n}, 5, Device::cpu()).to(DType::F32);
  adamw_step_(w, grad.to(DType::F32), m2, v2, 1e-2, 0.9, 0.95, 1e-8, 0.1, 1);
  EXPECT_EQ(w.to_float_vector(), master.to_float_vector());
}

}  // namespace
}  // namespace kiln::ops
