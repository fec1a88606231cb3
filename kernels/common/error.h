// Errors raised by kernels and everything above them. Messages start with the
// op or file in brackets: "[embedding] token id 70000 out of range [0, 32000)".
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An allocation larger than the memory there is. The message names the request, its category,
// what is allocated so far and, where known, the config field or flag that asked for it
// (tensor/memory.h: MemCauseScope). An Error, so every handler of Error still catches it.
struct OutOfMemory : Error {
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define KILN_CHECK(cond, ...)               \
  do {                                      \
    if (!(cond)) ::kiln::fail(__VA_ARGS__); \
  } while (0)

}  // namespace kiln
