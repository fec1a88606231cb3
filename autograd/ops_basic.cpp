// Differentiable elementwise, reduction, view and matmul ops.
#include <numeric>

#include "autograd/grad_buffer.h"
#include "autograd/ops.h"
#include "tensor/op_args.h"

namespace kiln::ag {

namespace {

struct BinaryNode final : Node {
  Binary op;
  Tensor a, b;  // saved only when the backward needs them
  Shape a_shape, b_shape;
  bool need_a = false, need_b = false;
  std::string_view name() const override { return "binary"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    const Tensor& go = g[0];
    Tensor da, db;
    switch (op) {
      case Binary::Add:
        if (need_a) da = ops::sum_to(go, a_shape);
        if (need_b) db = ops::sum_to(go, b_shape);
        break;
      case Binary::Sub:
        if (need_a) da = ops::sum_to(go, a_shape);
        if (need_b) db = ops::sum_to(ops::affine(go, -1.0), b_shape);
        break;
      case Binary::Mul:
        if (need_a) da = ops::sum_to(ops::mul(go, b), a_shape);
        if (need_b) db = ops::sum_to(ops::mul(go, a), b_shape);
        break;
      case Binary::Div:
        if (need_a) da = ops::sum_to(ops::div(go, b), a_shape);
        if (need_b)  // d(a/b)/db = -a / b^2
          db = ops::sum_to(ops::affine(ops::div(ops::mul(go, a), ops::mul(b, b)), -1.0), b_shape);
        break;
      default:
        fail("[autograd] max/min have no gradient here");
    }
    return {da, db};
  }
  void release() override { a = b = Tensor(); }
};

Tensor binary_op(Binary op, const Tensor& a, const Tensor& b) {
  Tensor out = ops::binary(op, a, b);
  if (!needs_grad({&a, &b})) return out;
  auto n = std::make_shared<BinaryNode>();
  n->op = op;
  n->a_shape = a.shape();
  n->b_shape = b.shape();
  n->need_a = a.requires_grad();
  n->need_b = b.requires_grad();
  if (op == Binary::Mul || op == Binary::Div) {
    n->a = a;
    n->b = b;
  }
  return record(out, n, {&a, &b});
}

struct AffineNode final : Node {
  double alpha;
  std::string_view name() const override { return "affine"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    return {ops::affine(g[0], alpha)};
  }
};

struct UnaryNode final : Node {
  Unary op;
  Tensor x, y;
  std::string_view name() const override { return "unary"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    const Tensor& go = g[0];
    switch (op) {
      case Unary::Neg:
        return {ops::affine(go, -1.0)};
      case Unary::Exp:
        return {ops::mul(go, y)};
      case Unary::Log:
        return {ops::div(go, x)};
      case Unary::Sqrt:
        return {ops::affine(ops::div(go, y), 0.5)};
      case Unary::Rsqrt:  // -0.5 * y^3
        return {ops::affine(ops::mul(go, ops::mul(y, ops::mul(y, y))), -0.5)};
      case Unary::Square:
        return {ops::affine(ops::mul(go, x), 2.0)};
      case Unary::Reciprocal:
        return {ops::affine(ops::mul(go, ops::mul(y, y)), -1.0)};
      case Unary::Tanh:  // 1 - y^2
        return {ops::mul(go, ops::affine(ops::mul(y, y), -1.0, 1.0))};
      case Unary::Sigmoid:  // y (1 - y)
        return {ops::mul(go, ops::mul(y, ops::affine(y, -1.0, 1.0)))};
      case Unary::Abs:
        break;
    }
    fail("[autograd] abs has no gradient here");
  }
  void release() override { x = y = Tensor(); }
};

struct SumNode final : Node {
  Shape in_shape;
  int dim;
  bool keepdim;
  double scale;  // 1 for sum, 1/n for mean
  std::string_view name() const override { return "sum"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    Tensor go = keepdim ? g[0] : g[0].unsqueeze(dim);
    Tensor out = go.expand(in_shape).contiguous();
    if (out.same_storage(go)) out = out.clone();
    if (scale != 1.0) ops::scale_(out, scale);
    return {out};
  }
};

struct SumAllNode final : Node {
  Shape in_shape;
  double scale;
  std::string_view name() const override { return "sum_all"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    // Meta tensors have no value to read (the dry run only needs the allocation).
    double up = g[0].device().is_meta() ? 1.0 : g[0].item();
    Tensor out = ops::full(in_shape, up * scale, g[0].dtype(), g[0].device());
    return {out};
  }
};

struct ReshapeNode final : Node {
  Shape in_shape;
  std::string_view name() const override { return "reshape"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override { return {g[0].reshape(in_shape)}; }
};

struct PermuteNode final : Node {
  std::vector<int> inverse;
  std::string_view name() const override { return "permute"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override { return {g[0].permute(inverse)}; }
};

struct NarrowNode final : Node {
  Shape in_shape;
  int dim;
  std::int64_t start;
  std::string_view name() const override { return "narrow"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    Tensor out = ops::zeros(in_shape, g[0].dtype(), g[0].device());
    Tensor slice = out.narrow(dim, start, g[0].size(dim));
    slice.copy_(g[0]);
    return {out};
  }
};

struct ExpandNode final : Node {
  Shape in_shape;
  std::string_view name() const override { return "expand"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    return {ops::sum_to(g[0], in_shape)};
  }
};

struct ToDtypeNode final : Node {
  DType in_dtype;
  std::string_view name() const override { return "to_dtype"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override { return {g[0].to(in_dtype)}; }
};

struct MatmulNode final : Node {
  Tensor a, b;
  bool ta, tb;
  std::string_view name() const override { return "matmul"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    const Tensor& go = g[0];
    Tensor da, db;
    if (next[0].valid()) da = ta ? ops::matmul(b, go, tb, true) : ops::matmul(go, b, false, !tb);
    if (next[1].valid()) db = tb ? ops::matmul(go, a, true, ta) : ops::matmul(a, go, !ta, false);
    return {da, db};
  }
  void release() override { a = b = Tensor(); }
};

struct LinearNode final : Node {
  Tensor x, w;
  Shape x_shape;
  bool has_bias;
  std::string_view name() const override { return "linear"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    std::int64_t in = w.size(1), outf = w.size(0);
    Tensor g2 = g[0].reshape({-1, outf}).contiguous();
    Tensor dx, dw, db;
    if (next[0].valid()) dx = ops::matmul(g2, w).reshape(x_shape);
    if (next[1].valid()) {
      Tensor x2 = x.reshape({-1, in});
      Tensor buf = leaf_grad_buffer(next[1]);
      // Accumulate straight into the gradient buffer (no (out, in) temporary) where a gemm
      // kernel takes the dtype natively (beta = 1): f32/f64/bf16 on the CPU, every float dtype on
      // CUDA.
      const bool gemm_dtype = ops::has_native_kernel<ops::GemmArgs>(g2.device(), g2.dtype());
      if (buf.defined() && buf.dtype() == g2.dtype() && x2.dtype() == g2.dtype() && gemm_dtype) {
        ops::gemm_(buf, g2, x2, true, false, 1.0, 1.0);  // dW += g^T x
      } else {
        dw = ops::matmul(g2, x2, true, false);
      }
    }
    if (has_bias && next[2].valid()) db = ops::sum(g2, 0);
    return {dx, dw, db};
  }
  void release() override { x = w = Tensor(); }
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(Binary::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(Binary::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(Binary::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(Binary::Div, a, b); }

Tensor affine(const Tensor& x, double alpha, double beta) {
  Tensor out = ops::affine(x, alpha, beta);
  if (!needs_grad({&x})) return out;
  auto n = std::make_shared<AffineNode>();
  n->alpha = alpha;
  return record(out, n, {&x});
}

Tensor unary(Unary op, const Tensor& x) {
  Tensor out = ops::unary(op, x);
  if (!needs_grad({&x})) return out;
  auto n = std::make_shared<UnaryNode>();
  n->op = op;
  if (op == Unary::Log || op == Unary::Square) n->x = x;
  if (op == Unary::Exp || op == Unary::Sqrt || op == Unary::Rsqrt || op == Unary::Tanh ||
      op == Unary::Sigmoid || op == Unary::Reciprocal)
    n->y = out.detach();
  return record(out, n, {&x});
}

static Tensor reduce_sum(const Tensor& x, int dim, bool keepdim, bool is_mean) {
  dim = wrap_dim(dim, x.dim(), "sum");
  Tensor out = is_mean ? ops::mean(x, dim, keepdim) : ops::sum(x, dim, keepdim);
  if (!needs_grad({&x})) return out;
  auto n = std::make_shared<SumNode>();
  n->in_shape = x.shape();
  n->dim = dim;
  n->keepdim = keepdim;
  n->scale = is_mean ? 1.0 / static_cast<double>(x.size(dim)) : 1.0;
  return record(out, n, {&x});
}
Tensor sum(const Tensor& x, int dim, bool keepdim) { return reduce_sum(x, dim, keepdim, false); }
Tensor mean(const Tensor& x, int dim, bool keepdim) { return reduce_sum(x, dim, keepdim, true); }

static Tensor reduce_all(const Tensor& x, double scale) {
  Tensor out = ops::sum_all(x);
  if (scale != 1.0) ops::scale_(out, scale);
  if (!needs_grad({&x})) return out;
  auto n = std::make_shared<SumAllNode>();
  n->in_shape = x.shape();
  n->scale = scale;
  return record(out, n, {&x});
}
Tensor sum_all(const Tensor& x) { return reduce_all(x, 1.0); }
Tensor mean_all(const Tensor& x) {
  return reduce_all(x, 1.0 / static_cast<double>(std::max<std::int64_t>(x.numel(), 1)));
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor out = x.reshape(shape);
  if (!needs_grad({&x})) return out;
  if (out.same_storage(x)) out = out.detach();  // a view: a new handle for the graph
  auto n = std::make_shared<ReshapeNode>();
  n->in_shape = x.shape();
  return record(out, n, {&x});
}

Tensor permute(const Tensor& x, const std::vector<int>& dims) {
  Tensor out = x.permute(dims);
  if (!needs_grad({&x})) return out;
  out = out.detach();
  auto n = std::make_shared<PermuteNode>();
  n->inverse.resize(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i)
    n->inverse[wrap_dim(dims[i], x.dim(), "permute")] = static_cast<int>(i);
  return record(out, n, {&x});
}

Tensor transpose(const Tensor& x, int d0, int d1) {
  std::vector<int> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0, x.dim(), "transpose")], dims[wrap_dim(d1, x.dim(), "transpose")]);
  return permute(x, dims);
}

Tensor narrow(const Tensor& x, int dim, std::int64_t start, std::int64_t length) {
  Tensor out = x.narrow(dim, start, length);
  if (!needs_grad({&x})) return out;
  out = out.detach();
  auto n = std::make_shared<NarrowNode>();
  n->in_shape = x.shape();
  n->dim = wrap_dim(dim, x.dim(), "narrow");
  n->start = start;
  return record(out, n, {&x});
}

Tensor expand(const Tensor& x, const Shape& shape) {
  Tensor out = x.expand(shape);
  if (!needs_grad({&x})) return out;
  out = out.detach();
  auto n = std::make_shared<ExpandNode>();
  n->in_shape = x.shape();
  return record(out, n, {&x});
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = x.contiguous();
  if (!needs_grad({&x})) return out;
  auto n = std::make_shared<ReshapeNode>();  // identity on the gradient
  n->in_shape = x.shape();
  return record(out, n, {&x});
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = x.to(dtype);
  if (!needs_grad({&x})) return out;
  auto n = std::make_shared<ToDtypeNode>();
  n->in_dtype = x.dtype();
  return record(out, n, {&x});
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  // (B, M, K) @ (K, N): fold the batch into M so the weight gradient is one GEMM.
  if (a.dim() == 3 && b.dim() == 2 && !trans_a) {
    Tensor out = matmul(reshape(a, {-1, a.size(2)}), b, false, trans_b);
    return reshape(out, {a.size(0), a.size(1), out.size(1)});
  }
  Tensor out = ops::matmul(a, b, trans_a, trans_b);
  if (!needs_grad({&a, &b})) return out;
  KILN_CHECK(!(a.dim() == 3 && b.dim() == 2), "[matmul] no gradient for (B,K,M)^T @ (K,N)");
  auto n = std::make_shared<MatmulNode>();
  n->ta = trans_a;
  n->tb = trans_b;
  if (b.requires_grad()) n->a = a;
  if (a.requires_grad()) n->b = b;
  return record(out, n, {&a, &b});
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  Tensor out = ops::linear(x, w, bias);
  if (!needs_grad({&x, &w, &bias})) return out;
  auto n = std::make_shared<LinearNode>();
  n->has_bias = bias.defined();
  n->w = w;
  n->x_shape = x.shape();
  if (w.requires_grad()) n->x = x;
  return record(out, n, {&x, &w, &bias});
}

}  // namespace kiln::ag
