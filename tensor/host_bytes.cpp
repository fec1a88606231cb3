// Tensors over host bytes (see host_bytes.h).
#include "tensor/host_bytes.h"

#include <cstdint>

#include "kernels/common/error.h"
#include "tensor/storage.h"

namespace kiln {

Tensor host_bytes_in_place(const void* bytes, std::int64_t nbytes, const Shape& shape, DType dtype,
                           std::shared_ptr<const void> owner, Device device, MemCategory category) {
  KILN_CHECK(shape_numel(shape) * static_cast<std::int64_t>(dtype_size(dtype)) == nbytes,
             "[host_bytes] {} bytes are not a {} tensor of shape {}", nbytes, dtype_name(dtype),
             shape_str(shape));
  if (!device.is_cpu() || reinterpret_cast<std::uintptr_t>(bytes) % dtype_size(dtype) != 0)
    return Tensor();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(bytes, static_cast<std::size_t>(nbytes), category,
                                            std::move(owner));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(impl);
}

void* host_dense_data(const Tensor& t, DType dtype) {
  if (!t.defined() || !t.device().is_cpu() || t.dtype() != dtype || !t.is_contiguous() ||
      t.storage()->mapped())  // file bytes in place are read-only
    return nullptr;
  return t.raw_data();
}

}  // namespace kiln
