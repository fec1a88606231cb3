#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/common/error.h"
#include "kernels/cpu/isa.h"

namespace {

// KILN_CPU_ISA above what this CPU has (a ctest entry that re-runs a suite at AVX512-BF16, run on
// an AVX2-only machine): every test of the process skips and says why, instead of each one
// failing on the level it cannot have. ctest marks the entry skipped by this message
// (tests/CMakeLists.txt: SKIP_REGULAR_EXPRESSION).
class CpuIsaRequest : public ::testing::Environment {
 public:
  explicit CpuIsaRequest(std::string refusal) : refusal_(std::move(refusal)) {}
  void SetUp() override {
    if (!refusal_.empty()) GTEST_SKIP() << "[expected-skip] " << refusal_;
  }

 private:
  std::string refusal_;
};

std::string cpu_isa_refusal() {
  const char* v = std::getenv("KILN_CPU_ISA");
  if (v == nullptr || *v == '\0') return "";
  try {
    (void)kiln::cpu::cpu_isa();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new CpuIsaRequest(cpu_isa_refusal()));
  return RUN_ALL_TESTS();
}
