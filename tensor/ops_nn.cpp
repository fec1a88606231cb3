// Front end for the nn kernels: softmax, embedding, norms, RoPE, activations, attention,
// cross-entropy, dropout and the optimizer steps. Each function checks shapes, allocates its
// outputs and runs the kernel the table (tensor/kernel_table.h) holds for the device and dtype.
#include <cmath>
#include <initializer_list>

#include "tensor/ops.h"
#include "tensor/ops_util.h"

namespace kiln::ops {

// ---- softmax --------------------------------------------------------------------

static Tensor softmax_impl(const Tensor& x, bool log) {
  SoftmaxArgs a{x, empty_like(x), log};
  run(a);
  return a.y;
}
static Tensor softmax_backward_impl(const Tensor& y, const Tensor& dy, bool log) {
  check_same_shape(y, dy, log ? "log_softmax" : "softmax");
  SoftmaxBackwardArgs a{y, dy, empty_like(y), log};
  run(a);
  return a.dx;
}
Tensor softmax(const Tensor& x) { return softmax_impl(x, false); }
Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  return softmax_backward_impl(y, dy, false);
}
Tensor log_softmax(const Tensor& x) { return softmax_impl(x, true); }
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) {
  return softmax_backward_impl(y, dy, true);
}

// ---- embedding --------------------------------------------------------------------

Tensor embedding(const Tensor& ids, const Tensor& table) {
  KILN_CHECK(ids.dtype() == DType::I32, "[embedding] token ids must be i32, got {}",
             dtype_name(ids.dtype()));
  KILN_CHECK(table.dim() == 2, "[embedding] table must be 2-d, got {}", shape_str(table.shape()));
  check_same_device(ids, table, "embedding");
  Shape shape = ids.shape();
  shape.push_back(table.size(1));
  EmbeddingArgs a{ids, table, Tensor::empty(shape, table.dtype(), table.device())};
  run(a);
  return a.out;
}

void embedding_backward_(Tensor& dtable, const Tensor& ids, const Tensor& dout) {
  KILN_CHECK(dtable.is_contiguous() && dtable.dim() == 2, "[embedding] bad gradient buffer");
  KILN_CHECK(ids.dtype() == DType::I32, "[embedding] token ids must be i32, got {}",
             dtype_name(ids.dtype()));
  KILN_CHECK(dout.numel() == ids.numel() * dtable.size(1), "[embedding] dout {} vs ids {}",
             shape_str(dout.shape()), shape_str(ids.shape()));
  EmbeddingBackwardArgs a{dtable, ids, dout};
  run(a);
}

// ---- norms ----------------------------------------------------------------------

// An RMSNorm's weight is one vector as long as x's last dim.
static void check_rmsnorm_weight(const Tensor& x, const Tensor& w, const char* op) {
  KILN_CHECK(w.dim() == 1 && x.dim() >= 1 && x.size(-1) == w.size(0),
             "[{}] input {} does not match weight {}", op, shape_str(x.shape()),
             shape_str(w.shape()));
}

std::tuple<Tensor, Tensor> rmsnorm(const Tensor& x, const Tensor& w, double eps) {
  check_rmsnorm_weight(x, w, "rmsnorm");
  Tensor rstd = Tensor::empty({rows_of(x)}, compute_dtype(x.dtype()), x.device());
  RmsNormArgs a{x, w, empty_like(x), rstd, eps};
  run(a);
  return {a.y, rstd};
}

std::tuple<Tensor, Tensor, Tensor> add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& w,
                                               double eps) {
  KILN_CHECK(x.shape() == r.shape() && x.dtype() == r.dtype(),
             "[add_rmsnorm] residual {} {} does not match input {} {}", shape_str(r.shape()),
             dtype_name(r.dtype()), shape_str(x.shape()), dtype_name(x.dtype()));
  check_rmsnorm_weight(x, w, "add_rmsnorm");
  Tensor rstd = Tensor::empty({rows_of(x)}, compute_dtype(x.dtype()), x.device());
  AddRmsNormArgs a{x, r, w, empty_like(x), empty_like(x), rstd, eps};
  run(a);
  return {a.s, a.y, rstd};
}

// A norm backward's weight and row statistics match x's rows and columns, and a weight gradient
// (when asked for) is a contiguous buffer of the weight's size.
static void check_norm_backward(const Tensor& x, const Tensor& w, const Tensor& stat,
                                const Tensor* dw, const char* op) {
  const std::int64_t cols = x.dim() == 0 ? 1 : x.size(-1);
  KILN_CHECK(w.numel() == cols && stat.numel() == rows_of(x),
             "[{}] backward: weight of {} and {} row statistics for {} rows of {}", op, w.numel(),
             stat.numel(), rows_of(x), cols);
  KILN_CHECK(!dw || !dw->defined() || (dw->is_contiguous() && dw->numel() == cols),
             "[{}] weight gradient must be contiguous with {} elements", op, cols);
}

Tensor rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                        Tensor* dw) {
  check_same_shape(x, dy, "rmsnorm");
  check_norm_backward(x, w, rstd, dw, "rmsnorm");
  RmsNormBackwardArgs a{x, w, rstd, dy, empty_like(x), dw ? *dw : Tensor()};
  run(a);
  return a.dx;
}

std::tuple<Tensor, Tensor, Tensor> layernorm(const Tensor& x, const Tensor& w, const Tensor& b,
                                             double eps) {
  KILN_CHECK(w.dim() == 1 && (!b.defined() || b.shape() == w.shape()) && x.size(-1) == w.size(0),
             "[layernorm] input {} does not match weight {} / bias {}", shape_str(x.shape()),
             shape_str(w.shape()), b.defined() ? shape_str(b.shape()) : "none");
  const std::int64_t rows = rows_of(x);
  Tensor mean = Tensor::empty({rows}, compute_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({rows}, compute_dtype(x.dtype()), x.device());
  LayerNormArgs a{x, w, b, empty_like(x), mean, rstd, eps};
  run(a);
  return {a.y, mean, rstd};
}

Tensor layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          const Tensor& dy, Tensor* dw, Tensor* db) {
  check_same_shape(x, dy, "layernorm");
  check_norm_backward(x, w, rstd, dw, "layernorm");
  check_norm_backward(x, w, mean, db, "layernorm");
  LayerNormBackwardArgs a{
      x, w, mean, rstd, dy, empty_like(x), dw ? *dw : Tensor(), db ? *db : Tensor()};
  run(a);
  return a.dx;
}

// ---- RoPE -----------------------------------------------------------------------

std::tuple<Tensor, Tensor> rope_tables(std::int64_t max_pos, std::int64_t head_dim, double theta,
                                       DType dtype, Device device) {
  KILN_CHECK(head_dim > 0 && head_dim % 2 == 0, "[rope] head_dim {} must be even", head_dim);
  const DType cd = compute_dtype(dtype);
  RopeTablesArgs a{Tensor::empty({max_pos, head_dim / 2}, cd, device),
                   Tensor::empty({max_pos, head_dim / 2}, cd, device), max_pos, head_dim, theta};
  run(a);
  return {a.cos, a.sin};
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style,
            std::int64_t pos_offset, bool backward) {
  KILN_CHECK(x.dim() == 4, "[rope] x must be (B, T, H, D), got {}", shape_str(x.shape()));
  const std::int64_t T = x.size(1), D = x.size(3);
  KILN_CHECK(
      cos.dim() == 2 && cos.size(1) * 2 == D && pos_offset >= 0 && pos_offset + T <= cos.size(0),
      "[rope] positions [{}, {}) exceed the table of {} positions (head_dim {})", pos_offset,
      pos_offset + T, cos.size(0), D);
  KILN_CHECK(sin.shape() == cos.shape(), "[rope] sin table {} differs from cos table {}",
             shape_str(sin.shape()), shape_str(cos.shape()));
  RopeArgs a{x, cos, sin, empty_like(x), style, pos_offset, backward};
  run(a);
  return a.out;
}

// ---- activations ----------------------------------------------------------------

Tensor activation(Op op, const Tensor& x) {
  Tensor y = empty_like(x);
  bool found = false;
  for_each_activation([&]<Op O>() {
    if (op != O) return;
    found = true;
    ActivationArgs<O> a{x, y};
    run(a);
  });
  KILN_CHECK(found, "[activation] {} is not a pointwise activation", op_name(op));
  return y;
}

Tensor activation_backward(Op op, const Tensor& x, const Tensor& dy) {
  check_same_shape(x, dy, op_backward_name(op).data());
  Tensor dx = empty_like(x);
  bool found = false;
  for_each_activation([&]<Op O>() {
    if (op != O) return;
    found = true;
    ActivationBackwardArgs<O> a{x, dy, dx};
    run(a);
  });
  KILN_CHECK(found, "[activation] {} is not a pointwise activation", op_name(op));
  return dx;
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  check_same_shape(gate, up, "swiglu");
  SwiGluArgs a{gate, up, empty_like(gate)};
  run(a);
  return a.out;
}
std::tuple<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up,
                                           const Tensor& dout) {
  check_same_shape(gate, up, "swiglu");
  check_same_shape(gate, dout, "swiglu");
  SwiGluBackwardArgs a{gate, up, dout, empty_like(gate), empty_like(up)};
  run(a);
  return {a.dgate, a.dup};
}

// ---- attention ------------------------------------------------------------------

std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                     double scale, std::int64_t q_offset) {
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape(),
             "[attention] q {} k {} v {}: expected (B, T, H, D) with k and v alike",
             shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  const std::int64_t B = q.size(0), Tq = q.size(1), Hq = q.size(2), D = q.size(3);
  const std::int64_t Tk = k.size(1), Hkv = k.size(2);
  KILN_CHECK(k.size(0) == B && k.size(3) == D, "[attention] q {} and k {} disagree",
             shape_str(q.shape()), shape_str(k.shape()));
  KILN_CHECK(Hkv > 0 && Hq % Hkv == 0, "[attention] {} query heads not divisible by {} kv heads",
             Hq, Hkv);
  KILN_CHECK(q_offset >= 0 && q_offset + Tq <= Tk,
             "[attention] queries at [{}, {}) need keys up to {}, have {}", q_offset, q_offset + Tq,
             q_offset + Tq, Tk);
  KILN_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), "[attention] dtype mismatch");
  KILN_CHECK(k.stride(0) == v.stride(0), "[attention] k and v batch strides differ");
  Tensor lse = Tensor::empty({B, Hq, Tq}, compute_dtype(q.dtype()), q.device());
  AttentionArgs a{q, k, v, empty_like(q), lse, scale, q_offset};
  run(a);
  return {a.out, lse};
}

Tensor paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                       const Tensor& block_tables, const Tensor& token_seq, const Tensor& token_pos,
                       double scale) {
  KILN_CHECK(q.dim() == 3 && k_pool.dim() == 4 && k_pool.shape() == v_pool.shape(),
             "[paged_attention] q {} k_pool {} v_pool {}: expected (N, Hq, D) and (blocks, "
             "block_size, Hkv, D) alike",
             shape_str(q.shape()), shape_str(k_pool.shape()), shape_str(v_pool.shape()));
  const std::int64_t N = q.size(0), Hq = q.size(1), D = q.size(2);
  const std::int64_t num_blocks = k_pool.size(0), block_size = k_pool.size(1), Hkv = k_pool.size(2);
  KILN_CHECK(k_pool.size(3) == D, "[paged_attention] q head_dim {} vs pool head_dim {}", D,
             k_pool.size(3));
  KILN_CHECK(Hkv > 0 && Hq % Hkv == 0,
             "[paged_attention] {} query heads not divisible by {} kv heads", Hq, Hkv);
  KILN_CHECK(block_size > 0, "[paged_attention] block_size must be positive");
  KILN_CHECK(q.dtype() == k_pool.dtype() && q.dtype() == v_pool.dtype(),
             "[paged_attention] q is {}, the pool {}", dtype_name(q.dtype()),
             dtype_name(k_pool.dtype()));
  check_same_device(q, k_pool, "paged_attention");
  check_same_device(q, v_pool, "paged_attention");
  KILN_CHECK(block_tables.dim() == 2 && token_seq.dim() == 1 && token_pos.dim() == 1 &&
                 token_seq.size(0) == N && token_pos.size(0) == N,
             "[paged_attention] block_tables {} token_seq {} token_pos {}: expected (S, "
             "max_blocks), ({}) and ({})",
             shape_str(block_tables.shape()), shape_str(token_seq.shape()),
             shape_str(token_pos.shape()), N, N);
  for (const Tensor* t : {&block_tables, &token_seq, &token_pos}) {
    KILN_CHECK(t->dtype() == DType::I32, "[paged_attention] index tensors must be i32, got {}",
               dtype_name(t->dtype()));
    KILN_CHECK(t->device().is_cpu() || t->device().is_meta(),
               "[paged_attention] index tensors are given on the host, got {}", t->device().str());
  }
  const std::int64_t S = block_tables.size(0), max_blocks = block_tables.size(1);
  Tensor tables = block_tables.contiguous(), seqs = token_seq.contiguous(),
         pos = token_pos.contiguous();
  if (tables.device().is_cpu() && seqs.device().is_cpu() && pos.device().is_cpu()) {
    const std::int32_t* tb = tables.data<std::int32_t>();
    const std::int32_t* sq = seqs.data<std::int32_t>();
    const std::int32_t* ps = pos.data<std::int32_t>();
    for (std::int64_t i = 0; i < N; ++i) {
      KILN_CHECK(sq[i] >= 0 && sq[i] < S, "[paged_attention] row {}: sequence {} outside [0, {})",
                 i, sq[i], S);
      KILN_CHECK(ps[i] >= 0 && ps[i] < max_blocks * block_size,
                 "[paged_attention] row {}: position {} outside [0, {})", i, ps[i],
                 max_blocks * block_size);
      const std::int32_t* row = tb + sq[i] * max_blocks;
      for (std::int64_t b = 0; b <= ps[i] / block_size; ++b)
        KILN_CHECK(row[b] >= 0 && row[b] < num_blocks,
                   "[paged_attention] sequence {} block {} is {}, outside the pool's [0, {})",
                   sq[i], b, row[b], num_blocks);
    }
  }
  PagedAttentionArgs a{q,
                       k_pool,
                       v_pool,
                       tables.to(q.device()),
                       seqs.to(q.device()),
                       pos.to(q.device()),
                       Tensor::empty({N, Hq, D}, q.dtype(), q.device()),
                       scale};
  run(a);
  return a.out;
}

std::tuple<Tensor, Tensor, Tensor> attention_backward(const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& out,
                                                      const Tensor& lse, const Tensor& dout,
                                                      double scale) {
  check_same_shape(q, out, "attention");
  check_same_shape(out, dout, "attention");
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == q.size(0) &&
                 k.size(3) == q.size(3) && k.size(2) > 0 && q.size(2) % k.size(2) == 0,
             "[attention] backward: q {} k {} v {}: expected (B, T, H, D) with k and v alike",
             shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  KILN_CHECK(q.size(1) == k.size(1), "[attention] backward needs Tq == Tk (training)");
  KILN_CHECK(lse.shape() == Shape({q.size(0), q.size(2), q.size(1)}),
             "[attention] backward: lse {} must be (B, Hq, T) = ({}, {}, {})",
             shape_str(lse.shape()), q.size(0), q.size(2), q.size(1));
  AttentionBackwardArgs a{q,    k, v, out, lse, dout, empty_like(q), empty_like(k), empty_like(v),
                          scale};
  run(a);
  return {a.dq, a.dk, a.dv};
}

// ---- cross-entropy --------------------------------------------------------------

std::tuple<Tensor, Tensor> cross_entropy(const Tensor& logits, const Tensor& targets,
                                         std::int32_t ignore_index) {
  KILN_CHECK(logits.dim() == 2, "[cross_entropy] logits must be (N, V), got {}",
             shape_str(logits.shape()));
  KILN_CHECK(targets.dtype() == DType::I32 && targets.numel() == logits.size(0),
             "[cross_entropy] targets must be i32 with {} elements, got {} {}", logits.size(0),
             dtype_name(targets.dtype()), shape_str(targets.shape()));
  const std::int64_t N = logits.size(0);
  const DType cd = compute_dtype(logits.dtype());
  CrossEntropyArgs a{logits, targets, Tensor::empty({N}, cd, logits.device()),
                     Tensor::empty({N}, cd, logits.device()), ignore_index};
  run(a);
  return {a.loss, a.lse};
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                              const Tensor& dloss, std::int32_t ignore_index, bool in_place) {
  KILN_CHECK(dloss.numel() == logits.size(0), "[cross_entropy] dloss has {} elements, want {}",
             dloss.numel(), logits.size(0));
  KILN_CHECK(logits.dim() == 2 && targets.dtype() == DType::I32 &&
                 targets.numel() == logits.size(0) && lse.numel() == logits.size(0),
             "[cross_entropy] backward: logits {} need (N) i32 targets and (N) lse, got {} {} "
             "and {}",
             shape_str(logits.shape()), dtype_name(targets.dtype()), shape_str(targets.shape()),
             shape_str(lse.shape()));
  CrossEntropyBackwardArgs a{logits, lse, targets, dloss, Tensor(), ignore_index};
  const auto chosen = choose_kernel(a);
  // In place only when the kernel writes the logits' own dtype into their own (dense) buffer.
  const bool alias = in_place && logits.is_contiguous() && logits.dtype() == chosen.dtype;
  a.dlogits = alias ? logits.detach() : empty_like(logits);
  run_chosen(a, chosen);
  return a.dlogits;
}

// ---- dropout --------------------------------------------------------------------

std::tuple<Tensor, Tensor> dropout(const Tensor& x, double p, Generator& gen) {
  KILN_CHECK(p >= 0.0 && p < 1.0, "[dropout] p = {} must be in [0, 1)", p);
  Tensor mask = Tensor::empty(x.shape(), DType::Bool, x.device());
  const std::uint64_t offset = gen.take(static_cast<std::uint64_t>(x.numel()));
  DropoutArgs a{x, empty_like(x), mask, p, gen.seed, offset};
  run(a);
  return {a.y, mask};
}

Tensor dropout_backward(const Tensor& dy, const Tensor& mask, double p) {
  check_same_shape(dy, mask, "dropout");
  KILN_CHECK(mask.dtype() == DType::Bool, "[dropout] the mask must be bool, got {}",
             dtype_name(mask.dtype()));
  DropoutBackwardArgs a{dy, mask, empty_like(dy), p};
  run(a);
  return a.dx;
}

// ---- optimizers -----------------------------------------------------------------

// f32 tensors; AdamW also takes f64 ones (all of its tensors in f64) on the CPU.
static void check_opt(const Tensor& p, const Tensor& g, const char* op, bool f64_ok = false) {
  const bool dtype_ok =
      p.dtype() == g.dtype() && (p.dtype() == DType::F32 || (f64_ok && p.dtype() == DType::F64));
  KILN_CHECK(dtype_ok && p.is_contiguous() && g.is_contiguous() && p.shape() == g.shape(),
             "[{}] needs contiguous {} param and grad of one shape ({} {} vs {} {})", op,
             f64_ok ? "f32 (or f64)" : "f32", dtype_name(p.dtype()), shape_str(p.shape()),
             dtype_name(g.dtype()), shape_str(g.shape()));
}

void adamw_step_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, double lr, double beta1,
                 double beta2, double eps, double weight_decay, std::int64_t step) {
  check_opt(param, grad, "adamw", true);
  check_opt(m, v, "adamw", true);
  check_opt(param, m, "adamw", true);
  AdamWArgs a{param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step};
  run(a);
}

void sgd_step_(Tensor& param, const Tensor& grad, Tensor& momentum_buf, double lr, double momentum,
               double dampening, double weight_decay, bool nesterov, std::int64_t step) {
  check_opt(param, grad, "sgd");
  if (momentum_buf.defined()) check_opt(param, momentum_buf, "sgd");
  SgdArgs a{param, grad, momentum_buf, lr, momentum, dampening, weight_decay, nesterov, step};
  run(a);
}

void adamw_multi_step_(std::span<AdamWTensors> items, double lr, double beta1, double beta2,
                       double eps, std::int64_t step) {
  if (items.empty()) return;
  for (auto& it : items) {
    const Tensor& w = it.master.defined() ? it.master : it.param;
    check_opt(w, it.m, "adamw", true);
    check_opt(it.m, it.v, "adamw", true);
    KILN_CHECK(it.grad.shape() == w.shape() && it.grad.is_contiguous() &&
                   it.param.is_contiguous() && it.param.numel() == w.numel(),
               "[adamw] gradient {} does not match parameter {}", shape_str(it.grad.shape()),
               shape_str(w.shape()));
    // One device for every tensor of every item (the dispatcher sees only the first parameter).
    for (const Tensor* t :
         std::initializer_list<const Tensor*>{&it.param, &it.grad, &w, &it.m, &it.v})
      KILN_CHECK(t->device() == items[0].param.device(),
                 "[adamw] tensors on different devices: {} and {}", items[0].param.device().str(),
                 t->device().str());
  }
  AdamWMultiArgs a{items, lr, beta1, beta2, eps, step};
  run(a);
}

static AttentionImpl g_attention_impl = AttentionImpl::Auto;
// The choice is a table entry: the CUDA attention entries are replaced, so the dispatcher (and
// the dry run) sees the implementation that runs.
void set_attention_impl(AttentionImpl impl) {
  g_attention_impl = impl;
  detail::ensure_registered();
  cuda_glue::register_cuda_attention(impl);
}
AttentionImpl attention_impl() { return g_attention_impl; }

}  // namespace kiln::ops
