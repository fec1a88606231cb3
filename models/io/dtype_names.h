// Safetensors dtype names ("F32", "BF16", ...) and their element sizes. The
// io layer has no Tensor type, so dtypes cross its API as these strings; the
// tensor layer maps them onto its own DType enum.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/common/error.h"

namespace kiln::io {

struct DTypeName {
  std::string_view name;  // as spelled in a safetensors header
  size_t size;            // bytes per element
};

// The dtypes kiln reads and writes. "BOOL" is one byte per element.
inline constexpr std::array<DTypeName, 10> kDTypeNames = {{
    {"F64", 8},
    {"F32", 4},
    {"F16", 2},
    {"BF16", 2},
    {"I64", 8},
    {"I32", 4},
    {"I16", 2},
    {"I8", 1},
    {"U8", 1},
    {"BOOL", 1},
}};

// Element size of a dtype name, or nullopt when the name is unknown.
inline std::optional<size_t> try_dtype_size(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (d.name == name) return d.size;
  return std::nullopt;
}

// Element size of a dtype name; throws kiln::Error for an unknown name.
inline size_t dtype_size(std::string_view name) {
  auto s = try_dtype_size(name);
  if (!s) fail("[dtype] unknown dtype name '{}'", name);
  return *s;
}

}  // namespace kiln::io
