// The message of the kiln::Error a call throws, or "" when it throws none: tests assert on the
// text of a clean refusal (the op or file in brackets, the field or flag, the value). Test code
// only (expect_error reports through gtest).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <utility>

#include "kernels/common/error.h"

namespace kiln::test {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expects f to throw a kiln::Error whose message contains `part` (and, given a prefix, starts
// with it: the op or file in brackets); a test failure otherwise, naming what was expected and
// what came.
template <class F>
void expect_error(F&& f, const std::string& part, std::string_view prefix = {}) {
  const std::string msg = error_of(std::forward<F>(f));
  if (msg.empty()) {
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
    return;
  }
  EXPECT_NE(msg.find(part), std::string::npos) << "expected '" << part << "', got '" << msg << "'";
  if (!prefix.empty())
    EXPECT_EQ(msg.rfind(prefix, 0), 0u)
        << "expected it to start with '" << prefix << "', got '" << msg << "'";
}

}  // namespace kiln::test
