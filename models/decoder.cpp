#include "models/decoder.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>

namespace kiln::models {

namespace {

nn::AttentionConfig attention_config(const ModelConfig& c) {
  nn::AttentionConfig a;
  a.dim = c.dim;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.qk_norm = c.qk_norm;
  a.qkv_bias = c.qkv_bias || c.bias;
  a.o_bias = c.bias;
  a.norm_eps = c.norm_eps;
  a.use_rope = c.uses_rope();
  return a;
}

}  // namespace

KVCache::KVCache(const ModelConfig& c, std::int64_t batch, std::int64_t max_len, DType dtype,
                 Device device)
    : capacity(max_len) {
  KILN_CHECK(max_len > 0 && max_len <= c.max_seq_len,
             "[kv_cache] context {} must be in [1, {}] (the model's max_seq_len)", max_len,
             c.max_seq_len);
  MemoryScope scope(MemCategory::KVCache);
  MemCauseScope cause(fmt::format(
      "the KV cache: context {} x num_hidden_layers {} x num_key_value_heads {} x head_dim {} x 2",
      max_len, c.n_layers, c.n_kv_heads, c.head_dim));
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    k.push_back(Tensor::empty({batch, max_len, c.n_kv_heads, c.head_dim}, dtype, device));
    v.push_back(Tensor::empty({batch, max_len, c.n_kv_heads, c.head_dim}, dtype, device));
  }
  for (std::int64_t l = 0; l < c.n_layers; ++l) layers.push_back({k[l], v[l], &len});
}

DecoderBody::DecoderBody(const ModelConfig& c, const nn::Init& init) {
  // The config fields behind each part, for an out-of-memory error (MemCauseScope).
  std::optional<MemCauseScope> cause;
  cause.emplace(fmt::format("the embedding: vocab_size {} x hidden_size {}", c.vocab_size, c.dim));
  embed_tokens =
      register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.dim, init));
  if (c.pos_embedding == PosEmbedding::Learned) {
    cause.emplace(fmt::format("the position embedding: max_position_embeddings {} x hidden_size {}",
                              c.max_seq_len, c.dim));
    nn::Init pos_init = init;  // the same generator, its next counter range
    pos_init.std = c.init_std / 2;
    embed_positions = register_module(
        "embed_positions", std::make_shared<nn::Embedding>(c.max_seq_len, c.dim, pos_init));
  }
  layers = register_module("layers", std::make_shared<nn::ModuleList<nn::DecoderLayer>>());
  cause.emplace(fmt::format(
      "the layers: num_hidden_layers {} x (hidden_size {}, intermediate_size {}, heads {}/{} x "
      "head_dim {})",
      c.n_layers, c.dim, c.hidden_dim, c.n_heads, c.n_kv_heads, c.head_dim));
  double out_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  nn::MlpConfig m{c.dim, c.hidden_dim, c.mlp_kind, c.hidden_act, c.bias};
  for (std::int64_t l = 0; l < c.n_layers; ++l)
    layers->push_back(
        std::make_shared<nn::DecoderLayer>(attention_config(c), m, c.norm_kind, init, out_std));
  if (c.final_norm)
    norm =
        register_module("norm", std::make_shared<nn::Norm>(c.norm_kind, c.dim, c.norm_eps, init));
}

DecoderModel::DecoderModel(const ModelConfig& c, std::uint64_t seed, DType dtype, Device device)
    : cfg(c) {
  cfg.validate();
  Generator gen(seed);
  nn::Init init{&gen, cfg.init_std, dtype, device};
  model = register_module("model", std::make_shared<DecoderBody>(cfg, init));
  std::optional<MemCauseScope> cause;
  cause.emplace(
      fmt::format("the LM head: hidden_size {} x vocab_size {}", cfg.dim, cfg.vocab_size));
  if (!cfg.tie_embeddings)
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(cfg.dim, cfg.vocab_size,
                                                                      false, init, cfg.init_std));
  // Full HF names on the tensors, for messages ("gradient ... for leaf model.norm.weight").
  for (auto& [name, p] : named_parameters()) p.set_name(name);
  cause.emplace(fmt::format("the RoPE table: max_position_embeddings {} x head_dim {}",
                            cfg.max_seq_len, cfg.head_dim));
  if (cfg.uses_rope())
    rope = std::make_unique<nn::Rope>(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta, cfg.rope_style,
                                      dtype, device);
}

const Tensor& DecoderModel::lm_head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

std::map<std::string, nn::Linear*> DecoderModel::linears() const {
  std::map<std::string, nn::Linear*> out;
  auto add = [&](const std::string& name, const std::shared_ptr<nn::Linear>& l) {
    if (l) out[name + ".weight"] = l.get();
  };
  for (std::size_t i = 0; i < model->layers->items.size(); ++i) {
    const auto& layer = model->layers->items[i];
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "self_attn.q_proj", layer->self_attn->q_proj);
    add(p + "self_attn.k_proj", layer->self_attn->k_proj);
    add(p + "self_attn.v_proj", layer->self_attn->v_proj);
    add(p + "self_attn.o_proj", layer->self_attn->o_proj);
    add(p + "mlp.gate_proj", layer->mlp->gate_proj);
    add(p + "mlp.up_proj", layer->mlp->up_proj);
    add(p + "mlp.down_proj", layer->mlp->down_proj);
    add(p + "mlp.fc", layer->mlp->fc);
    add(p + "mlp.proj", layer->mlp->proj);
  }
  add("lm_head", lm_head);
  return out;
}

std::int64_t chunked_loss_rows(std::int64_t rows, std::int64_t vocab, std::int64_t dim,
                               std::int64_t max_chunk_rows) {
  if (max_chunk_rows <= 0 || rows <= 0) return 0;
  const std::int64_t n = std::min(rows, max_chunk_rows);
  return (rows - n) * vocab > n * dim + vocab * dim ? n : 0;
}

Tensor DecoderModel::logits(const Tensor& h) const {
  if (lm_head && lm_head->weight_quant)
    return ops::linear_quant(h, lm_head->weight, *lm_head->weight_quant, lm_head->out_features);
  const nn::Embedding& e = *model->embed_tokens;
  if (!lm_head && e.weight_quant) return ops::linear_quant(h, e.weight, *e.weight_quant, e.vocab);
  return ops::linear(h, lm_head_weight(), Tensor());
}

Tensor DecoderModel::hidden(const Tensor& ids, std::int64_t pos_offset, KVCache* cache) {
  KILN_CHECK(ids.dim() == 2 && ids.dtype() == DType::I32,
             "[model] ids must be i32 (B, T), got {} {}", dtype_name(ids.dtype()),
             shape_str(ids.shape()));
  std::int64_t T = ids.size(1);
  KILN_CHECK(pos_offset + T <= cfg.max_seq_len,
             "[model] sequence of {} tokens (from position {}) exceeds the model's context of {}",
             T, pos_offset, cfg.max_seq_len);
  Tensor h = model->embed_tokens->forward(ids);  // (B, T, C)
  if (model->embed_positions) {
    // The table's rows for these positions, a view (T, C), broadcast over B by
    // the add; backward sums the gradient over B and scatters it into the rows.
    MemLabelScope label("embed_positions");
    h = ag::add(h, ag::narrow(model->embed_positions->weight, 0, pos_offset, T));
  }
  for (std::size_t l = 0; l < model->layers->items.size(); ++l) {
    const auto& layer = model->layers->items[l];
    nn::LayerKV* kv = cache ? &cache->layers[l] : nullptr;
    if (recompute && !cache && grad_enabled()) {
      const nn::Rope* r = rope.get();
      h = ag::checkpoint(
          [layer, r](const std::vector<Tensor>& in) { return layer->forward(in[0], r); }, {h});
    } else {
      h = layer->forward(h, rope.get(), pos_offset, kv);
    }
  }
  if (model->norm) h = model->norm->forward(h);
  return h;
}

Tensor DecoderModel::forward(const Tensor& ids, std::int64_t pos_offset, KVCache* cache) {
  Tensor h = hidden(ids, pos_offset, cache);
  MemLabelScope label("lm_head");
  MemoryScope scope(MemCategory::Logits);
  if (lm_head) return lm_head->forward(h);
  if (model->embed_tokens->weight_quant) return logits(h);  // tied to a quantized table
  return ag::linear(h, lm_head_weight());
}

Tensor DecoderModel::loss(const Tensor& ids, const Tensor& targets, std::int32_t ignore_index) {
  KILN_CHECK(targets.shape() == ids.shape(), "[model] targets {} do not match ids {}",
             shape_str(targets.shape()), shape_str(ids.shape()));
  const std::int64_t chunk_rows =
      chunked_loss_rows(ids.numel(), cfg.vocab_size, cfg.dim, loss_chunk_rows);
  const bool fused = chunk_rows > 0 &&
                     (!lm_head || (!lm_head->bias.defined() && !lm_head->weight_quant)) &&
                     !model->embed_tokens->weight_quant;
  if (!fused) {
    Tensor logits = forward(ids);
    MemLabelScope label("cross_entropy");
    return ag::cross_entropy(ag::reshape(logits, {-1, cfg.vocab_size}), targets.reshape({-1}),
                             ignore_index);
  }
  Tensor h = hidden(ids);
  MemLabelScope label("linear_cross_entropy");
  return ag::linear_cross_entropy(ag::reshape(h, {-1, cfg.dim}), lm_head_weight(),
                                  targets.reshape({-1}), ignore_index, chunk_rows);
}

}  // namespace kiln::models
