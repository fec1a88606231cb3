// Tensor: a handle to (storage, offset, shape, strides, dtype) plus optional
// autograd data. Views share storage. Copies of a Tensor share the same impl.
//
// The methods here are not differentiable; the autograd layer (autograd/ops.h)
// wraps them for graphs.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/storage.h"

namespace kiln {

using Shape = std::vector<std::int64_t>;
std::string shape_str(const Shape& s);
std::int64_t shape_numel(const Shape& s);  // overflow-checked
Shape contiguous_strides(const Shape& s);

class Node;  // autograd/node.h

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;  // in elements
  DType dtype = DType::F32;

  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;
  int output_nr = 0;
  std::string name;  // parameter name, for messages
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // New storage charged to the current MemoryScope category. Uninitialized.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int dim() const { return static_cast<int>(impl_->shape.size()); }
  std::int64_t size(int d) const;  // negative d counts from the end
  std::int64_t stride(int d) const;
  std::int64_t numel() const { return shape_numel(impl_->shape); }
  std::int64_t offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  bool is_contiguous() const;
  bool same_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }

  // Pointer to the first element (nullptr on meta). T must match the dtype's size.
  void* raw_data() const;
  template <typename T>
  T* data() const {
    check_element_type(sizeof(T), alignof(T));
    return static_cast<T*>(raw_data());
  }

  // ---- views (share storage) -------------------------------------------
  Tensor view(const Shape& shape) const;  // needs compatible strides; -1 infers one dim
  Tensor reshape(const Shape& shape) const;  // view if possible, else a contiguous copy
  Tensor transpose(int d0, int d1) const;
  Tensor permute(const std::vector<int>& dims) const;
  Tensor narrow(int dim, std::int64_t start, std::int64_t length) const;
  Tensor select(int dim, std::int64_t index) const;  // drops the dim
  Tensor expand(const Shape& shape) const;           // broadcast with stride 0
  Tensor unsqueeze(int dim) const;
  Tensor squeeze(int dim) const;
  Tensor flatten() const { return reshape({numel()}); }

  // ---- copies -----------------------------------------------------------
  Tensor contiguous() const;  // this if already contiguous
  Tensor clone() const;
  Tensor to(Device device) const;  // this if already there
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  void copy_(const Tensor& src);  // broadcasting copy into this, with dtype conversion

  // ---- values -----------------------------------------------------------
  double item() const;  // one element, as double
  std::vector<float> to_float_vector() const;
  std::vector<double> to_double_vector() const;
  std::string str(int max_per_dim = 6) const;  // readable printing

  // ---- autograd data ------------------------------------------------------
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  const std::string& name() const { return impl_->name; }
  Tensor& set_name(std::string n);
  // A new handle on the same data with no autograd history.
  Tensor detach() const;

 private:
  void check_element_type(std::size_t size, std::size_t align) const;
  Tensor make_view(Shape shape, Shape strides, std::int64_t offset) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Normalizes a possibly negative dim index; fails with op in the message.
int wrap_dim(int d, int ndim, const char* op);

}  // namespace kiln
