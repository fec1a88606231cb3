// A kernel's library or path switch read from the environment (KILN_F32_GEMM,
// KILN_ATTENTION_GEMM): one parser, so every such switch accepts and refuses alike.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>

#include "kernels/common/error.h"

namespace kiln {

// -1 when `var` is unset, empty or "auto" (the kernel's own rule); else the index of its value
// in `choices`. Any other value throws: "[op] VAR=value is not one of auto, a, b". Callers read
// it once (a function-local static), so a run keeps one answer.
inline int env_choice(const char* var, std::initializer_list<std::string_view> choices,
                      std::string_view op) {
  const char* env = std::getenv(var);
  const std::string_view v = env ? env : "";
  if (v.empty() || v == "auto") return -1;
  int i = 0;
  std::string names = "auto";
  for (std::string_view c : choices) {
    if (v == c) return i;
    ++i;
    names += ", ";
    names += c;
  }
  fail("[{}] {}={} is not one of {}", op, var, v, names);
}

}  // namespace kiln
