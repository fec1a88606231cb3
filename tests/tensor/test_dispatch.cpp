// The dispatcher (tensor/kernel_table.h): a registered kernel is the only thing that decides
// whether an op runs natively in a dtype; conversions otherwise, charged to Temporaries; and the
// meta device's dry run makes the same decisions as the backend it simulates.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/common/half.h"
#include "tensor/op_args.h"
#include "tensor/ops.h"
#include "tests/tensor/mem_measure.h"

namespace kiln::ops {
namespace {

using test::kTemps;

using test::measure;

int g_bf16_silu_calls = 0;

// A test-only native bf16 CPU silu: reads bf16, computes in f32, writes bf16.
void silu_bf16_cpu(ActivationArgs<Op::Silu>& a) {
  ++g_bf16_silu_calls;
  const bf16* x = a.x.data<bf16>();
  bf16* y = a.y.data<bf16>();
  for (std::int64_t i = 0; i < a.x.numel(); ++i) {
    const float v = bf16_to_float(x[i]);
    y[i] = float_to_bf16(v / (1.0f + std::exp(-v)));
  }
}

// (4, 8) values in [-4, 4): 64 bytes in bf16, 128 in f32 (whole 64-byte allocator blocks).
Tensor bf16_input(Device dev) {
  std::vector<float> v(32);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = -4.0f + 0.25f * static_cast<float>(i);
  Tensor x = ops::from_vector(v, {4, 8}).to(DType::BF16);
  return dev.is_cpu() ? x : Tensor::empty(x.shape(), DType::BF16, dev);
}

TEST(Dispatch, RegisteringABf16CpuKernelIsAllItTakesToRunNatively) {
  Tensor x = bf16_input(Device::cpu());
  // The CPU's own native bf16 silu is taken out of the table for this test (an empty entry).
  ScopedKernel<ActivationArgs<Op::Silu>> none(DeviceType::CPU, DType::BF16, {});
  // Without a bf16 kernel the f32 kernel runs on an f32 copy of x into an f32 buffer.
  Tensor converted;
  MemStats conv = measure(Device::cpu(), [&] { converted = ops::silu(x); });
  EXPECT_EQ(conv.peak[kTemps], 2 * 32 * 4) << "f32 copy of x and f32 output buffer";
  EXPECT_FALSE(has_native_kernel<ActivationArgs<Op::Silu>>(Device::cpu(), DType::BF16));

  g_bf16_silu_calls = 0;
  ScopedKernel<ActivationArgs<Op::Silu>> native(DeviceType::CPU, DType::BF16,
                                                {.run = &silu_bf16_cpu});
  EXPECT_TRUE(has_native_kernel<ActivationArgs<Op::Silu>>(Device::cpu(), DType::BF16));
  Tensor y;
  MemStats st = measure(Device::cpu(), [&] { y = ops::silu(x); });
  EXPECT_EQ(g_bf16_silu_calls, 1);
  EXPECT_EQ(st.peak[kTemps], 0) << "a native kernel needs no f32 conversion scratch";
  EXPECT_EQ(y.dtype(), DType::BF16);
  const auto a = y.to_float_vector(), b = converted.to_float_vector();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;

  // The dry run asks the same table: no conversion charged on meta simulating the CPU either.
  MetaSimulatesScope cpu(DeviceType::CPU);
  Tensor xm = bf16_input(Device::meta());
  MemStats dry = measure(Device::meta(), [&] { (void)ops::silu(xm); });
  EXPECT_EQ(g_bf16_silu_calls, 1) << "meta runs no kernel";
  EXPECT_EQ(dry.peak[kTemps], 0);
}

// f16 attention's backward has no CPU kernel (the CPU's 16-bit attention backward is bf16 only),
// so the f32 kernel runs on converted copies there; rmsnorm, silu, linear and the attention
// forward take f16 natively.
TEST(Dispatch, TheDryRunChargesTheConversionsTheSimulatedCpuMakes) {
  MetaSimulatesScope cpu(DeviceType::CPU);
  ASSERT_FALSE(has_native_kernel<AttentionBackwardArgs>(Device::cpu(), DType::F16));
  ASSERT_TRUE(has_native_kernel<AttentionArgs>(Device::cpu(), DType::F16));
  ASSERT_TRUE(has_native_kernel<LinearArgs>(Device::cpu(), DType::F16));
  auto step = [](const Tensor& x, const Tensor& w, const Tensor& g) {
    auto [h, rstd] = ops::rmsnorm(x, g, 1e-5);
    Tensor y = ops::linear(ops::silu(h), w, Tensor()).view({1, x.size(0), 2, 4});  // (B, T, H, D)
    auto [out, lse] = ops::attention(y, y, y, 0.5, 0);
    auto [dq, dk, dv] = ops::attention_backward(y, y, y, out, lse, out, 0.5);
    return dq;
  };
  auto run_on = [&](Device dev) {
    Tensor x = bf16_input(Device::cpu()).to(DType::F16);
    if (!dev.is_cpu()) x = Tensor::empty(x.shape(), DType::F16, dev);
    Tensor w = ops::ones({8, 8}, DType::F16, dev), g = ops::ones({8}, DType::F16, dev);
    return measure(dev, [&] { (void)step(x, w, g); });
  };
  MemStats real = run_on(Device::cpu()), dry = run_on(Device::meta());
  EXPECT_GT(real.peak[kTemps], 0);
  EXPECT_EQ(dry.peak[kTemps], real.peak[kTemps]);
  EXPECT_EQ(dry.num_allocs, real.num_allocs);
}

TEST(Dispatch, MetaSimulatingCudaTakesBf16Natively) {
  MetaSimulatesScope cuda(DeviceType::CUDA);
  EXPECT_TRUE(has_native_kernel<ActivationArgs<Op::Silu>>(Device::meta(), DType::BF16));
  Tensor x = Tensor::empty({64, 64}, DType::BF16, Device::meta());
  MemStats st = measure(Device::meta(), [&] { (void)ops::silu(x); });
  EXPECT_EQ(st.peak[kTemps], 0);
}

TEST(Dispatch, NoKernelIsAClearError) {
  Tensor x = ops::zeros({4}, DType::I32);
  try {
    (void)ops::silu(x);
    FAIL() << "silu on i32 ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[silu] no cpu kernel takes i32 tensors"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln::ops
