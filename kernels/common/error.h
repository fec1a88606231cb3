// Errors raised by kernels and everything above them. Messages start with the
// op or file in brackets: "[embedding] token id 70000 out of range [0, 32000)".
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace kiln {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define KILN_CHECK(cond, ...)            \
  do {                                   \
    if (!(cond)) ::kiln::fail(__VA_ARGS__); \
  } while (0)

}  // namespace kiln
