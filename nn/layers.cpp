#include "nn/layers.h"

#include <cmath>

namespace kiln::nn {

namespace {

Tensor init_normal(const Shape& shape, const Init& init, double std) {
  KILN_CHECK(init.gen != nullptr, "[init] no generator given");
  MemoryScope scope(MemCategory::Weights);
  return ops::randn(shape, *init.gen, 0.0, std, init.dtype, init.device);
}

Tensor init_const(const Shape& shape, const Init& init, double value) {
  MemoryScope scope(MemCategory::Weights);
  return ops::full(shape, value, init.dtype, init.device);
}

}  // namespace

Linear::Linear(std::int64_t in, std::int64_t out, bool has_bias, const Init& init, double std)
    : in_features(in), out_features(out) {
  KILN_CHECK(in > 0 && out > 0, "[linear] sizes must be positive, got in {} out {}", in, out);
  weight = register_parameter("weight", init_normal({out, in}, init, std));
  if (has_bias) bias = register_parameter("bias", init_const({out}, init, 0.0));
}

Tensor Linear::forward(const Tensor& x) const {
  if (!weight_quant) return ag::linear(x, weight, bias);
  KILN_CHECK(!(grad_enabled() && x.requires_grad()),
             "[linear] {} is a {} weight: quantized weights run inference only (no gradient)",
             weight.name().empty() ? "this" : weight.name(), quant::quant_info(*weight_quant).name);
  return ops::linear_quant(x, weight, *weight_quant, out_features, bias);
}

void Linear::set_quantized_weight(const Tensor& blocks, quant::QuantType t) {
  const quant::QuantInfo& q = quant::quant_info(t);
  KILN_CHECK(in_features % q.block_size == 0 && blocks.dtype() == DType::Bool &&
                 blocks.numel() == out_features * (in_features / q.block_size) * q.block_bytes,
             "[linear] {}: a {} x {} {} weight takes {} bytes of whole blocks, got {} {} elements",
             weight.name(), out_features, in_features, q.name,
             out_features * (in_features / q.block_size) * q.block_bytes, blocks.numel(),
             dtype_name(blocks.dtype()));
  assign_data(weight, blocks);
  weight_quant = t;
}

Embedding::Embedding(std::int64_t vocab_, std::int64_t dim_, const Init& init)
    : vocab(vocab_), dim(dim_) {
  KILN_CHECK(vocab > 0 && dim > 0, "[embedding] sizes must be positive");
  weight = register_parameter("weight", init_normal({vocab, dim}, init, init.std));
}

Tensor Embedding::forward(const Tensor& ids) const {
  if (!weight_quant) return ag::embedding(ids, weight);
  return ops::embedding_quant(ids, weight, *weight_quant, vocab, rows_dtype);
}

void Embedding::set_quantized_weight(const Tensor& blocks, quant::QuantType t, DType dtype) {
  const quant::QuantInfo& q = quant::quant_info(t);
  KILN_CHECK(dim % q.block_size == 0 && blocks.dtype() == DType::Bool &&
                 blocks.numel() == vocab * (dim / q.block_size) * q.block_bytes,
             "[embedding] {}: a {} x {} {} table takes {} bytes of whole blocks, got {} {} "
             "elements",
             weight.name(), vocab, dim, q.name, vocab * (dim / q.block_size) * q.block_bytes,
             blocks.numel(), dtype_name(blocks.dtype()));
  assign_data(weight, blocks);
  weight_quant = t;
  rows_dtype = dtype;
}

RMSNorm::RMSNorm(std::int64_t dim, double eps_, const Init& init) : eps(eps_) {
  weight = register_parameter("weight", init_const({dim}, init, 1.0));
}

Norm::Norm(NormKind kind_, std::int64_t dim, double eps_, const Init& init)
    : eps(eps_), kind(kind_) {
  weight = register_parameter("weight", init_const({dim}, init, 1.0));
  if (kind == NormKind::LayerNorm) bias = register_parameter("bias", init_const({dim}, init, 0.0));
}

Tensor Norm::forward(const Tensor& x) const {
  return kind == NormKind::LayerNorm ? ag::layernorm(x, weight, bias, eps)
                                     : ag::rmsnorm(x, weight, eps);
}

std::pair<Tensor, Tensor> Norm::add_forward(const Tensor& x, const Tensor& r) const {
  if (kind == NormKind::RmsNorm && !grad_enabled()) {
    auto [s, y, rstd] = ops::add_rmsnorm(x, r, weight, eps);
    return {s, y};
  }
  Tensor s = ag::add(x, r);
  Tensor y = forward(s);
  return {s, y};
}

Rope::Rope(std::int64_t max_pos_, std::int64_t head_dim, double theta, ops::RopeStyle style_,
           DType dtype, Device device)
    : style(style_), max_pos(max_pos_) {
  MemoryScope scope(MemCategory::Runtime);
  std::tie(cos, sin) = ops::rope_tables(max_pos, head_dim, theta, dtype, device);
}

Attention::Attention(const AttentionConfig& c, const Init& init, double out_std) : cfg(c) {
  KILN_CHECK(c.n_heads > 0 && c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0,
             "[attention] n_heads {} must be a positive multiple of n_kv_heads {}", c.n_heads,
             c.n_kv_heads);
  KILN_CHECK(c.head_dim > 0, "[attention] head_dim must be positive");
  q_proj = register_module("q_proj", std::make_shared<Linear>(c.dim, c.n_heads * c.head_dim,
                                                              c.qkv_bias, init, init.std));
  k_proj = register_module("k_proj", std::make_shared<Linear>(c.dim, c.n_kv_heads * c.head_dim,
                                                              c.qkv_bias, init, init.std));
  v_proj = register_module("v_proj", std::make_shared<Linear>(c.dim, c.n_kv_heads * c.head_dim,
                                                              c.qkv_bias, init, init.std));
  o_proj = register_module(
      "o_proj", std::make_shared<Linear>(c.n_heads * c.head_dim, c.dim, c.o_bias, init, out_std));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(c.head_dim, c.norm_eps, init));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(c.head_dim, c.norm_eps, init));
  }
}

Tensor Attention::forward(const Tensor& x, const Rope* rope, std::int64_t pos_offset,
                          LayerKV* kv) const {
  MemLabelScope label("attention");
  std::int64_t B = x.size(0), T = x.size(1);
  Tensor q = ag::reshape(q_proj->forward(x), {B, T, cfg.n_heads, cfg.head_dim});
  Tensor k = ag::reshape(k_proj->forward(x), {B, T, cfg.n_kv_heads, cfg.head_dim});
  Tensor v = ag::reshape(v_proj->forward(x), {B, T, cfg.n_kv_heads, cfg.head_dim});
  if (cfg.qk_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  if (cfg.use_rope && rope) {
    q = rope->apply(q, pos_offset);
    k = rope->apply(k, pos_offset);
  }
  double scale = 1.0 / std::sqrt(static_cast<double>(cfg.head_dim));
  Tensor out;
  if (kv) {
    std::int64_t cap = kv->k.size(1);
    KILN_CHECK(pos_offset + T <= cap, "[attention] KV cache holds {} positions, need {}", cap,
               pos_offset + T);
    Tensor kslot = kv->k.narrow(1, pos_offset, T), vslot = kv->v.narrow(1, pos_offset, T);
    kslot.copy_(k);
    vslot.copy_(v);
    *kv->len = pos_offset + T;
    out = ag::attention(q, kv->k.narrow(1, 0, pos_offset + T), kv->v.narrow(1, 0, pos_offset + T),
                        scale, pos_offset);
  } else {
    out = ag::attention(q, k, v, scale, 0);
  }
  return o_proj->forward(ag::reshape(out, {B, T, cfg.n_heads * cfg.head_dim}));
}

Mlp::Mlp(const MlpConfig& c, const Init& init, double out_std) : cfg(c) {
  KILN_CHECK(c.dim > 0 && c.hidden > 0, "[mlp] sizes must be positive");
  if (c.kind == MlpKind::Plain) {
    fc = register_module("fc", std::make_shared<Linear>(c.dim, c.hidden, c.bias, init, init.std));
    proj =
        register_module("proj", std::make_shared<Linear>(c.hidden, c.dim, c.bias, init, out_std));
  } else {
    gate_proj = register_module("gate_proj",
                                std::make_shared<Linear>(c.dim, c.hidden, c.bias, init, init.std));
    up_proj = register_module("up_proj",
                              std::make_shared<Linear>(c.dim, c.hidden, c.bias, init, init.std));
    down_proj = register_module("down_proj",
                                std::make_shared<Linear>(c.hidden, c.dim, c.bias, init, out_std));
  }
}

Tensor Mlp::forward(const Tensor& x) const {
  MemLabelScope label("mlp");
  if (cfg.kind == MlpKind::Plain) return proj->forward(ag::activation(cfg.act, fc->forward(x)));
  // silu: SwiGLU, one fused kernel for silu(gate) * up.
  if (cfg.act == MlpActivation::Silu)
    return down_proj->forward(ag::swiglu(gate_proj->forward(x), up_proj->forward(x)));
  // HF's LLaMA/Qwen3 MLP with another activation: down(act(gate(x)) * up(x)). The gate's
  // activation is made before up, in this order (the budget's analytic model counts on it).
  Tensor a = ag::activation(cfg.act, gate_proj->forward(x));
  Tensor u = up_proj->forward(x);
  return down_proj->forward(ag::mul(a, u));
}

DecoderLayer::DecoderLayer(const AttentionConfig& a, const MlpConfig& m, NormKind norm,
                           const Init& init, double out_std) {
  input_layernorm =
      register_module("input_layernorm", std::make_shared<Norm>(norm, a.dim, a.norm_eps, init));
  self_attn = register_module("self_attn", std::make_shared<Attention>(a, init, out_std));
  post_attention_layernorm = register_module("post_attention_layernorm",
                                             std::make_shared<Norm>(norm, a.dim, a.norm_eps, init));
  mlp = register_module("mlp", std::make_shared<Mlp>(m, init, out_std));
}

Tensor DecoderLayer::forward(const Tensor& x, const Rope* rope, std::int64_t pos_offset,
                             LayerKV* kv) const {
  auto [h, normed] = post_attention_layernorm->add_forward(
      x, self_attn->forward(input_layernorm->forward(x), rope, pos_offset, kv));
  return ag::add(h, mlp->forward(normed));
}

}  // namespace kiln::nn
