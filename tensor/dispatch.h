// Dtype dispatch with templates: dispatch_dtype(t, [&](auto tag) { using T = decltype(tag)::type;
// })
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
