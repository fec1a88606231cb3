#include "tensor/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <sstream>

#include "kernels/cpu/copy.h"
#include "tensor/dispatch.h"
#include "tensor/op_args.h"

namespace kiln {

// ---- dtype / device names -----------------------------------------------------

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "fp32" || s == "float32" || s == "float") return DType::F32;
  if (s == "f64" || s == "fp64" || s == "float64" || s == "double") return DType::F64;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "half") return DType::F16;
  if (s == "i32" || s == "int32") return DType::I32;
  if (s == "i64" || s == "int64") return DType::I64;
  if (s == "bool") return DType::Bool;
  fail("[dtype] unknown dtype '{}' (expected f32, f64, bf16, f16, i32, i64 or bool)", s);
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::Bool:
      return "BOOL";
  }
  return "?";
}

DType dtype_from_safetensors(std::string_view s) {
  if (s == "F32") return DType::F32;
  if (s == "F64") return DType::F64;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "BOOL" || s == "U8") return DType::Bool;
  fail("[safetensors] unsupported dtype '{}'", s);
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::CPU:
      return "cpu";
    case DeviceType::Meta:
      return "meta";
    case DeviceType::CUDA:
      return index == 0 ? "cuda" : fmt::format("cuda:{}", index);
  }
  return "?";
}

Device Device::parse(std::string_view s) {
  if (s == "cpu") return cpu();
  if (s == "meta") return meta();
  if (s == "cuda") return cuda(0);
  if (s.starts_with("cuda:")) {
    int i = 0;
    for (char c : s.substr(5)) {
      KILN_CHECK(c >= '0' && c <= '9', "[device] bad device '{}'", s);
      i = i * 10 + (c - '0');
      KILN_CHECK(i < 1024, "[device] bad device index in '{}'", s);
    }
    KILN_CHECK(s.size() > 5, "[device] bad device '{}'", s);
    return cuda(i);
  }
  fail("[device] unknown device '{}' (expected cpu, cuda, cuda:N or meta)", s);
}

// ---- shapes ---------------------------------------------------------------------

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  if (s.size() == 1) out += ",";
  return out + ")";
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) {
    KILN_CHECK(d >= 0, "[shape] negative size in {}", shape_str(s));
    KILN_CHECK(!__builtin_mul_overflow(n, d, &n), "[shape] element count of {} overflows",
               shape_str(s));
  }
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  std::int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<std::int64_t>(s[i], 1);
  }
  return st;
}

int wrap_dim(int d, int ndim, const char* op) {
  int w = d < 0 ? d + ndim : d;
  KILN_CHECK(w >= 0 && w < std::max(ndim, 1), "[{}] dim {} out of range for a {}-d tensor", op, d,
             ndim);
  return w;
}

// ---- Tensor ---------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  std::int64_t n = shape_numel(shape);
  std::size_t bytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(static_cast<std::size_t>(n), dtype_size(dtype), &bytes),
             "[tensor] byte size of {} overflows", shape_str(shape));
  impl->storage = std::make_shared<Storage>(bytes, device, current_mem_category());
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

std::int64_t Tensor::size(int d) const { return impl_->shape[wrap_dim(d, dim(), "size")]; }
std::int64_t Tensor::stride(int d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  // An empty tensor has no element to misplace: contiguous whatever its strides (as in PyTorch).
  // Without this, zeros({5, 0}) (strides (1, 1)) failed its own fill on CUDA ("[fill] tensor
  // must be contiguous", CudaMatmul.EmptyInnerDimension on the first GPU run).
  for (std::int64_t s : impl_->shape)
    if (s == 0) return true;
  std::int64_t acc = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != acc) return false;
    acc *= impl_->shape[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  auto* base = static_cast<char*>(impl_->storage->data());
  if (!base) return nullptr;
  return base + impl_->offset * static_cast<std::int64_t>(dtype_size(dtype()));
}

void Tensor::check_element_type(std::size_t size, std::size_t) const {
  KILN_CHECK(size == dtype_size(dtype()), "[tensor] data<T>() with a {}-byte T on a {} tensor",
             size, dtype_name(dtype()));
}

Tensor Tensor::make_view(Shape shape, Shape strides, std::int64_t offset) const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

static Shape infer_shape(const Shape& shape, std::int64_t numel, const Shape& from) {
  Shape out = shape;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      KILN_CHECK(infer < 0, "[view] more than one -1 in {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      KILN_CHECK(out[i] >= 0, "[view] negative size in {}", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known > 0 && numel % known == 0, "[view] cannot view {} as {}", shape_str(from),
               shape_str(shape));
    out[infer] = numel / known;
  }
  KILN_CHECK(shape_numel(out) == numel, "[view] cannot view {} ({} elements) as {}",
             shape_str(from), numel, shape_str(shape));
  return out;
}

// Strides for viewing (shape, strides) as new_shape without a copy, if possible
// (the same rule as PyTorch's computeStride).
static bool view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape,
                         Shape& out) {
  out.assign(new_shape.size(), 0);
  if (shape_numel(shape) == 0) {
    out = contiguous_strides(new_shape);
    return true;
  }
  int view_d = static_cast<int>(new_shape.size()) - 1;
  std::int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (int tensor_d = static_cast<int>(shape.size()) - 1; tensor_d >= 0; tensor_d--) {
    tensor_numel *= shape[tensor_d];
    if (tensor_d == 0 ||
        (shape[tensor_d - 1] != 1 && strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), impl_->shape);
  Shape st;
  KILN_CHECK(view_strides(impl_->shape, impl_->strides, s, st),
             "[view] {} with strides {} cannot be viewed as {}; use reshape()",
             shape_str(impl_->shape), shape_str(impl_->strides), shape_str(s));
  return make_view(std::move(s), std::move(st), impl_->offset);
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), impl_->shape);
  Shape st;
  if (view_strides(impl_->shape, impl_->strides, s, st))
    return make_view(std::move(s), std::move(st), impl_->offset);
  return contiguous().view(s);
}

Tensor Tensor::transpose(int d0, int d1) const {
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape s = impl_->shape, st = impl_->strides;
  std::swap(s[d0], s[d1]);
  std::swap(st[d0], st[d1]);
  return make_view(std::move(s), std::move(st), impl_->offset);
}

Tensor Tensor::permute(const std::vector<int>& dims) const {
  KILN_CHECK(static_cast<int>(dims.size()) == dim(), "[permute] {} dims given for a {}-d tensor",
             dims.size(), dim());
  Shape s(dim()), st(dim());
  std::vector<bool> seen(dim(), false);
  for (int i = 0; i < dim(); ++i) {
    int d = wrap_dim(dims[i], dim(), "permute");
    KILN_CHECK(!seen[d], "[permute] dim {} repeated", d);
    seen[d] = true;
    s[i] = impl_->shape[d];
    st[i] = impl_->strides[d];
  }
  return make_view(std::move(s), std::move(st), impl_->offset);
}

Tensor Tensor::narrow(int d, std::int64_t start, std::int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= impl_->shape[d],
             "[narrow] range [{}, {}) out of bounds for dim {} of size {}", start, start + length,
             d, impl_->shape[d]);
  Shape s = impl_->shape;
  s[d] = length;
  return make_view(std::move(s), impl_->strides, impl_->offset + start * impl_->strides[d]);
}

Tensor Tensor::select(int d, std::int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  KILN_CHECK(index >= 0 && index < impl_->shape[d], "[select] index {} out of range for size {}",
             index, impl_->shape[d]);
  Shape s = impl_->shape, st = impl_->strides;
  std::int64_t off = impl_->offset + index * st[d];
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(std::move(s), std::move(st), off);
}

Tensor Tensor::expand(const Shape& shape) const {
  KILN_CHECK(shape.size() >= impl_->shape.size(), "[expand] cannot expand {} to {}",
             shape_str(impl_->shape), shape_str(shape));
  std::size_t lead = shape.size() - impl_->shape.size();
  Shape s(shape.size()), st(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      KILN_CHECK(shape[i] >= 0, "[expand] bad size in {}", shape_str(shape));
      s[i] = shape[i];
      st[i] = 0;
      continue;
    }
    std::int64_t have = impl_->shape[i - lead];
    std::int64_t want = shape[i] == -1 ? have : shape[i];
    if (have == want) {
      s[i] = have;
      st[i] = impl_->strides[i - lead];
    } else {
      KILN_CHECK(have == 1, "[expand] cannot expand {} to {}", shape_str(impl_->shape),
                 shape_str(shape));
      s[i] = want;
      st[i] = 0;
    }
  }
  return make_view(std::move(s), std::move(st), impl_->offset);
}

Tensor Tensor::unsqueeze(int d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = impl_->shape, st = impl_->strides;
  std::int64_t stv = d < dim() ? impl_->strides[d] * impl_->shape[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stv);
  return make_view(std::move(s), std::move(st), impl_->offset);
}

Tensor Tensor::squeeze(int d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (impl_->shape[d] != 1) return *this;
  Shape s = impl_->shape, st = impl_->strides;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(std::move(s), std::move(st), impl_->offset);
}

// ---- copies ---------------------------------------------------------------------

// Writes a contiguous buffer into a strided destination (same dtype).
static void scatter_strided(const char* src, char* dst, const Shape& shape, const Shape& strides,
                            std::size_t esize) {
  int nd = static_cast<int>(shape.size());
  std::int64_t n = shape_numel(shape);
  std::vector<std::int64_t> idx(nd, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += idx[d] * strides[d];
    std::memcpy(dst + off * static_cast<std::int64_t>(esize), src + i * esize, esize);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

void Tensor::copy_(const Tensor& src) {
  if ((device().is_cuda() || src.device().is_cuda()) && !device().is_meta()) {
    // Host <-> device and device <-> device copies, any dtypes and strides: the CUDA backend.
    for (auto st : strides())
      KILN_CHECK(st != 0 || numel() <= 1, "[copy] destination has broadcast (stride 0) dims");
    KILN_CHECK(!src.device().is_meta(), "[copy] cannot copy a meta tensor to {}: it has no data",
               device().str());
    if (numel() == 0) return;
    ops::CopyArgs a{*this,
                    src.dim() == dim() && src.shape() == shape() ? src : src.expand(shape())};
    ops::run(a);
    return;
  }
  if (!is_contiguous()) {
    for (auto st : strides())
      KILN_CHECK(st != 0, "[copy] destination has broadcast (stride 0) dims");
    if (numel() == 0) return;
    // A dense source of the same dtype and shape that does not alias us (a KV-cache slot filled
    // from fresh keys) is scattered directly; anything else is staged in a dense buffer first.
    // Both decisions are made on meta too, so the dry run charges what the CPU does.
    const bool direct = src.dtype() == dtype() && src.shape() == shape() && src.is_contiguous() &&
                        !src.same_storage(*this);
    if (direct && device().is_meta()) return;
    Tensor tmp = direct ? src : [&] {
      MemoryScope scratch(MemCategory::Temporaries);
      Tensor t = empty(shape(), dtype(), device());
      t.copy_(src);
      return t;
    }();
    if (device().is_meta()) return;
    KILN_CHECK(device().is_cpu() && src.device().is_cpu(), "[copy] {} copies need the CUDA backend",
               device().str());
    scatter_strided(static_cast<const char*>(tmp.raw_data()), static_cast<char*>(raw_data()),
                    shape(), strides(), dtype_size(dtype()));
    return;
  }
  Tensor s = src.dim() == dim() && src.shape() == shape() ? src : src.expand(shape());
  KILN_CHECK(s.device() == device() || device().is_meta(),
             "[copy] cross-device copy {} -> {} is not supported yet", s.device().str(),
             device().str());
  if (device().is_meta() || numel() == 0) return;
  KILN_CHECK(device().is_cpu(), "[copy] {} copies need the CUDA backend", device().str());
  // Same dtype and both contiguous: one memcpy (unless they alias).
  if (s.dtype() == dtype() && s.is_contiguous()) {
    if (s.raw_data() != raw_data()) std::memmove(raw_data(), s.raw_data(), nbytes());
    return;
  }
  ops::CopyArgs a{*this, s};
  ops::run(a);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device d) const { return to(d, dtype()); }
Tensor Tensor::to(DType t) const { return to(device(), t); }

Tensor Tensor::to(Device d, DType t) const {
  if (d == device() && t == dtype()) return *this;
  if (d == device() || d.is_meta()) {
    Tensor out = empty(shape(), t, d);
    out.copy_(*this);
    return out;
  }
  KILN_CHECK(!device().is_meta(), "[to] cannot copy a meta tensor to {}: it has no data", d.str());
  // CPU <-> CUDA (and between CUDA devices): a new tensor on d, filled by the CUDA copy.
  Tensor out = empty(shape(), t, d);
  out.copy_(*this);
  return out;
}

// ---- values ---------------------------------------------------------------------

double Tensor::item() const {
  KILN_CHECK(numel() == 1, "[item] tensor of shape {} has {} elements, not 1", shape_str(shape()),
             numel());
  return to_double_vector()[0];
}

std::vector<double> Tensor::to_double_vector() const {
  if (device().is_cuda()) return to(Device::cpu()).to_double_vector();
  // A meta tensor has no values; it reads as zeros, so that a dry run (the budget's, the
  // SimulatedCuda tests') follows the real control flow: a loss is logged, a token sampled.
  if (device().is_meta()) return std::vector<double>(static_cast<std::size_t>(numel()), double(0));
  KILN_CHECK(device().is_cpu(), "[tensor] reading values of a {} tensor", device().str());
  std::vector<double> out(static_cast<std::size_t>(numel()));
  if (out.empty()) return out;
  dispatch_dtype(dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    cpu::copy_strided<S, double>(dim(), shape().data(), static_cast<const S*>(raw_data()),
                                 strides().data(), out.data());
  });
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  if (device().is_cuda()) return to(Device::cpu()).to_float_vector();
  // A meta tensor has no values; it reads as zeros, so that a dry run (the budget's, the
  // SimulatedCuda tests') follows the real control flow: a loss is logged, a token sampled.
  if (device().is_meta()) return std::vector<float>(static_cast<std::size_t>(numel()), float(0));
  KILN_CHECK(device().is_cpu(), "[tensor] reading values of a {} tensor", device().str());
  std::vector<float> out(static_cast<std::size_t>(numel()));
  if (out.empty()) return out;
  dispatch_dtype(dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    cpu::copy_strided<S, float>(dim(), shape().data(), static_cast<const S*>(raw_data()),
                                strides().data(), out.data());
  });
  return out;
}

Tensor& Tensor::set_requires_grad(bool r) {
  KILN_CHECK(!r || is_floating(dtype()), "[autograd] only floating tensors can require grad");
  impl_->requires_grad = r;
  return *this;
}

Tensor& Tensor::set_name(std::string n) {
  impl_->name = std::move(n);
  return *this;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

// ---- printing -------------------------------------------------------------------

static void print_rec(std::ostringstream& os, const std::vector<double>& v, const Shape& shape,
                      int d, std::int64_t base, int max_per_dim, bool is_int, int indent) {
  std::int64_t n = shape[d];
  std::int64_t inner = 1;
  for (std::size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  os << '[';
  for (std::int64_t i = 0; i < n; ++i) {
    if (n > max_per_dim && i == max_per_dim / 2) {
      os << "...";
      i = n - max_per_dim / 2 - 1;
      os << (d + 1 == static_cast<int>(shape.size()) ? ", " : ",\n" + std::string(indent + 1, ' '));
      continue;
    }
    if (d + 1 == static_cast<int>(shape.size())) {
      double x = v[base + i];
      os << (is_int ? fmt::format("{}", static_cast<std::int64_t>(x)) : fmt::format("{:.4g}", x));
      if (i + 1 < n) os << ", ";
    } else {
      print_rec(os, v, shape, d + 1, base + i * inner, max_per_dim, is_int, indent + 1);
      if (i + 1 < n) os << ",\n" << std::string(indent + 1, ' ');
    }
  }
  os << ']';
}

std::string Tensor::str(int max_per_dim) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(";
  if (device().is_cpu()) {
    auto v = to_double_vector();
    if (dim() == 0) {
      os << fmt::format("{:.6g}", v[0]);
    } else {
      print_rec(os, v, shape(), 0, 0, std::max(max_per_dim, 2), !is_floating(dtype()), 7);
    }
    os << ", ";
  }
  os << "shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype());
  if (!device().is_cpu()) os << ", device=" << device().str();
  if (requires_grad()) os << ", requires_grad";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace kiln
