// Coverage: every op in kernels/op_list.h has a CPU kernel, a CUDA kernel (or an explicit skip
// naming the missing ones) and at least one test registered with KILN_OP_TESTED.
#include <gtest/gtest.h>

#include <string>

#include "kernels/op_list.h"
#include "tests/kernels/kernel_test_util.h"

#if defined(KILN_CUDA)
#include <cuda_runtime.h>
#endif

namespace kiln {
namespace {

TEST(Coverage, EveryOpHasCpuKernel) {
  for (const auto& info : kOpList)
    EXPECT_TRUE(cpu_has_kernel(info.op)) << "no CPU kernel for op " << info.name;
}

TEST(Coverage, EveryOpHasTest) {
  std::string missing;
  for (const auto& info : kOpList)
    if (!test::tested_ops().count(info.op))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(info.name);
  EXPECT_TRUE(missing.empty()) << "ops without a registered test (KILN_OP_TESTED): " << missing;
}

TEST(Coverage, EveryOpHasCudaKernel) {
  std::string missing;
  for (const auto& info : kOpList)
    if (!cuda_has_kernel(info.op))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(info.name);
  bool have_gpu = false;
#if defined(KILN_CUDA)
  int n = 0;
  have_gpu = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#endif
  if (!have_gpu) {
    if (!missing.empty()) GTEST_SKIP() << "no CUDA kernels yet: " << missing;
    GTEST_SKIP() << "no GPU: CUDA kernels present for all ops but not run here";
  }
  EXPECT_TRUE(missing.empty()) << "ops without a CUDA kernel: " << missing;
}

}  // namespace
}  // namespace kiln
