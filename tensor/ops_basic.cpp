// Front end for creation, elementwise, reduction and matmul ops: shape checks and output
// allocation, then the kernel table (tensor/kernel_table.h) runs the kernel.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/copy.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops_util.h"

namespace kiln::ops {

// ---- creation -------------------------------------------------------------------

void fill_(Tensor& t, double value) {
  KILN_CHECK(t.is_contiguous(), "[fill] tensor must be contiguous");
  FillArgs a{t, value};
  run(a);
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
  RandomArgs args{t, normal, a, b, gen.seed, offset};
  run(args);
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
  BinaryArgs args{op, a, b, Tensor::empty(shape, a.dtype(), a.device())};
  run(args);
  return args.out;
}

Tensor unary(Unary op, const Tensor& x) {
  UnaryArgs args{op, x, empty_like(x)};
  run(args);
  return args.out;
}

Tensor affine(const Tensor& x, double alpha, double beta) {
  AffineArgs args{x, empty_like(x), alpha, beta};
  run(args);
  return args.out;
}

void axpy_(Tensor& y, double alpha, const Tensor& x) {
  KILN_CHECK(y.shape() == x.shape(), "[axpy] shapes {} and {} differ", shape_str(y.shape()),
             shape_str(x.shape()));
  KILN_CHECK(y.is_contiguous(), "[axpy] destination must be contiguous");
  check_same_device(x, y, "axpy");
  AxpyArgs args{y, x, alpha};
  run(args);
}

void scale_(Tensor& y, double alpha) {
  KILN_CHECK(y.is_contiguous(), "[scale] tensor must be contiguous");
  ScaleArgs args{y, alpha};
  run(args);
}

// ---- reductions -----------------------------------------------------------------

namespace {

// x viewed as (outer, n, inner) around dim.
struct ReduceShape {
  std::int64_t outer = 1, n = 1, inner = 1;
};
ReduceShape reduce_shape(const Tensor& x, int dim) {
  ReduceShape r;
  r.n = x.size(dim);
  for (int i = 0; i < dim; ++i) r.outer *= x.size(i);
  for (int i = dim + 1; i < x.dim(); ++i) r.inner *= x.size(i);
  return r;
}

}  // namespace

Tensor reduce(Reduce op, const Tensor& x, int dim, bool keepdim) {
  dim = wrap_dim(dim, x.dim(), "reduce");
  const ReduceShape r = reduce_shape(x, dim);
  Shape shape = x.shape();
  if (keepdim)
    shape[dim] = 1;
  else
    shape.erase(shape.begin() + dim);
  ReduceArgs args{op, x, Tensor::empty(shape, x.dtype(), x.device()), r.outer, r.n, r.inner};
  KILN_CHECK(r.n > 0 || op == Reduce::Sum || args.out.numel() == 0,
             "[reduce] max/min/mean over an empty dim");
  run(args);
  return args.out;
}

Tensor argmax(const Tensor& x, int dim) {
  dim = wrap_dim(dim, x.dim(), "argmax");
  const ReduceShape r = reduce_shape(x, dim);
  Shape shape = x.shape();
  shape.erase(shape.begin() + dim);
  ArgmaxArgs args{x, Tensor::empty(shape, DType::I64, x.device()), r.outer, r.n, r.inner};
  KILN_CHECK(r.n > 0 || args.out.numel() == 0, "[argmax] over an empty dim");
  run(args);
  return args.out;
}

Tensor sum_all(const Tensor& x) {
  SumAllArgs args{x, Tensor::empty({}, x.dtype(), x.device())};
  run(args);
  return args.out;
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
  SumSquaresArgs args{x};
  run(args);
  return args.result;
}

double sum_squares_multi(std::span<const Tensor> tensors) {
  SumSquaresMultiArgs args;
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    KILN_CHECK(is_floating(t.dtype()), "[sum_squares_multi] {} tensor; expected a float dtype",
               dtype_name(t.dtype()));
    if (!args.tensors.empty()) check_same_device(args.tensors.front(), t, "sum_squares_multi");
    args.tensors.push_back(t);
  }
  if (args.tensors.empty()) return 0.0;
  run(args);
  return args.result;
}

Tensor dequantize(const Tensor& blocks, quant::QuantType type, const Shape& shape, DType dtype) {
  const quant::QuantInfo& q = quant::quant_info(type);
  const std::int64_t n = shape_numel(shape);
  KILN_CHECK(n % q.block_size == 0,
             "[dequantize] {} weights of shape {} are not whole {} blocks of {}", n,
             shape_str(shape), q.name, q.block_size);
  // Compared as block counts, so no product can overflow.
  KILN_CHECK(blocks.dtype() == DType::Bool && blocks.numel() % q.block_bytes == 0 &&
                 blocks.numel() / q.block_bytes == n / q.block_size,
             "[dequantize] {} weights in {} take {} blocks of {} bytes, got {} {} elements", n,
             q.name, n / q.block_size, q.block_bytes, blocks.numel(), dtype_name(blocks.dtype()));
  KILN_CHECK(is_floating(dtype), "[dequantize] weights must be a float dtype, got {}",
             dtype_name(dtype));
  DequantizeArgs a{blocks, Tensor::empty(shape, dtype, blocks.device()), type};
  run(a);
  return a.out;
}

Tensor linear_quant(const Tensor& x, const Tensor& blocks, quant::QuantType type, std::int64_t n,
                    const Tensor& bias) {
  const quant::QuantInfo& q = quant::quant_info(type);
  KILN_CHECK(x.dim() >= 1 && is_floating(x.dtype()) && x.dtype() != DType::F64,
             "[linear_quant] input must be f32, bf16 or f16 with at least one dim, got {} {}",
             dtype_name(x.dtype()), shape_str(x.shape()));
  const std::int64_t k = x.size(-1);
  KILN_CHECK(n > 0 && k > 0 && k % q.block_size == 0,
             "[linear_quant] a {} weight of {} x {} is not rows of whole blocks of {}", q.name, n,
             k, q.block_size);
  KILN_CHECK(blocks.dtype() == DType::Bool && blocks.numel() % q.block_bytes == 0 &&
                 blocks.numel() / q.block_bytes / n == k / q.block_size &&
                 blocks.numel() / q.block_bytes % n == 0,
             "[linear_quant] a {} weight of {} x {} takes {} blocks of {} bytes, got {} {} "
             "elements",
             q.name, n, k, n * (k / q.block_size), q.block_bytes, blocks.numel(),
             dtype_name(blocks.dtype()));
  check_same_device(x, blocks, "linear_quant");
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == n),
             "[linear_quant] bias {} does not match {} outputs", shape_str(bias.shape()), n);
  if (bias.defined()) check_same_device(bias, x, "linear_quant");
  Shape out_shape = x.shape();
  out_shape.back() = n;
  LinearQuantArgs a{x, blocks, bias, Tensor::empty(out_shape, x.dtype(), x.device()), type};
  run(a);
  return a.out;
}

Tensor embedding_quant(const Tensor& ids, const Tensor& blocks, quant::QuantType type,
                       std::int64_t vocab, DType dtype) {
  const quant::QuantInfo& q = quant::quant_info(type);
  KILN_CHECK(ids.dtype() == DType::I32, "[embedding_quant] token ids must be i32, got {}",
             dtype_name(ids.dtype()));
  KILN_CHECK(blocks.dtype() == DType::Bool && blocks.dim() == 1 && vocab > 0 &&
                 blocks.numel() % vocab == 0 && blocks.numel() / vocab % q.block_bytes == 0,
             "[embedding_quant] {} {} bytes are not {} rows of whole {} blocks", blocks.numel(),
             dtype_name(blocks.dtype()), vocab, q.name);
  KILN_CHECK(is_floating(dtype), "[embedding_quant] rows must be a float dtype, got {}",
             dtype_name(dtype));
  const std::int64_t row_bytes = blocks.numel() / vocab;
  const std::int64_t dim = row_bytes / q.block_bytes * q.block_size;
  Shape shape = ids.shape();
  shape.push_back(dim);
  // The rows' blocks gathered into one scratch buffer, then one dequantize into the output: the
  // same allocations on every device, meta included (the dry run charges what a run holds).
  const std::int64_t n = ids.numel();
  Tensor gathered;
  {
    MemoryScope scratch(MemCategory::Temporaries);
    gathered = Tensor::empty({n * row_bytes}, DType::Bool, blocks.device());
  }
  if (!blocks.device().is_meta()) {  // meta: no ids to read, the shape is the answer
    const std::vector<double> v = ids.to_double_vector();
    for (std::int64_t i = 0; i < n; ++i) {
      const auto id = static_cast<std::int64_t>(v[static_cast<std::size_t>(i)]);
      KILN_CHECK(id >= 0 && id < vocab, "[embedding_quant] token id {} out of range [0, {})", id,
                 vocab);
      gathered.narrow(0, i * row_bytes, row_bytes)
          .copy_(blocks.narrow(0, id * row_bytes, row_bytes));
    }
  }
  return dequantize(gathered, type, {n, dim}, dtype).reshape(shape);
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
  KILN_CHECK(a.dtype() == c.dtype() && b.dtype() == c.dtype(), "[gemm] dtypes {} x {} -> {} differ",
             dtype_name(a.dtype()), dtype_name(b.dtype()), dtype_name(c.dtype()));
  GemmArgs args{c, a, b, trans_a, trans_b, alpha, beta};
  run(args);
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
  MatmulArgs args{a, b, Tensor::empty(out_shape, a.dtype(), a.device()), trans_a, trans_b};
  run(args);
  return args.out;
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
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(0)),
             "[linear] bias {} does not match {} outputs", shape_str(bias.shape()), w.size(0));
  if (bias.defined()) check_same_device(bias, x, "linear");
  LinearArgs args{x, w, bias, Tensor::empty(out_shape, x.dtype(), x.device())};
  run(args);
  return args.out;
}

}  // namespace kiln::ops
