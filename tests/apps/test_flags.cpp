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

// Inference's auto is bf16 wherever bf16 can be widened in vector registers (decode runs at the
// weights' bytes), and f32 only at the scalar level; training's auto needs bf16 arithmetic.
TEST(Flags, InferenceDtypeFollowsTheIsaLevel) {
  const cpu::CpuIsa detected = cpu::cpu_isa_detected();
  EXPECT_EQ(choose_inference_dtype("auto", Device::cuda(), "generate").dtype, DType::BF16);
  EXPECT_EQ(choose_inference_dtype("f32", Device::cpu(), "generate").dtype, DType::F32);
  EXPECT_EQ(choose_inference_dtype("fp32", Device::cpu(), "generate").dtype, DType::F32);
  EXPECT_EQ(choose_inference_dtype("bf16", Device::cpu(), "generate").dtype, DType::BF16);
  EXPECT_TRUE(choose_inference_dtype("bf16", Device::cpu(), "generate").why.empty());
  EXPECT_EQ(choose_inference_dtype("f16", Device::cpu(), "generate").dtype, DType::F16);
  EXPECT_EQ(choose_inference_dtype("fp16", Device::cpu(), "generate").dtype, DType::F16);
  try {
    choose_inference_dtype("f8", Device::cpu(), "serve");
    ADD_FAILURE() << "f8 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[serve] unknown dtype 'f8' (auto, f32, bf16 or f16)"),
              std::string::npos)
        << e.what();
  }
  try {
    choose_train_dtype("f16", Device::cpu());
    ADD_FAILURE() << "f16 training must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16 training needs loss scaling"), std::string::npos)
        << e.what();
  }
  for (cpu::CpuIsa level : {cpu::CpuIsa::Scalar, cpu::CpuIsa::Avx2, cpu::CpuIsa::Avx512,
                            cpu::CpuIsa::Avx512Bf16, cpu::CpuIsa::Amx}) {
    if (level > detected) continue;  // capping can only lower the level
    cpu::ScopedCpuIsa cap(level);
    const DTypeChoice c = choose_inference_dtype("auto", Device::cpu(), "generate");
    EXPECT_EQ(c.dtype, level >= cpu::CpuIsa::Avx2 ? DType::BF16 : DType::F32)
        << cpu::cpu_isa_name(level);
    EXPECT_FALSE(c.why.empty()) << cpu::cpu_isa_name(level);
    EXPECT_EQ(choose_train_dtype("auto", Device::cpu()).dtype,
              level >= cpu::CpuIsa::Avx512Bf16 ? DType::BF16 : DType::F32)
        << cpu::cpu_isa_name(level);
  }
}

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
  // auto says why; an explicit dtype needs no reason.
  EXPECT_FALSE(choose_train_dtype("auto", Device::cpu()).why.empty());
  EXPECT_TRUE(choose_train_dtype("bf16", Device::cpu()).why.empty());
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
