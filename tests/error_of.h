// The message of the kiln::Error a call throws, or "" when it throws none: tests assert on the
// text of a clean refusal (the op or file in brackets, the field or flag, the value). Test code
// only (expect_error reports through gtest).
#pragma once

#include <gtest/gtest.h>

#include <string>
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

// Expects f to throw a kiln::Error whose message contains `part`; a test failure otherwise,
// naming what was expected and what came.
template <class F>
void expect_error(F&& f, const std::string& part) {
  const std::string msg = error_of(std::forward<F>(f));
  if (msg.empty())
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  else
    EXPECT_NE(msg.find(part), std::string::npos)
        << "expected '" << part << "', got '" << msg << "'";
}

}  // namespace kiln::test
