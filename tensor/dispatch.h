// Dtype dispatch with templates: dispatch_dtype(t, [&](auto tag) { using T = decltype(tag)::type;
// })
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/half.h"
#include "tensor/dtype.h"

namespace kiln {

template <typename T>
struct TypeTag {
  using type = T;
};

// The DType of a storage type: dtype_of<bf16>() == DType::BF16 (the inverse of dispatch_dtype).
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<T, bf16>)
    return DType::BF16;
  else if constexpr (std::is_same_v<T, f16>)
    return DType::F16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DType::I32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DType::I64;
  else {
    static_assert(std::is_same_v<T, std::uint8_t>, "no DType stores this type");
    return DType::Bool;
  }
}

template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(TypeTag<float>{});
    case DType::F64:
      return f(TypeTag<double>{});
    case DType::BF16:
      return f(TypeTag<bf16>{});
    case DType::F16:
      return f(TypeTag<f16>{});
    case DType::I32:
      return f(TypeTag<std::int32_t>{});
    case DType::I64:
      return f(TypeTag<std::int64_t>{});
    case DType::Bool:
      return f(TypeTag<std::uint8_t>{});
  }
  fail("[dispatch] unknown dtype");
}

// The storage types the CUDA kernels take (f32 compute, bf16/f16 storage): the one dtype switch
// of the CUDA glue (tensor/kernels_cuda_*.cpp).
template <typename F>
decltype(auto) dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32:
      return f(TypeTag<float>{});
    case DType::BF16:
      return f(TypeTag<bf16>{});
    case DType::F16:
      return f(TypeTag<f16>{});
    default:
      break;
  }
  fail("[{}] {} is not supported on CUDA", op, dtype_name(t));
}

}  // namespace kiln
