// The message of the kiln::Error a call throws, or "" when it throws none: tests assert on the
// text of a clean refusal (the op or file in brackets, the field or flag, the value).
#pragma once

#include <string>

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

}  // namespace kiln::test
