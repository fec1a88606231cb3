// The command line's flags to the library's types (apps/flags.h): --device, the training
// --dtype and --attention, and their errors with and without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "apps/flags.h"
#include "kernels/cpu/isa.h"
#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"

using namespace kiln;
using namespace kiln::apps;

TEST(Flags, DevicesAndDtypes) {
  EXPECT_EQ(resolve_device("cpu", "train"), Device::cpu());
  EXPECT_EQ(resolve_train_dtype("auto", Device::cpu()),
            cpu::cpu_has(cpu::CpuIsa::Avx512Bf16) ? DType::BF16 : DType::F32);
  {
    cpu::ScopedCpuIsa avx512(cpu::CpuIsa::Avx512 < cpu::cpu_isa_detected()
                                 ? cpu::CpuIsa::Avx512
                                 : cpu::cpu_isa_detected());
    EXPECT_EQ(resolve_train_dtype("auto", Device::cpu()), DType::F32)
        << "a CPU without AVX512-BF16 trains in f32 by default";
  }
  EXPECT_EQ(resolve_train_dtype("auto", Device::cuda()), DType::BF16);
  EXPECT_EQ(resolve_train_dtype("fp32", Device::cuda()), DType::F32);
  EXPECT_THROW(resolve_train_dtype("f16", Device::cpu()), Error);
  EXPECT_THROW(resolve_device("meta", "train"), Error);
  EXPECT_THROW(resolve_device("tpu", "train"), Error);
  EXPECT_THROW(set_attention_from_flag("flash", "train"), Error);
  set_attention_from_flag("cudnn", "train");
  EXPECT_EQ(ops::attention_impl(), ops::AttentionImpl::Cudnn);
  set_attention_from_flag("kiln", "train");
  EXPECT_EQ(ops::attention_impl(), ops::AttentionImpl::Kiln);
  set_attention_from_flag("auto", "train");
  EXPECT_EQ(ops::attention_impl(), ops::AttentionImpl::Auto);
  if (cuda::device_count() == 0) {
    EXPECT_EQ(resolve_device("auto", "train"), Device::cpu());
    try {
      resolve_device("cuda", "train");
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[train] --device cuda: ", 0), 0u) << msg;
      EXPECT_NE(msg.find("use --device cpu"), std::string::npos) << msg;
    }
  } else {
    EXPECT_EQ(resolve_device("auto", "train"), Device::cuda(0));
    EXPECT_EQ(resolve_device("cuda:0", "train"), Device::cuda(0));
    EXPECT_THROW(resolve_device("cuda:" + std::to_string(cuda::device_count()), "train"), Error);
  }
}
