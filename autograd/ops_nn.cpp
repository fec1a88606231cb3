// Differentiable nn ops, backed by the fused forward/backward kernel pairs.
#include "autograd/grad_buffer.h"
#include "autograd/ops.h"
#include "tensor/op_args.h"

namespace kiln::ag {

namespace {

struct SoftmaxNode final : Node {
  Tensor y;
  bool log;
  std::string_view name() const override { return log ? "log_softmax" : "softmax"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    return {log ? ops::log_softmax_backward(y, g[0]) : ops::softmax_backward(y, g[0])};
  }
  void release() override { y = Tensor(); }
};

struct EmbeddingNode final : Node {
  Tensor ids;
  Shape table_shape;
  DType table_dtype;
  std::string_view name() const override { return "embedding"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    // Accumulate straight into the gradient where a kernel takes its dtype natively (CUDA:
    // every float dtype, so a bf16 gradient needs no (V, C) f32 temporary).
    Tensor buf = leaf_grad_buffer(next[1]);
    const auto native = [&](DType dt) {
      return ops::has_native_kernel<ops::EmbeddingBackwardArgs>(g[0].device(), dt);
    };
    if (buf.defined() && native(buf.dtype())) {
      ops::embedding_backward_(buf, ids, g[0]);  // += straight into .grad
      return {Tensor(), Tensor()};
    }
    if (native(table_dtype)) {
      Tensor d = ops::zeros(table_shape, table_dtype, g[0].device());
      ops::embedding_backward_(d, ids, g[0]);
      return {Tensor(), d};
    }
    DType acc = table_dtype == DType::F64 ? DType::F64 : DType::F32;
    Tensor d = ops::zeros(table_shape, acc, g[0].device());
    ops::embedding_backward_(d, ids, g[0]);
    return {Tensor(), d.to(table_dtype)};
  }
  void release() override { ids = Tensor(); }
};

struct RmsNormNode final : Node {
  Tensor x, w, rstd;
  std::string_view name() const override { return "rmsnorm"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    Tensor dw;
    Tensor buf = next[1].valid() ? leaf_grad_buffer(next[1]) : Tensor();
    if (next[1].valid() && !buf.defined()) dw = ops::zeros(w.shape(), rstd.dtype(), w.device());
    Tensor* target = buf.defined() ? &buf : (dw.defined() ? &dw : nullptr);
    Tensor dx = ops::rmsnorm_backward(x, w, rstd, g[0], target);
    if (dw.defined() && dw.dtype() != w.dtype()) dw = dw.to(w.dtype());
    return {next[0].valid() ? dx : Tensor(), dw};
  }
  void release() override { x = w = rstd = Tensor(); }
};

struct LayerNormNode final : Node {
  Tensor x, w, mean, rstd;
  std::string_view name() const override { return "layernorm"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    Tensor wbuf = leaf_grad_buffer(next[1]), bbuf = leaf_grad_buffer(next[2]);
    Tensor dw, db;
    if (next[1].valid() && !wbuf.defined()) dw = ops::zeros(w.shape(), rstd.dtype(), w.device());
    if (next[2].valid() && !bbuf.defined()) db = ops::zeros(w.shape(), rstd.dtype(), w.device());
    Tensor* tw = wbuf.defined() ? &wbuf : (dw.defined() ? &dw : nullptr);
    Tensor* tb = bbuf.defined() ? &bbuf : (db.defined() ? &db : nullptr);
    Tensor dx = ops::layernorm_backward(x, w, mean, rstd, g[0], tw, tb);
    return {next[0].valid() ? dx : Tensor(), dw, db};
  }
  void release() override { x = w = mean = rstd = Tensor(); }
};

struct RopeNode final : Node {
  Tensor cos, sin;  // shared tables, not activations
  RopeStyle style;
  std::int64_t offset;
  std::string_view name() const override { return "rope"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    return {ops::rope(g[0], cos, sin, style, offset, true)};
  }
  void release() override { cos = sin = Tensor(); }
};

struct ActivationNode final : Node {
  Tensor x;
  Op op;
  std::string_view name() const override { return op_name(op); }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    return {ops::activation_backward(op, x, g[0])};
  }
  void release() override { x = Tensor(); }
};

struct SwiGluNode final : Node {
  Tensor gate, up;
  std::string_view name() const override { return "swiglu"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    auto [dg, du] = ops::swiglu_backward(gate, up, g[0]);
    return {dg, du};
  }
  void release() override { gate = up = Tensor(); }
};

struct AttentionNode final : Node {
  Tensor q, k, v, out, lse;
  double scale;
  std::string_view name() const override { return "attention"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    auto [dq, dk, dv] = ops::attention_backward(q, k, v, out, lse, g[0], scale);
    return {dq, dk, dv};
  }
  void release() override { q = k = v = out = lse = Tensor(); }
};

struct CrossEntropyNode final : Node {
  Tensor logits, lse, targets;
  std::int32_t ignore_index;
  double inv_count;
  std::string_view name() const override { return "cross_entropy"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    double up = g[0].device().is_meta() ? 1.0 : g[0].item();
    MemoryScope scope(MemCategory::Logits);  // the (N, V) logits gradient
    Tensor dloss = ops::full({logits.size(0)}, up * inv_count, lse.dtype(), logits.device());
    // When this node holds the only reference to the logits' memory (the usual case: the loss
    // is all the caller kept), nothing can read them again: write the gradient over them and
    // save an (N, V) buffer, the largest of the step (2048 x 32000 f32 = 262 MB in stories15M).
    const bool sole = logits.impl_ptr().use_count() == 1 && logits.storage().use_count() == 1;
    Tensor d = ops::cross_entropy_backward(logits, lse, targets, dloss, ignore_index, sole);
    logits = Tensor();
    return {d, Tensor()};
  }
  void release() override { logits = lse = targets = Tensor(); }
};

// The LM head and the loss in one node, with both gradients computed in forward, chunk by chunk
// (linear_cross_entropy below): backward only scales them by the upstream gradient.
struct LinearCrossEntropyNode final : Node {
  Tensor dh, dw;  // d(loss)/dh (N, C) and d(loss)/dW (V, C) for an upstream gradient of 1
  std::string_view name() const override { return "linear_cross_entropy"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    const double up = g[0].device().is_meta() ? 1.0 : g[0].item();
    if (up != 1.0) {
      if (dh.defined()) ops::scale_(dh, up);
      if (dw.defined()) ops::scale_(dw, up);
    }
    std::vector<Tensor> out{std::move(dh), std::move(dw), Tensor()};
    dh = dw = Tensor();
    return out;
  }
  void release() override { dh = dw = Tensor(); }
};

struct DropoutNode final : Node {
  Tensor mask;
  double p;
  std::string_view name() const override { return "dropout"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    return {ops::dropout_backward(g[0], mask, p)};
  }
  void release() override { mask = Tensor(); }
};

struct CheckpointNode final : Node {
  CheckpointFn fn;
  std::vector<Tensor> inputs;
  std::string_view name() const override { return "checkpoint"; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    std::vector<Tensor> detached, wanted;
    for (const auto& t : inputs) {
      Tensor d = t.detach();
      if (t.requires_grad()) {
        d.set_requires_grad(true);
        wanted.push_back(d);
      }
      detached.push_back(d);
    }
    Tensor out;
    {
      EnableGradGuard enable;
      MemoryScope recomputed(MemCategory::Activations);
      out = fn(detached);
    }
    std::vector<Tensor> gw = grad({out}, {g[0]}, wanted);
    std::vector<Tensor> result;
    std::size_t j = 0;
    for (const auto& t : inputs) result.push_back(t.requires_grad() ? gw[j++] : Tensor());
    return result;
  }
  void release() override { inputs.clear(); }
};

}  // namespace

Tensor softmax(const Tensor& x) {
  Tensor y = ops::softmax(x);
  if (!needs_grad({&x})) return y;
  auto n = std::make_shared<SoftmaxNode>();
  n->y = y.detach();
  n->log = false;
  return record(y, n, {&x});
}

Tensor log_softmax(const Tensor& x) {
  Tensor y = ops::log_softmax(x);
  if (!needs_grad({&x})) return y;
  auto n = std::make_shared<SoftmaxNode>();
  n->y = y.detach();
  n->log = true;
  return record(y, n, {&x});
}

Tensor embedding(const Tensor& ids, const Tensor& table) {
  Tensor out = ops::embedding(ids, table);
  if (!needs_grad({&table})) return out;
  auto n = std::make_shared<EmbeddingNode>();
  n->ids = ids;
  n->table_shape = table.shape();
  n->table_dtype = table.dtype();
  return record(out, n, {&ids, &table});
}

Tensor rmsnorm(const Tensor& x, const Tensor& w, double eps) {
  auto [y, rstd] = ops::rmsnorm(x, w, eps);
  if (!needs_grad({&x, &w})) return y;
  auto n = std::make_shared<RmsNormNode>();
  n->x = x;
  n->w = w;
  n->rstd = rstd;
  return record(y, n, {&x, &w});
}

Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  auto [y, mean, rstd] = ops::layernorm(x, w, b, eps);
  if (!needs_grad({&x, &w, &b})) return y;
  auto n = std::make_shared<LayerNormNode>();
  n->x = x;
  n->w = w;
  n->mean = mean;
  n->rstd = rstd;
  return record(y, n, {&x, &w, &b});
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style,
            std::int64_t pos_offset) {
  Tensor y = ops::rope(x, cos, sin, style, pos_offset, false);
  if (!needs_grad({&x})) return y;
  auto n = std::make_shared<RopeNode>();
  n->cos = cos;
  n->sin = sin;
  n->style = style;
  n->offset = pos_offset;
  return record(y, n, {&x});
}

Tensor activation(Op op, const Tensor& x) {
  Tensor y = ops::activation(op, x);
  if (!needs_grad({&x})) return y;
  auto n = std::make_shared<ActivationNode>();
  n->x = x;
  n->op = op;
  return record(y, n, {&x});
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor y = ops::swiglu(gate, up);
  if (!needs_grad({&gate, &up})) return y;
  auto n = std::make_shared<SwiGluNode>();
  n->gate = gate;
  n->up = up;
  return record(y, n, {&gate, &up});
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                 std::int64_t q_offset) {
  auto [out, lse] = ops::attention(q, k, v, scale, q_offset);
  if (!needs_grad({&q, &k, &v})) return out;
  KILN_CHECK(q_offset == 0 && q.size(1) == k.size(1),
             "[attention] gradients need Tq == Tk and q_offset 0 (training)");
  auto n = std::make_shared<AttentionNode>();
  n->q = q;
  n->k = k;
  n->v = v;
  n->out = out.detach();
  n->lse = lse;
  n->scale = scale;
  return record(out, n, {&q, &k, &v});
}

namespace {

// 1 / (rows whose target is not ignore_index), 0 when there are none. Meta tensors have no
// values: all rows count. CUDA targets are read back (N i32, one sync): counting all rows there
// would give a different mean than the CPU whenever a row is ignored.
double inverse_target_count(const Tensor& targets, std::int32_t ignore_index) {
  std::int64_t count = targets.numel();
  if (!targets.device().is_meta()) {
    MemoryScope scratch(MemCategory::Temporaries);
    Tensor t = targets.to(Device::cpu()).contiguous();
    const std::int32_t* p = t.data<std::int32_t>();
    count = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) count += p[i] != ignore_index;
  }
  return count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int32_t ignore_index) {
  MemoryScope scope(MemCategory::Logits);  // per-row loss and lse, and the loss itself
  auto [rows, lse] = ops::cross_entropy(logits, targets, ignore_index);
  const double inv_count = inverse_target_count(targets, ignore_index);
  Tensor loss = ops::sum_all(rows);
  ops::scale_(loss, inv_count);
  if (logits.dtype() != loss.dtype()) loss = loss.to(logits.dtype());
  if (!needs_grad({&logits})) return loss;
  auto n = std::make_shared<CrossEntropyNode>();
  n->logits = logits;
  n->lse = lse;
  n->targets = targets;
  n->ignore_index = ignore_index;
  n->inv_count = inv_count;
  return record(loss, n, {&logits, &targets});
}

Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                            std::int32_t ignore_index, std::int64_t chunk_rows) {
  KILN_CHECK(h.dim() == 2 && w.dim() == 2 && h.size(1) == w.size(1),
             "[linear_cross_entropy] h (N, C) and w (V, C) expected, got {} and {}",
             shape_str(h.shape()), shape_str(w.shape()));
  KILN_CHECK(targets.dim() == 1 && targets.size(0) == h.size(0) && targets.dtype() == DType::I32,
             "[linear_cross_entropy] targets must be i32 ({}), got {} {}", h.size(0),
             dtype_name(targets.dtype()), shape_str(targets.shape()));
  KILN_CHECK(h.device() == w.device() && h.device() == targets.device(),
             "[linear_cross_entropy] tensors on different devices: {}, {} and {}", h.device().str(),
             w.device().str(), targets.device().str());
  const std::int64_t N = h.size(0), C = h.size(1);
  KILN_CHECK(N > 0, "[linear_cross_entropy] no rows: the mean loss of 0 targets is undefined");
  const double inv_count = inverse_target_count(targets, ignore_index);
  const bool want_dh = needs_grad({&h}), want_dw = needs_grad({&w});
  const std::int64_t rows_per = chunk_rows > 0 ? std::min(chunk_rows, N) : N;
  const bool chunked = rows_per < N;
  const Device dev = h.device();
  // The (V, C) gradient accumulates chunk by chunk with beta = 1 where a gemm kernel takes the
  // dtype natively, as the linear backward's does into .grad.
  const bool gemm_native =
      ops::has_native_kernel<ops::GemmArgs>(dev, h.dtype()) && w.dtype() == h.dtype();
  Tensor loss, dh, dw, dloss;
  {
    MemoryScope scope(MemCategory::Logits);
    if (want_dh && chunked) dh = Tensor::empty({N, C}, h.dtype(), dev);
  }
  for (std::int64_t r0 = 0; r0 < N; r0 += rows_per) {
    const std::int64_t n = std::min(rows_per, N - r0);
    const Tensor hc = chunked ? h.narrow(0, r0, n) : h;
    const Tensor tc = chunked ? targets.narrow(0, r0, n) : targets;
    MemoryScope scope(MemCategory::Logits);  // the chunk's logits, per-row loss, lse
    Tensor logits = ops::linear(hc, w, Tensor());
    auto [rows, lse] = ops::cross_entropy(logits, tc, ignore_index);
    Tensor part = ops::sum_all(rows);
    loss = loss.defined() ? ops::add(loss, part) : part;
    rows = part = Tensor();
    if (!want_dh && !want_dw) continue;
    if (!dloss.defined() || dloss.size(0) != n) dloss = ops::full({n}, inv_count, lse.dtype(), dev);
    // d(loss)/d(logits) = (softmax - onehot) / count, written over the logits.
    Tensor d = ops::cross_entropy_backward(logits, lse, tc, dloss, ignore_index, true);
    logits = lse = Tensor();
    if (want_dh) {
      Tensor dhc = ops::matmul(d, w);  // (n, C) = d @ W
      if (chunked) {
        Tensor dst = dh.narrow(0, r0, n);
        dst.copy_(dhc);
      } else {
        dh = std::move(dhc);
      }
    }
    if (want_dw) {
      MemoryScope grads(MemCategory::Gradients);
      if (!dw.defined()) {
        dw = ops::matmul(d, hc, true, false);  // (V, C) = d^T h
      } else if (gemm_native) {
        ops::gemm_(dw, d, hc.contiguous(), true, false, 1.0, 1.0);
      } else {
        ops::axpy_(dw, 1.0, ops::matmul(d, hc, true, false));
      }
    }
  }
  MemoryScope scope(MemCategory::Logits);
  ops::scale_(loss, inv_count);
  if (h.dtype() != loss.dtype()) loss = loss.to(h.dtype());
  if (!want_dh && !want_dw) return loss;
  auto node = std::make_shared<LinearCrossEntropyNode>();
  node->dh = std::move(dh);
  node->dw = std::move(dw);
  return record(loss, node, {&h, &w, &targets});
}

Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  if (!training || p == 0.0) return x;
  auto [y, mask] = ops::dropout(x, p, gen);
  if (!needs_grad({&x})) return y;
  auto n = std::make_shared<DropoutNode>();
  n->mask = mask;
  n->p = p;
  return record(y, n, {&x});
}

Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  bool any = false;
  for (const auto& t : inputs) any = any || t.requires_grad();
  if (!grad_enabled() || !any) return fn(inputs);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = fn(inputs);
  }
  auto n = std::make_shared<CheckpointNode>();
  n->fn = fn;
  n->inputs = inputs;
  attach(n, {}, {&out});
  for (const auto& t : inputs) n->next.push_back(edge_of(t));
  return out;
}

}  // namespace kiln::ag
