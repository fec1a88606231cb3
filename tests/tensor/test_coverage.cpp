// Coverage, read from the dispatch table itself (tensor/kernel_table.h): every kernel op of
// tensor/op_args.h has a CPU kernel, and in a CUDA build a CUDA kernel that is built in; every
// op family of kernels/op_list.h has kernels; every registration belongs to a listed kernel op.
// (Every family's backend-ops case: tests/tensor/test_backend_ops.cpp, EveryOpHasACase.)
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tensor/op_args.h"

namespace kiln::ops {
namespace {

// The kernels of AllKernels missing a registration for dev that is runnable, by name.
template <class... A>
std::string missing_kernels(KernelList<A...>, DeviceType dev) {
  std::string missing;
  auto check = [&](std::string_view name, bool ok) {
    if (!ok) missing += std::string(missing.empty() ? "" : ", ") + std::string(name);
  };
  (check(A::kName,
         [&] {
           for (const auto& r : registrations())
             if (r.kernel == A::kName && r.device == dev && r.runnable) return true;
           return false;
         }()),
   ...);
  return missing;
}

template <class... A>
std::set<std::string_view> kernel_names(KernelList<A...>) {
  return {A::kName...};
}

TEST(Coverage, EveryKernelHasACpuKernel) {
  const std::string missing = missing_kernels(AllKernels{}, DeviceType::CPU);
  EXPECT_TRUE(missing.empty()) << "kernel ops without a CPU kernel: " << missing;
}

// A registry check, not a GPU test: in a CUDA build every kernel op must have a CUDA kernel
// built in, whether or not this machine has a GPU (test_backend_ops.cpp runs them on one).
TEST(Coverage, EveryKernelHasACudaKernel) {
#if !defined(KILN_CUDA)
  GTEST_SKIP() << "built without CUDA (-DKILN_CUDA=OFF): no CUDA kernels to check";
#endif
  const std::string missing = missing_kernels(AllKernels{}, DeviceType::CUDA);
  EXPECT_TRUE(missing.empty()) << "kernel ops without a CUDA kernel: " << missing;
}

TEST(Coverage, EveryOpFamilyHasKernels) {
  for (const auto& info : kOpList) {
    bool found = false;
    for (const auto& r : registrations()) found = found || (r.op == info.op && r.runnable);
    EXPECT_TRUE(found) << "op family " << info.name << " has no kernel";
  }
}

TEST(Coverage, EveryRegistrationIsAListedKernel) {
  const auto names = kernel_names(AllKernels{});
  for (const auto& r : registrations())
    EXPECT_TRUE(names.count(r.kernel)) << r.kernel << " is registered but not in AllKernels";
}

// The capability entries of a CUDA kernel exist in every build, so a CPU-only build can still
// simulate a CUDA run on meta (kiln budget --simulate cuda).
TEST(Coverage, CudaCapabilitiesAreKnownInEveryBuild) {
  EXPECT_NE(find_kernel<SoftmaxArgs>(DeviceType::CUDA, DType::BF16), nullptr);
  EXPECT_NE(find_kernel<AttentionBackwardArgs>(DeviceType::CUDA, DType::BF16), nullptr);
  EXPECT_EQ(find_kernel<SoftmaxArgs>(DeviceType::CUDA, DType::F64), nullptr);
  // The CUDA random kernel is instantiated for double and its glue takes f64; the registration
  // once left it out, and CudaBasic.RandomMatchesCpuStream failed on the first GPU run with
  // "[random] no cuda kernel takes f64 tensors".
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16})
    EXPECT_NE(find_kernel<RandomArgs>(DeviceType::CUDA, dt), nullptr) << dtype_name(dt);
}

// `--attention auto|kiln|cudnn` is a table entry, not a switch inside the glue: choosing one
// replaces the bf16/f16 CUDA attention entries (so the dispatcher and the dry run see what runs),
// leaves f32 on kiln's kernel (cuDNN has no f32 path), and choosing kiln puts kiln's entries back.
TEST(Coverage, AttentionImplementationIsATableEntry) {
  const AttentionImpl before = attention_impl();
  set_attention_impl(AttentionImpl::Kiln);
  auto fwd = [](DType dt) { return find_kernel<AttentionArgs>(DeviceType::CUDA, dt)->run; };
  auto bwd = [](DType dt) { return *find_kernel<AttentionBackwardArgs>(DeviceType::CUDA, dt); };
  const auto kiln_bf16 = fwd(DType::BF16), kiln_f32 = fwd(DType::F32);
  ASSERT_NE(bwd(DType::BF16).scratch, nullptr);  // kiln's backward declares Di and dQ

  set_attention_impl(AttentionImpl::Cudnn);
  EXPECT_NE(fwd(DType::BF16), kiln_bf16);
  EXPECT_NE(fwd(DType::F16), nullptr);
  EXPECT_EQ(fwd(DType::F32), kiln_f32);

  EXPECT_NE(bwd(DType::BF16).scratch, nullptr);  // softmax_sum and dQ beside cuDNN's workspace
  EXPECT_NE(bwd(DType::F32).scratch, nullptr);
  const auto cudnn_bf16 = fwd(DType::BF16);

  set_attention_impl(AttentionImpl::Auto);  // the default: an entry that picks per shape
  EXPECT_NE(fwd(DType::BF16), kiln_bf16);
  EXPECT_NE(fwd(DType::BF16), cudnn_bf16);
  EXPECT_EQ(fwd(DType::F32), kiln_f32);
  ASSERT_NE(bwd(DType::BF16).scratch, nullptr);

  set_attention_impl(AttentionImpl::Kiln);
  EXPECT_EQ(fwd(DType::BF16), kiln_bf16);
  EXPECT_NE(bwd(DType::BF16).scratch, nullptr);
  set_attention_impl(before);
}

// A tensor on another device than its op's is refused by the dispatcher on every backend, with
// one message; copy, which moves data between devices, is the exception.
TEST(Coverage, MixedDevicesAreRefusedByTheDispatcher) {
  Tensor y = Tensor::empty({4}, DType::F32, Device::meta());
  const Tensor x = ops::zeros({4}, DType::F32);
  AxpyArgs a{y, x, 1.0};
  try {
    run(a);
    ADD_FAILURE() << "a host tensor in a meta op was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[axpy] tensors on different devices: meta and cpu");
  }
  EXPECT_NO_THROW(y.copy_(x));  // a copy to the device is no mixed-device op
}

}  // namespace
}  // namespace kiln::ops
