// env_choice (kernels/common/env_choice.h): the parser behind KILN_F32_GEMM and
// KILN_ATTENTION_GEMM. Each case sets the variable, reads it, and unsets it again.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "kernels/common/env_choice.h"

namespace {

constexpr const char* kVar = "KILN_TEST_ENV_CHOICE";

// value: the variable's text, or nullopt to unset it.
int choice_for(const std::optional<std::string>& value) {
  if (value)
    setenv(kVar, value->c_str(), 1);
  else
    unsetenv(kVar);
  const int got = kiln::env_choice(kVar, {"openblas", "onednn"}, "gemm");
  unsetenv(kVar);
  return got;
}

TEST(EnvChoice, UnsetEmptyAndAutoMeanTheRule) {
  EXPECT_EQ(choice_for(std::nullopt), -1);
  EXPECT_EQ(choice_for(""), -1);
  EXPECT_EQ(choice_for("auto"), -1);
}

TEST(EnvChoice, EachChoiceGivesItsIndex) {
  EXPECT_EQ(choice_for("openblas"), 0);
  EXPECT_EQ(choice_for("onednn"), 1);
}

TEST(EnvChoice, AnythingElseIsRefusedByName) {
  for (const char* bad : {"OpenBLAS", "onednn ", "blas", "1"}) {
    try {
      choice_for(std::string(bad));
      ADD_FAILURE() << "accepted " << bad;
    } catch (const kiln::Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("[gemm] KILN_TEST_ENV_CHOICE=") + bad +
                                           " is not one of auto, openblas, onednn");
    }
  }
  unsetenv(kVar);
}

}  // namespace
