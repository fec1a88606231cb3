// CUDA glue, basic family: copy, fill, random, elementwise and reductions, on the kernels of
// kernels/cuda/{copy,elementwise,random,reduce}, as typed entries registered beside their bodies
// (tensor/kernels_cuda_glue.h). The front end (tensor/ops_basic.cpp, Tensor::copy_) has checked
// shapes, dtypes and contiguity and expanded broadcast operands to the output's shape; the
// dispatcher has put every operand on the op's device.
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
#include "tensor/kernels_cuda_glue.h"
#include "tensor/op_args.h"

#if defined(KILN_CUDA)
#include <cstring>

#include "kernels/cpu/copy.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/random.h"
#include "kernels/cuda/reduce.h"
#include "tensor/memory.h"
#endif

namespace kiln::ops {
namespace cuda_glue {
namespace {

// Every entry of this family: run() on T, the dtype the entry was registered for.
template <class T>
struct CopyCuda {
  static void run(CopyArgs& a);
};
template <class T>
struct FillCuda {
  static void run(FillArgs& a);
};
template <class T>
struct RandomCuda {
  static void run(RandomArgs& a);
};
template <class T>
struct BinaryCuda {
  static void run(BinaryArgs& a);
};
template <class T>
struct UnaryCuda {
  static void run(UnaryArgs& a);
};
template <class T>
struct AffineCuda {
  static void run(AffineArgs& a);
};
template <class T>
struct AxpyCuda {
  static void run(AxpyArgs& a);
};
template <class T>
struct ScaleCuda {
  static void run(ScaleArgs& a);
};
template <class T>
struct ReduceCuda {
  static void run(ReduceArgs& a);
};
template <class T>
struct ArgmaxCuda {
  static void run(ArgmaxArgs& a);
};
template <class T>
struct SumAllCuda {
  static void run(SumAllArgs& a);
};
template <class T>
struct SumSquaresCuda {
  static void run(SumSquaresArgs& a);
};

#if defined(KILN_CUDA)

constexpr cuda::StreamHandle kStream = nullptr;  // the legacy default stream

// A strided view whose covering range exceeds 2 * numel + this many elements is packed before
// it crosses the bus, rather than sent with its gaps.
constexpr std::int64_t kSpanSlack = 1024;

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

// ---- copy, fill, random -------------------------------------------------------------------------

// Any pair of devices where one is CUDA (h2d, d2h, d2d), any dtypes, any src strides (broadcast
// dims already expanded to dst's shape); dst may be strided (no stride 0). One body for every
// dtype pair: registered per destination dtype.
void copy_any(Tensor& dst, const Tensor& src) {
  const Device dd = dst.device(), sd = src.device();
  KILN_CHECK((dd.is_cuda() || dd.is_cpu()) && (sd.is_cuda() || sd.is_cpu()) &&
                 (dd.is_cuda() || sd.is_cuda()),
             "[copy] {} -> {} is not a copy the CUDA backend makes", sd.str(), dd.str());
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

template <class T>
void CopyCuda<T>::run(CopyArgs& a) {
  copy_any(a.dst, a.src);
}

template <class T>
void FillCuda<T>::run(FillArgs& a) {
  const T v = cpu::convert_scalar<T>(a.value);  // the CPU's conversion: both fill the same bits
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  cuda::fill_bits(a.t.raw_data(), a.t.numel(), static_cast<int>(sizeof(T)), bits, kStream);
}

template <class T>
void RandomCuda<T>::run(RandomArgs& a) {
  if (a.normal)
    cuda::random_normal<T>(a.t.numel(), a.a, a.b, a.seed, a.offset, a.t.data<T>(), kStream);
  else
    cuda::random_uniform<T>(a.t.numel(), a.a, a.b, a.seed, a.offset, a.t.data<T>(), kStream);
}

// ---- elementwise --------------------------------------------------------------------------------

template <class T>
void BinaryCuda<T>::run(BinaryArgs& a) {
  const Tensor x = a.a.expand(a.out.shape()), y = a.b.expand(a.out.shape());
  cuda::binary<T>(to_cuda(a.op), plan_of("binary", a.out, x, y), x.data<T>(), y.data<T>(),
                  a.out.data<T>(), kStream);
}

template <class T>
void UnaryCuda<T>::run(UnaryArgs& a) {
  cuda::unary<T>(to_cuda(a.op), plan_of("unary", a.out, a.x), a.x.data<T>(), a.out.data<T>(),
                 kStream);
}

template <class T>
void AffineCuda<T>::run(AffineArgs& a) {
  cuda::affine<T>(plan_of("affine", a.out, a.x), a.x.data<T>(), static_cast<float>(a.alpha),
                  static_cast<float>(a.beta), a.out.data<T>(), kStream);
}

// y in T; x in any float dtype (a bf16 gradient into an f32 one), widened in registers.
template <class T>
void AxpyCuda<T>::run(AxpyArgs& a) {
  const cuda::StridedPlan plan = plan_of("axpy", a.y, a.y, a.x);
  dispatch_float(a.x.dtype(), "axpy", [&](auto xtag) {
    using Tx = typename decltype(xtag)::type;
    cuda::axpy<T, Tx>(plan, static_cast<float>(a.alpha), a.x.data<Tx>(), a.y.data<T>(), kStream);
  });
}

template <class T>
void ScaleCuda<T>::run(ScaleArgs& a) {
  cuda::scale<T>(a.y.numel(), static_cast<float>(a.alpha), a.y.data<T>(), kStream);
}

// ---- reductions ---------------------------------------------------------------------------------

template <class T>
void ReduceCuda<T>::run(ReduceArgs& a) {
  const cuda::ReducePlan plan = cuda::plan_reduce("reduce", a.x.dim(), a.x.shape().data(),
                                                  a.x.strides().data(), a.outer, a.n, a.inner);
  cuda::reduce<T>(to_cuda(a.op), plan, a.x.data<T>(), a.out.data<T>(), kStream);
}

template <class T>
void ArgmaxCuda<T>::run(ArgmaxArgs& a) {
  const cuda::ReducePlan plan = cuda::plan_reduce("argmax", a.x.dim(), a.x.shape().data(),
                                                  a.x.strides().data(), a.outer, a.n, a.inner);
  cuda::argmax<T>(plan, a.x.data<T>(), a.out.data<std::int64_t>(), kStream);
}

template <class T>
void SumAllCuda<T>::run(SumAllArgs& a) {
  cuda::sum_all<T>(plan_of("sum_all", a.x, a.x), a.x.data<T>(), a.out.data<T>(), kStream);
}

// Sum of squares in f32 (f64 accumulation across blocks), copied to the host.
template <class T>
void SumSquaresCuda<T>::run(SumSquaresArgs& a) {
  a.result = cuda::sum_squares<T>(plan_of("sum_squares", a.x, a.x), a.x.data<T>(), kStream);
}

#endif  // KILN_CUDA

}  // namespace

// The glue reads strided inputs itself (the kernels walk a collapsed plan of the strides), so
// these entries are Layout::Strided: no dense copies, no scratch.
void register_basic() {
  const Layout S = Layout::Strided;
  register_cuda<CopyArgs, CopyCuda, float, double, bf16, f16, std::int32_t, std::int64_t,
                std::uint8_t>({.layout = S});
  register_cuda<FillArgs, FillCuda, float, double, bf16, f16, std::int32_t, std::int64_t,
                std::uint8_t>({.layout = S});
  // f64 too: the Philox stream matches the CPU's in every float dtype (random.cu instantiates
  // double, and CudaBasic.RandomMatchesCpuStream compares it).
  register_cuda<RandomArgs, RandomCuda, float, double, bf16, f16>({.layout = S});
  register_cuda<BinaryArgs, BinaryCuda, float, bf16, f16>({.layout = S});
  register_cuda<UnaryArgs, UnaryCuda, float, bf16, f16>({.layout = S});
  register_cuda<AffineArgs, AffineCuda, float, bf16, f16>({.layout = S});
  // The kernel widens x from any float dtype in registers (bf16 gradients into f32 ones).
  register_cuda<AxpyArgs, AxpyCuda, float, bf16, f16>({.layout = S, .mixed_inputs = true});
  register_cuda<ScaleArgs, ScaleCuda, float, bf16, f16>({.layout = S});
  register_cuda<ReduceArgs, ReduceCuda, float, bf16, f16>({.layout = S});
  register_cuda<ArgmaxArgs, ArgmaxCuda, float, bf16, f16>({.layout = S});
  register_cuda<SumAllArgs, SumAllCuda, float, bf16, f16>({.layout = S});
  register_cuda<SumSquaresArgs, SumSquaresCuda, float, bf16, f16>({.layout = S});
}

}  // namespace cuda_glue
}  // namespace kiln::ops
