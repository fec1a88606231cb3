// Coverage: every op in kernels/op_list.h has a CPU kernel, a CUDA kernel (in a
// CUDA build) and at least one test registered with KILN_OP_TESTED.
#include <gtest/gtest.h>

#include <string>

#include "kernels/op_list.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

TEST(Coverage, EveryOpHasCpuKernel) {
  for (const auto &info : kOpList)
    EXPECT_TRUE(cpu_has_kernel(info.op)) << "no CPU kernel for op " << info.name;
}

TEST(Coverage, EveryOpHasTest) {
  std::string missing;
  for (const auto &info : kOpList)
    if (!test::tested_ops().count(info.op))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(info.name);
  EXPECT_TRUE(missing.empty()) << "ops without a registered test (KILN_OP_TESTED): " << missing;
}

// A registry check, not a GPU test: in a CUDA build every op must have a CUDA
// kernel, whether or not this machine has a GPU
// (tests/tensor/test_backend_ops.cpp runs them on one).
TEST(Coverage, EveryOpHasCudaKernel) {
#if !defined(KILN_CUDA)
  GTEST_SKIP() << "built without CUDA (-DKILN_CUDA=OFF): no CUDA kernels to check";
#endif
  std::string missing;
  for (const auto &info : kOpList)
    if (!cuda_has_kernel(info.op))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(info.name);
  EXPECT_TRUE(missing.empty()) << "ops without a CUDA kernel: " << missing;
}

}  // namespace
}  // namespace kiln
