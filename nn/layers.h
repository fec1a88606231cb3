// The layers of LLaMA / Qwen3 / GPT-style decoders.
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/common/quant.h"
#include "nn/module.h"
#include "nn/variants.h"

namespace kiln::nn {

// Seeded initialization: every parameter draws from its own counter range of
// one Generator, so a model is reproducible from (seed, config).
struct Init {
  Generator* gen = nullptr;
  double std = 0.02;
  DType dtype = DType::F32;
  Device device = Device::cpu();
};

class Linear : public Module {
 public:
  Linear(std::int64_t in, std::int64_t out, bool bias, const Init& init, double std);
  Tensor forward(const Tensor& x) const;
  // Makes the weight GGML blocks of type t (a Bool tensor of the bytes of an (out, in) matrix,
  // ops::linear_quant): inference only. The parameter keeps its name; its data, shape and dtype
  // become the blocks'.
  void set_quantized_weight(const Tensor& blocks, quant::QuantType t);
  Tensor weight, bias;
  std::int64_t in_features, out_features;
  std::optional<quant::QuantType> weight_quant;  // set: weight holds blocks of this type
};

class Embedding : public Module {
 public:
  Embedding(std::int64_t vocab, std::int64_t dim, const Init& init);
  Tensor forward(const Tensor& ids) const;
  // As Linear's: the table becomes GGML blocks of type t (rows dequantized on lookup,
  // ops::embedding_quant; a tied LM head runs ops::linear_quant on them). Rows come out in
  // `dtype`. Inference only.
  void set_quantized_weight(const Tensor& blocks, quant::QuantType t, DType dtype);
  Tensor weight;
  std::int64_t vocab, dim;
  std::optional<quant::QuantType> weight_quant;
  DType rows_dtype = DType::F32;  // with weight_quant: the dtype of the rows it returns
};

class RMSNorm : public Module {
 public:
  RMSNorm(std::int64_t dim, double eps, const Init& init);
  Tensor forward(const Tensor& x) const { return ag::rmsnorm(x, weight, eps); }
  Tensor weight;
  double eps;
};

// A norm that is RMSNorm or LayerNorm (with bias), chosen by config.
class Norm : public Module {
 public:
  Norm(NormKind kind, std::int64_t dim, double eps, const Init& init);
  Tensor forward(const Tensor& x) const;
  // A pre-norm block's residual add and this norm: returns (x + r, norm(x + r)). Without grad
  // recording an RMSNorm runs both as one op (ops::add_rmsnorm: one pass on CUDA, the same bits
  // as the two ops for the model's contiguous activations).
  std::pair<Tensor, Tensor> add_forward(const Tensor& x, const Tensor& r) const;
  Tensor weight, bias;  // bias: LayerNorm only
  double eps;
  NormKind kind;
};

// Rotary embedding tables (buffers, not parameters; charged to Runtime).
class Rope {
 public:
  Rope(std::int64_t max_pos, std::int64_t head_dim, double theta, ops::RopeStyle style, DType dtype,
       Device device);
  Tensor apply(const Tensor& x, std::int64_t pos_offset) const {
    return ag::rope(x, cos, sin, style, pos_offset);
  }
  Tensor cos, sin;
  ops::RopeStyle style;
  std::int64_t max_pos;
};

struct AttentionConfig {
  std::int64_t dim = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k, before RoPE
  bool qkv_bias = false;  // Qwen2
  bool o_bias = false;    // GPT-style blocks
  double norm_eps = 1e-6;
  bool use_rope = true;
};

// Per-layer KV cache view: k/v (B, Tmax, Hkv, D) and the filled length.
struct LayerKV {
  Tensor k, v;
  std::int64_t* len = nullptr;
};

class Attention : public Module {
 public:
  Attention(const AttentionConfig& c, const Init& init, double out_std);
  // x: (B, T, C) -> (B, T, C). With a KV cache, new keys/values are written at
  // positions [pos_offset, pos_offset + T) and attention spans the whole prefix.
  Tensor forward(const Tensor& x, const Rope* rope, std::int64_t pos_offset = 0,
                 LayerKV* kv = nullptr) const;
  AttentionConfig cfg;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;
};

struct MlpConfig {
  std::int64_t dim = 0, hidden = 0;
  MlpKind kind = MlpKind::Gated;  // gate/up/down, or GPT-2's fc/proj
  MlpActivation act = MlpActivation::Silu;
  bool bias = false;
};

class Mlp : public Module {
 public:
  Mlp(const MlpConfig& c, const Init& init, double out_std);
  Tensor forward(const Tensor& x) const;
  MlpConfig cfg;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;  // MlpKind::Gated
  std::shared_ptr<Linear> fc, proj;                       // MlpKind::Plain
};

class DecoderLayer : public Module {
 public:
  DecoderLayer(const AttentionConfig& a, const MlpConfig& m, NormKind norm, const Init& init,
               double out_std);
  Tensor forward(const Tensor& x, const Rope* rope, std::int64_t pos_offset = 0,
                 LayerKV* kv = nullptr) const;
  std::shared_ptr<Norm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<Mlp> mlp;
};

// A list of modules named "0", "1", ...
template <typename M>
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<M> m) {
    items.push_back(register_module(std::to_string(items.size()), std::move(m)));
  }
  std::vector<std::shared_ptr<M>> items;
};

}  // namespace kiln::nn
