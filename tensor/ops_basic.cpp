// Front end for creation, elementwise, reduction and matmul ops.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/random.h"
#include "kernels/cpu/reduce.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops_util.h"

namespace kiln::ops {

// ---- creation -------------------------------------------------------------------

void fill_(Tensor& t, double value) {
  KILN_CHECK(t.is_contiguous(), "[fill] tensor must be contiguous");
  if (skip_kernel(t, "fill")) return;
  if (t.device().is_cuda()) return cuda_ops::fill(t, value);
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::fill<T>(t.numel(), cpu::convert_scalar<T>(value), t.data<T>());
  });
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

template <typename S>
static Tensor from_vector_impl(const std::vector<S>& v, const Shape& shape, DType dtype) {
  KILN_CHECK(shape_numel(shape) == static_cast<std::int64_t>(v.size()),
             "[from_vector] {} values for shape {}", v.size(), shape_str(shape));
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  if (v.empty()) return t;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::int64_t n = static_cast<std::int64_t>(v.size());
    cpu::copy_strided<S, T>(1, &n, v.data(), std::vector<std::int64_t>{1}.data(), t.data<T>());
  });
  return t;
}
Tensor from_vector(const std::vector<float>& v, const Shape& shape, DType dtype) {
  return from_vector_impl(v, shape, dtype);
}
Tensor from_vector(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return from_vector_impl(v, shape, dtype);
}
Tensor from_vector(const std::vector<std::int32_t>& v, const Shape& shape) {
  return from_vector_impl(v, shape, DType::I32);
}

static Tensor random_impl(bool normal, const Shape& shape, Generator& gen, double a, double b,
                          DType dtype, Device device) {
  KILN_CHECK(is_floating(dtype), "[random] needs a floating dtype, got {}", dtype_name(dtype));
  Tensor t = Tensor::empty(shape, dtype, device);
  std::uint64_t offset = gen.take(static_cast<std::uint64_t>(t.numel()));
  if (skip_kernel(t, "random")) return t;
  if (t.device().is_cuda()) {
    cuda_ops::random(normal, t, a, b, gen.seed, offset);
    return t;
  }
  // Draw in f32 (f64 for f64) and convert, so every dtype sees the same numbers.
  DType cd = dtype == DType::F64 ? DType::F64 : DType::F32;
  Tensor c = cd == dtype ? t : (MemoryScope(MemCategory::Temporaries), Tensor::empty(shape, cd));
  dispatch_compute(cd, "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (normal)
      cpu::random_normal<T>(c.numel(), a, b, gen.seed, offset, c.data<T>());
    else
      cpu::random_uniform<T>(c.numel(), a, b, gen.seed, offset, c.data<T>());
  });
  if (cd != dtype) t.copy_(c);
  return t;
}
Tensor randn(const Shape& shape, Generator& gen, double mean, double std, DType dtype,
             Device device) {
  return random_impl(true, shape, gen, mean, std, dtype, device);
}
Tensor rand_uniform(const Shape& shape, Generator& gen, double lo, double hi, DType dtype,
                    Device device) {
  return random_impl(false, shape, gen, lo, hi, dtype, device);
}

// ---- elementwise ----------------------------------------------------------------

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, "[{}] shapes {} and {} do not broadcast", op,
               shape_str(a), shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.dtype() == b.dtype(), "[binary] dtype mismatch {} vs {}", dtype_name(a.dtype()),
             dtype_name(b.dtype()));
  check_same_device(a, b, "binary");
  Shape shape = broadcast_shapes(a.shape(), b.shape(), "binary");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (skip_kernel(out, "binary")) return out;
  if (out.device().is_cuda()) {
    cuda_ops::binary(op, a.expand(shape), b.expand(shape), out);
    return out;
  }
  Computed ca(a), cb(b);
  Tensor ea = ca.t.expand(shape), eb = cb.t.expand(shape);
  Tensor co = compute_out(out);
  dispatch_compute(co.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::binary<T>(static_cast<cpu::BinaryOp>(op), static_cast<int>(shape.size()), shape.data(),
                   ea.data<T>(), ea.strides().data(), eb.data<T>(), eb.strides().data(),
                   co.data<T>());
  });
  finish_out(out, co);
  return out;
}

Tensor unary(Unary op, const Tensor& x) {
  Tensor out = empty_like(x);
  if (skip_kernel(out, "unary")) return out;
  if (out.device().is_cuda()) {
    cuda_ops::unary(op, x, out);
    return out;
  }
  Computed cx(x, true);
  Tensor co = compute_out(out);
  dispatch_compute(co.dtype(), "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::unary<T>(static_cast<cpu::UnaryOp>(op), x.numel(), cx.t.data<T>(), co.data<T>());
  });
  finish_out(out, co);
  return out;
}

Tensor affine(const Tensor& x, double alpha, double beta) {
  Tensor out = empty_like(x);
  if (skip_kernel(out, "affine")) return out;
  if (out.device().is_cuda()) {
    cuda_ops::affine(x, alpha, beta, out);
    return out;
  }
  Computed cx(x, true);
  Tensor co = compute_out(out);
  dispatch_compute(co.dtype(), "affine", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::mul_scalar<T>(x.numel(), cx.t.data<T>(), static_cast<T>(alpha), co.data<T>());
    if (beta != 0.0) cpu::add_scalar<T>(x.numel(), co.data<T>(), static_cast<T>(beta), co.data<T>());
  });
  finish_out(out, co);
  return out;
}

void axpy_(Tensor& y, double alpha, const Tensor& x) {
  KILN_CHECK(y.shape() == x.shape(), "[axpy] shapes {} and {} differ", shape_str(y.shape()),
             shape_str(x.shape()));
  KILN_CHECK(y.is_contiguous(), "[axpy] destination must be contiguous");
  check_same_device(x, y, "axpy");
  if (skip_kernel(y, "axpy")) return;
  if (y.device().is_cuda()) return cuda_ops::axpy(y, alpha, x);
  if (y.dtype() == x.dtype() && (y.dtype() == DType::F32 || y.dtype() == DType::F64)) {
    Tensor cx = x.contiguous();
    dispatch_compute(y.dtype(), "axpy", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cpu::axpy<T>(y.numel(), static_cast<T>(alpha), cx.data<T>(), y.data<T>());
    });
    return;
  }
  MemoryScope scratch(MemCategory::Temporaries);
  Tensor sum = add(y, affine(x.to(y.dtype()), alpha));
  y.copy_(sum);
}

void scale_(Tensor& y, double alpha) {
  KILN_CHECK(y.is_contiguous(), "[scale] tensor must be contiguous");
  if (skip_kernel(y, "scale")) return;
  if (y.device().is_cuda()) return cuda_ops::scale(y, alpha);
  if (y.dtype() == DType::F32 || y.dtype() == DType::F64) {
    dispatch_compute(y.dtype(), "scale", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cpu::mul_scalar<T>(y.numel(), y.data<T>(), static_cast<T>(alpha), y.data<T>());
    });
    return;
  }
  MemoryScope scratch(MemCategory::Temporaries);
  y.copy_(affine(y, alpha));
}

// ---- reductions -----------------------------------------------------------------

Tensor reduce(Reduce op, const Tensor& x, int dim, bool keepdim) {
  dim = wrap_dim(dim, x.dim(), "reduce");
  Shape shape = x.shape();
  std::int64_t outer = 1, n = shape[dim], inner = 1;
  for (int i = 0; i < dim; ++i) outer *= shape[i];
  for (int i = dim + 1; i < x.dim(); ++i) inner *= shape[i];
  if (keepdim)
    shape[dim] = 1;
  else
    shape.erase(shape.begin() + dim);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  if (skip_kernel(out, "reduce")) return out;
  KILN_CHECK(n > 0 || op == Reduce::Sum, "[reduce] max/min/mean over an empty dim");
  if (out.device().is_cuda()) {
    cuda_ops::reduce(op, x, outer, n, inner, out);
    return out;
  }
  Computed cx(x, true);
  Tensor co = compute_out(out);
  dispatch_compute(co.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::reduce<T>(static_cast<cpu::ReduceOp>(op), outer, n, inner, cx.t.data<T>(), co.data<T>());
  });
  finish_out(out, co);
  return out;
}

Tensor argmax(const Tensor& x, int dim) {
  dim = wrap_dim(dim, x.dim(), "argmax");
  Shape shape = x.shape();
  std::int64_t outer = 1, n = shape[dim], inner = 1;
  for (int i = 0; i < dim; ++i) outer *= shape[i];
  for (int i = dim + 1; i < x.dim(); ++i) inner *= shape[i];
  shape.erase(shape.begin() + dim);
  Tensor out = Tensor::empty(shape, DType::I64, x.device());
  if (skip_kernel(out, "argmax")) return out;
  KILN_CHECK(n > 0, "[argmax] over an empty dim");
  if (out.device().is_cuda()) {
    cuda_ops::argmax(x, outer, n, inner, out);
    return out;
  }
  Computed cx(x, true);
  dispatch_compute(cx.t.dtype(), "argmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::argmax<T>(outer, n, inner, cx.t.data<T>(), out.data<std::int64_t>());
  });
  return out;
}

Tensor sum_all(const Tensor& x) {
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  if (skip_kernel(out, "sum_all")) return out;
  if (out.device().is_cuda()) {
    cuda_ops::sum_all(x, out);
    return out;
  }
  Computed cx(x, true);
  Tensor co = compute_out(out);
  dispatch_compute(co.dtype(), "sum_all", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::sum_all<T>(x.numel(), cx.t.data<T>(), co.data<T>());
  });
  finish_out(out, co);
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor cur = x;
  // Leading dims that broadcasting added.
  while (cur.dim() > static_cast<int>(shape.size())) {
    if (cur.dim() > 1 && cur.size(0) != 1) {
      // Sum the leading dims at once: view as (lead, rest).
      std::int64_t lead = 1;
      int extra = cur.dim() - static_cast<int>(shape.size());
      for (int i = 0; i < extra; ++i) lead *= cur.size(i);
      Shape rest(cur.shape().begin() + extra, cur.shape().end());
      Shape flat = {lead};
      flat.insert(flat.end(), rest.begin(), rest.end());
      cur = reduce(Reduce::Sum, cur.reshape(flat), 0, false);
    } else {
      cur = cur.squeeze(0);
      if (cur.dim() > static_cast<int>(shape.size()) && cur.size(0) == 1) continue;
    }
  }
  for (int i = 0; i < cur.dim(); ++i)
    if (shape[i] == 1 && cur.size(i) != 1) cur = reduce(Reduce::Sum, cur, i, true);
  KILN_CHECK(cur.shape() == shape, "[sum_to] cannot reduce {} to {}", shape_str(x.shape()),
             shape_str(shape));
  return cur;
}

double sum_squares(const Tensor& x) {
  if (x.device().is_meta() || x.numel() == 0) return 0.0;
  if (x.device().is_cuda()) {
    double result = 0.0;
    cuda_ops::sum_squares(x, &result);
    return result;
  }
  Computed cx(x, true);
  return dispatch_compute(cx.t.dtype(), "sum_squares", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return cpu::sum_squares<T>(x.numel(), cx.t.data<T>());
  });
}

// ---- matmul ---------------------------------------------------------------------

void gemm_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
           double beta) {
  KILN_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "[gemm] needs 2-d tensors");
  KILN_CHECK(c.is_contiguous(), "[gemm] output must be contiguous");
  std::int64_t M = trans_a ? a.size(1) : a.size(0), K = trans_a ? a.size(0) : a.size(1);
  std::int64_t Kb = trans_b ? b.size(1) : b.size(0), N = trans_b ? b.size(0) : b.size(1);
  KILN_CHECK(K == Kb && c.size(0) == M && c.size(1) == N,
             "[gemm] shapes {}{} x {}{} -> {} do not match", shape_str(a.shape()),
             trans_a ? "^T" : "", shape_str(b.shape()), trans_b ? "^T" : "", shape_str(c.shape()));
  check_same_device(a, c, "gemm");
  check_same_device(b, c, "gemm");
  if (skip_kernel(c, "gemm")) return;
  if (c.device().is_cuda()) {
    KILN_CHECK(a.dtype() == c.dtype() && b.dtype() == c.dtype(),
               "[gemm] dtypes {} x {} -> {} differ", dtype_name(a.dtype()), dtype_name(b.dtype()),
               dtype_name(c.dtype()));
    return cuda_ops::gemm(c, a, b, trans_a, trans_b, alpha, beta);
  }
  KILN_CHECK(a.dtype() == c.dtype() && b.dtype() == c.dtype() &&
                 (c.dtype() == DType::F32 || c.dtype() == DType::F64),
             "[gemm] in-place gemm needs matching f32/f64 tensors");
  Tensor ca = a.contiguous(), cb = b.contiguous();
  dispatch_compute(c.dtype(), "gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::gemm<T>(trans_a, trans_b, M, N, K, static_cast<T>(alpha), ca.data<T>(), ca.size(1),
                 cb.data<T>(), cb.size(1), static_cast<T>(beta), c.data<T>(), N);
  });
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  KILN_CHECK(a.dtype() == b.dtype(), "[matmul] dtype mismatch {} vs {}", dtype_name(a.dtype()),
             dtype_name(b.dtype()));
  check_same_device(a, b, "matmul");
  KILN_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3) &&
                 !(a.dim() == 2 && b.dim() == 3),
             "[matmul] supports (M,K)@(K,N), (B,M,K)@(B,K,N) and (B,M,K)@(K,N); got {} @ {}",
             shape_str(a.shape()), shape_str(b.shape()));
  std::int64_t batch = a.dim() == 3 ? a.size(0) : 1;
  if (b.dim() == 3)
    KILN_CHECK(b.size(0) == batch, "[matmul] batch sizes {} and {} differ", batch, b.size(0));
  std::int64_t M = trans_a ? a.size(-1) : a.size(-2), K = trans_a ? a.size(-2) : a.size(-1);
  std::int64_t Kb = trans_b ? b.size(-1) : b.size(-2), N = trans_b ? b.size(-2) : b.size(-1);
  KILN_CHECK(K == Kb, "[matmul] inner sizes differ: {}{} @ {}{}", shape_str(a.shape()),
             trans_a ? "^T" : "", shape_str(b.shape()), trans_b ? "^T" : "");
  Shape out_shape = a.dim() == 3 ? Shape{batch, M, N} : Shape{M, N};
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  if (skip_kernel(out, "matmul")) return out;
  if (out.device().is_cuda()) {
    cuda_ops::matmul(a, b, trans_a, trans_b, out);
    return out;
  }
  Computed ca(a, true), cb(b, true);
  Tensor co = compute_out(out);
  dispatch_compute(co.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::int64_t lda = ca.t.size(-1), ldb = cb.t.size(-1);
    cpu::gemm_batched<T>(trans_a, trans_b, M, N, K, T(1), ca.t.data<T>(), lda,
                         a.dim() == 3 ? M * K : 0, cb.t.data<T>(), ldb, b.dim() == 3 ? K * N : 0,
                         T(0), co.data<T>(), N, M * N, batch);
  });
  finish_out(out, co);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  KILN_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
             "[linear] input {} does not match weight {}", shape_str(x.shape()),
             shape_str(w.shape()));
  KILN_CHECK(x.dtype() == w.dtype(), "[linear] dtype mismatch {} vs {}", dtype_name(x.dtype()),
             dtype_name(w.dtype()));
  check_same_device(x, w, "linear");
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  std::int64_t rows = x.numel() / std::max<std::int64_t>(x.size(-1), 1);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (skip_kernel(out, "linear")) return out;
  if (out.device().is_cuda()) {
    if (bias.defined()) check_same_device(bias, out, "linear");
    cuda_ops::linear(x, w, bias, out);
    return out;
  }
  Computed cx(x, true), cw(w, true);
  Tensor co = compute_out(out);
  Computed cbias(bias.defined() ? bias : Tensor(), true);
  dispatch_compute(co.dtype(), "linear", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::int64_t N = w.size(0), K = w.size(1);
    T beta = T(0);
    if (bias.defined()) {
      // Broadcast the bias into the output, then accumulate the product.
      const T* bp = cbias.t.data<T>();
      T* op = co.data<T>();
      for (std::int64_t r = 0; r < rows; ++r) std::copy(bp, bp + N, op + r * N);
      beta = T(1);
    }
    cpu::gemm<T>(false, true, rows, N, K, T(1), cx.t.data<T>(), K, cw.t.data<T>(), K, beta,
                 co.data<T>(), N);
  });
  finish_out(out, co);
  return out;
}

}  // namespace kiln::ops
