// CUDA front end, basic family (see tensor/kernels_cuda.h): copy, fill, random, elementwise and
// reductions, on the kernels of kernels/cuda/{copy,elementwise,random,reduce}.
//
// Strided inputs go to the kernels as they are (the kernels walk a collapsed plan of the
// strides), so these ops allocate no scratch on the device: the meta dry run, which allocates
// only the outputs, predicts them exactly. The exceptions are host <-> device copies that need
// strides or a dtype conversion, which stage through a Temporaries buffer:
//   h2d: the source's covering byte range goes to a device buffer as is, then a device kernel
//        converts and scatters into dst (a sparse source is packed on the CPU first);
//   d2h: the covering range comes back to a host buffer, then the CPU copy kernel converts and
//        gathers (a sparse source is packed on the device first).
// Everything runs on the legacy default stream.
#include "tensor/kernels_cuda.h"

#if defined(KILN_CUDA)

#include <cstring>

#include "kernels/cpu/copy.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/random.h"
#include "kernels/cuda/reduce.h"
#include "tensor/dispatch.h"
#include "tensor/memory.h"

namespace kiln::ops::cuda_ops {
namespace {

constexpr cuda::StreamHandle kStream = nullptr;  // the legacy default stream

// A strided view whose covering range exceeds 2 * numel + this many elements is packed before
// it crosses the bus, rather than sent with its gaps.
constexpr std::int64_t kSpanSlack = 1024;

void check_on_cuda(const Tensor& t, const char* op, const char* what) {
  KILN_CHECK(t.device().is_cuda(), "[{}] {} is on {}, not a CUDA device", op, what,
             t.device().str());
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.shape() == b.shape(), "[{}] shapes {} and {} differ", op, shape_str(a.shape()),
             shape_str(b.shape()));
}

// Walk over `shape_of`'s shape with x's strides (and y's).
cuda::StridedPlan plan_of(const char* op, const Tensor& shape_of, const Tensor& x) {
  return cuda::plan_strided(op, shape_of.dim(), shape_of.shape().data(), x.strides().data());
}
cuda::StridedPlan plan_of(const char* op, const Tensor& shape_of, const Tensor& x,
                          const Tensor& y) {
  return cuda::plan_strided(op, shape_of.dim(), shape_of.shape().data(), x.strides().data(),
                            y.strides().data());
}

std::int64_t span_of(const Tensor& t) {
  return cuda::covering_span(t.dim(), t.shape().data(), t.strides().data());
}
bool sparse(const Tensor& t) { return span_of(t) > 2 * t.numel() + kSpanSlack; }

// Device kernel: dst[...] = convert(src[...]) with src read at src_ptr through `src_strides`
// (which may index a staging buffer rather than src's own storage). dst is on the device.
void device_copy(const Shape& shape, DType src_dtype, const void* src_ptr, const Shape& src_strides,
                 Tensor& dst) {
  const cuda::StridedPlan plan =
      cuda::plan_strided("copy", static_cast<int>(shape.size()), shape.data(), src_strides.data(),
                         dst.strides().data());
  dispatch_dtype(src_dtype, [&](auto stag) {
    using S = typename decltype(stag)::type;
    dispatch_dtype(dst.dtype(), [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      cuda::copy_strided<S, D>(plan, static_cast<const S*>(src_ptr),
                               static_cast<D*>(dst.raw_data()), kStream);
    });
  });
}

// src on the CPU, dst on a CUDA device; not both dense with one dtype.
void copy_h2d(Tensor& dst, const Tensor& src) {
  MemoryScope scratch(MemCategory::Temporaries);
  const Tensor host = sparse(src) ? src.contiguous() : src;  // packed on the CPU if sparse
  const std::int64_t span = span_of(host);
  Tensor staged = Tensor::empty({span}, src.dtype(), dst.device());
  cuda::memcpy_h2d(staged.raw_data(), host.raw_data(),
                   static_cast<std::size_t>(span) * dtype_size(src.dtype()), kStream);
  device_copy(dst.shape(), src.dtype(), staged.raw_data(), host.strides(), dst);
}

// src on a CUDA device, dst on the CPU; not both dense with one dtype.
void copy_d2h(Tensor& dst, const Tensor& src) {
  MemoryScope scratch(MemCategory::Temporaries);
  Tensor dsrc = src;
  if (sparse(src)) {  // packed on the device first
    dsrc = Tensor::empty(src.shape(), src.dtype(), src.device());
    device_copy(src.shape(), src.dtype(), src.raw_data(), src.strides(), dsrc);
  }
  const std::int64_t span = span_of(dsrc);
  Tensor host = Tensor::empty({span}, src.dtype(), Device::cpu());
  cuda::memcpy_d2h(host.raw_data(), dsrc.raw_data(),
                   static_cast<std::size_t>(span) * dtype_size(src.dtype()), kStream);
  // host[k] is dsrc's element at offset k, so dsrc's strides index it.
  if (dst.dtype() == src.dtype() && dsrc.is_contiguous()) {
    dst.copy_(host.view(dst.shape()));  // a CPU scatter into the strided dst
    return;
  }
  Tensor dense = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), Device::cpu());
  dispatch_dtype(src.dtype(), [&](auto stag) {
    using S = typename decltype(stag)::type;
    dispatch_dtype(dst.dtype(), [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      cpu::copy_strided<S, D>(dsrc.dim(), dsrc.shape().data(), host.data<S>(),
                              dsrc.strides().data(), dense.data<D>());
    });
  });
  if (dense.impl() != dst.impl()) dst.copy_(dense);
}

cuda::BinaryOp to_cuda(Binary op) {
  switch (op) {
    case Binary::Add:
      return cuda::BinaryOp::Add;
    case Binary::Sub:
      return cuda::BinaryOp::Sub;
    case Binary::Mul:
      return cuda::BinaryOp::Mul;
    case Binary::Div:
      return cuda::BinaryOp::Div;
    case Binary::Max:
      return cuda::BinaryOp::Max;
    case Binary::Min:
      return cuda::BinaryOp::Min;
  }
  fail("[binary] unknown op {}", static_cast<int>(op));
}

cuda::UnaryOp to_cuda(Unary op) {
  switch (op) {
    case Unary::Neg:
      return cuda::UnaryOp::Neg;
    case Unary::Exp:
      return cuda::UnaryOp::Exp;
    case Unary::Log:
      return cuda::UnaryOp::Log;
    case Unary::Sqrt:
      return cuda::UnaryOp::Sqrt;
    case Unary::Rsqrt:
      return cuda::UnaryOp::Rsqrt;
    case Unary::Abs:
      return cuda::UnaryOp::Abs;
    case Unary::Square:
      return cuda::UnaryOp::Square;
    case Unary::Reciprocal:
      return cuda::UnaryOp::Reciprocal;
    case Unary::Tanh:
      return cuda::UnaryOp::Tanh;
    case Unary::Sigmoid:
      return cuda::UnaryOp::Sigmoid;
  }
  fail("[unary] unknown op {}", static_cast<int>(op));
}

cuda::ReduceOp to_cuda(Reduce op) {
  switch (op) {
    case Reduce::Sum:
      return cuda::ReduceOp::Sum;
    case Reduce::Mean:
      return cuda::ReduceOp::Mean;
    case Reduce::Max:
      return cuda::ReduceOp::Max;
    case Reduce::Min:
      return cuda::ReduceOp::Min;
  }
  fail("[reduce] unknown op {}", static_cast<int>(op));
}

}  // namespace

// ---- copy, fill, random -------------------------------------------------------------------------

void copy(Tensor& dst, const Tensor& src) {
  check_same_shape(dst, src, "copy");
  if (dst.numel() == 0) return;
  const Device dd = dst.device(), sd = src.device();
  KILN_CHECK((dd.is_cuda() || dd.is_cpu()) && (sd.is_cuda() || sd.is_cpu()) &&
                 (dd.is_cuda() || sd.is_cuda()),
             "[copy] {} -> {} is not a copy the CUDA backend makes", sd.str(), dd.str());
  for (int d = 0; d < dst.dim(); ++d)
    KILN_CHECK(dst.stride(d) != 0 || dst.size(d) == 1,
               "[copy] destination has a broadcast (stride 0) dim {}", d);

  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    const std::size_t bytes = dst.nbytes();
    if (dd.is_cuda() && sd.is_cuda()) {
      if (dd.index != sd.index)
        cuda::memcpy_peer(dst.raw_data(), dd.index, src.raw_data(), sd.index, bytes, kStream);
      else if (dst.raw_data() != src.raw_data())
        cuda::memcpy_d2d(dst.raw_data(), src.raw_data(), bytes, kStream);
    } else if (dd.is_cuda()) {
      cuda::memcpy_h2d(dst.raw_data(), src.raw_data(), bytes, kStream);
    } else {
      cuda::memcpy_d2h(dst.raw_data(), src.raw_data(), bytes, kStream);
    }
    return;
  }
  if (dd.is_cuda() && sd.is_cuda()) {
    KILN_CHECK(dd.index == sd.index,
               "[copy] {} -> {}: copies between devices need one dtype and contiguous tensors "
               "(got {} -> {})",
               sd.str(), dd.str(), dtype_name(src.dtype()), dtype_name(dst.dtype()));
    if (dst.raw_data() == src.raw_data() && dst.dtype() == src.dtype() &&
        dst.strides() == src.strides())
      return;  // the same view
    device_copy(dst.shape(), src.dtype(), src.raw_data(), src.strides(), dst);
    return;
  }
  if (dd.is_cuda())
    copy_h2d(dst, src);
  else
    copy_d2h(dst, src);
}

void fill(Tensor& t, double value) {
  check_on_cuda(t, "fill", "the tensor");
  KILN_CHECK(t.is_contiguous(), "[fill] tensor must be contiguous");
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = cpu::convert_scalar<T>(value);  // the CPU's conversion, so both fill the same bits
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    cuda::fill_bits(t.raw_data(), t.numel(), static_cast<int>(sizeof(T)), bits, kStream);
  });
}

void random(bool normal, Tensor& t, double a, double b, std::uint64_t seed, std::uint64_t offset) {
  check_on_cuda(t, "random", "the tensor");
  KILN_CHECK(t.is_contiguous(), "[random] tensor must be contiguous");
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (normal)
      cuda::random_normal<T>(t.numel(), a, b, seed, offset, t.data<T>(), kStream);
    else
      cuda::random_uniform<T>(t.numel(), a, b, seed, offset, t.data<T>(), kStream);
  };
  if (t.dtype() == DType::F64) return run(TypeTag<double>{});
  dispatch_float(t.dtype(), "random", run);
}

// ---- elementwise --------------------------------------------------------------------------------

void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) {
  check_on_cuda(out, "binary", "the output");
  check_same_shape(a, out, "binary");
  check_same_shape(b, out, "binary");
  KILN_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(),
             "[binary] dtypes {} and {} -> {} differ", dtype_name(a.dtype()), dtype_name(b.dtype()),
             dtype_name(out.dtype()));
  KILN_CHECK(out.is_contiguous(), "[binary] output must be contiguous");
  const cuda::StridedPlan plan = plan_of("binary", out, a, b);
  dispatch_float(out.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::binary<T>(to_cuda(op), plan, a.data<T>(), b.data<T>(), out.data<T>(), kStream);
  });
}

void unary(Unary op, const Tensor& x, Tensor& out) {
  check_on_cuda(out, "unary", "the output");
  check_same_shape(x, out, "unary");
  KILN_CHECK(x.dtype() == out.dtype() && out.is_contiguous(),
             "[unary] output must be contiguous with the input's dtype");
  const cuda::StridedPlan plan = plan_of("unary", out, x);
  dispatch_float(out.dtype(), "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::unary<T>(to_cuda(op), plan, x.data<T>(), out.data<T>(), kStream);
  });
}

void affine(const Tensor& x, double alpha, double beta, Tensor& out) {
  check_on_cuda(out, "affine", "the output");
  check_same_shape(x, out, "affine");
  KILN_CHECK(x.dtype() == out.dtype() && out.is_contiguous(),
             "[affine] output must be contiguous with the input's dtype");
  const cuda::StridedPlan plan = plan_of("affine", out, x);
  dispatch_float(out.dtype(), "affine", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::affine<T>(plan, x.data<T>(), static_cast<float>(alpha), static_cast<float>(beta),
                    out.data<T>(), kStream);
  });
}

void axpy(Tensor& y, double alpha, const Tensor& x) {
  check_on_cuda(y, "axpy", "y");
  check_same_shape(x, y, "axpy");
  KILN_CHECK(y.is_contiguous(), "[axpy] destination must be contiguous");
  const cuda::StridedPlan plan = plan_of("axpy", y, y, x);
  dispatch_float(y.dtype(), "axpy", [&](auto ytag) {
    using Ty = typename decltype(ytag)::type;
    dispatch_float(x.dtype(), "axpy", [&](auto xtag) {
      using Tx = typename decltype(xtag)::type;
      cuda::axpy<Ty, Tx>(plan, static_cast<float>(alpha), x.data<Tx>(), y.data<Ty>(), kStream);
    });
  });
}

void scale(Tensor& y, double alpha) {
  check_on_cuda(y, "scale", "the tensor");
  KILN_CHECK(y.is_contiguous(), "[scale] tensor must be contiguous");
  dispatch_float(y.dtype(), "scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::scale<T>(y.numel(), static_cast<float>(alpha), y.data<T>(), kStream);
  });
}

// ---- reductions ---------------------------------------------------------------------------------

void reduce(Reduce op, const Tensor& x, std::int64_t outer, std::int64_t n, std::int64_t inner,
            Tensor& out) {
  check_on_cuda(out, "reduce", "the output");
  KILN_CHECK(out.dtype() == x.dtype() && out.is_contiguous() && out.numel() == outer * inner,
             "[reduce] output must be contiguous, {} elements of {}", outer * inner,
             dtype_name(x.dtype()));
  const cuda::ReducePlan plan =
      cuda::plan_reduce("reduce", x.dim(), x.shape().data(), x.strides().data(), outer, n, inner);
  dispatch_float(x.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::reduce<T>(to_cuda(op), plan, x.data<T>(), out.data<T>(), kStream);
  });
}

void argmax(const Tensor& x, std::int64_t outer, std::int64_t n, std::int64_t inner, Tensor& out) {
  check_on_cuda(out, "argmax", "the output");
  KILN_CHECK(out.dtype() == DType::I64 && out.is_contiguous() && out.numel() == outer * inner,
             "[argmax] output must be contiguous, {} elements of i64", outer * inner);
  const cuda::ReducePlan plan =
      cuda::plan_reduce("argmax", x.dim(), x.shape().data(), x.strides().data(), outer, n, inner);
  dispatch_float(x.dtype(), "argmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::argmax<T>(plan, x.data<T>(), out.data<std::int64_t>(), kStream);
  });
}

void sum_all(const Tensor& x, Tensor& out) {
  check_on_cuda(out, "sum_all", "the output");
  KILN_CHECK(out.numel() == 1 && out.dtype() == x.dtype(),
             "[sum_all] output must be one element of {}", dtype_name(x.dtype()));
  const cuda::StridedPlan plan = plan_of("sum_all", x, x);
  dispatch_float(x.dtype(), "sum_all", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::sum_all<T>(plan, x.data<T>(), out.data<T>(), kStream);
  });
}

void sum_squares(const Tensor& x, double* result) {
  check_on_cuda(x, "sum_squares", "the tensor");
  const cuda::StridedPlan plan = plan_of("sum_squares", x, x);
  *result = dispatch_float(x.dtype(), "sum_squares", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return cuda::sum_squares<T>(plan, x.data<T>(), kStream);
  });
}

}  // namespace kiln::ops::cuda_ops

#endif  // KILN_CUDA
