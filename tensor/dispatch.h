// Dtype dispatch with templates: dispatch_dtype(t, [&](auto tag) { using T = decltype(tag)::type; })
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "tensor/dtype.h"

namespace kiln {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F64: return f(TypeTag<double>{});
    case DType::BF16: return f(TypeTag<bf16>{});
    case DType::F16: return f(TypeTag<f16>{});
    case DType::I32: return f(TypeTag<std::int32_t>{});
    case DType::I64: return f(TypeTag<std::int64_t>{});
    case DType::Bool: return f(TypeTag<std::uint8_t>{});
  }
  fail("[dispatch] unknown dtype");
}

// Kernels compute in float or double; bf16/f16 tensors are computed in f32
// by the front end (converted in, converted out).
template <typename F>
decltype(auto) dispatch_compute(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F64: return f(TypeTag<double>{});
    default: break;
  }
  fail("[{}] needs a f32 or f64 tensor here, got {}", op, dtype_name(t));
}

}  // namespace kiln
