// Helpers shared by the op front-end files (not a public header).
#pragma once

#include "tensor/kernel_table.h"
#include "tensor/op_args.h"
#include "tensor/ops.h"

namespace kiln::ops {

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.device() == b.device(), "[{}] tensors on different devices: {} and {}", op,
             a.device().str(), b.device().str());
}

inline void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.shape() == b.shape(), "[{}] shapes {} and {} differ", op, shape_str(a.shape()),
             shape_str(b.shape()));
}

inline std::int64_t rows_of(const Tensor& x) {
  return x.dim() == 0 ? 1 : x.numel() / std::max<std::int64_t>(x.size(-1), 1);
}

}  // namespace kiln::ops
