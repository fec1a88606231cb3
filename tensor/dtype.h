// Element types. bf16 is the GPU working type; the CPU computes bf16/f16 in
// f32. f64 exists for gradient checks and golden references.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kernels/common/error.h"

namespace kiln {

enum class DType : std::uint8_t { F32, F64, BF16, F16, I32, I64, Bool };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::Bool: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::Bool: return "bool";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16;
}

// Accepts "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16", ...
DType parse_dtype(std::string_view s);

// Safetensors names ("F32", "BF16", ...).
std::string_view dtype_safetensors_name(DType t);
DType dtype_from_safetensors(std::string_view s);

}  // namespace kiln
