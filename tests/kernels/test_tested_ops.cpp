// Every op family in kernels/op_list.h has at least one kernel test registered with
// KILN_OP_TESTED (the kernels' own float64-reference tests). Which backends implement each op is
// checked against the dispatch table in tests/tensor/test_coverage.cpp.
#include <gtest/gtest.h>

#include <string>

#include "kernels/op_list.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

TEST(Coverage, EveryOpHasTest) {
  std::string missing;
  for (const auto &info : kOpList)
    if (!test::tested_ops().count(info.op))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(info.name);
  EXPECT_TRUE(missing.empty()) << "ops without a registered test (KILN_OP_TESTED): " << missing;
}

}  // namespace
}  // namespace kiln
