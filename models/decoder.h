// The decoder: token embedding, N DecoderLayers, final norm, LM head (or the
// embedding, tied). Parameter names follow Hugging Face.
#pragma once

#include <memory>

#include "models/config.h"
#include "nn/layers.h"

namespace kiln::models {

// Preallocated per-layer keys and values (B, max_len, Hkv, D), charged to
// MemCategory::KVCache.
struct KVCache {
  KVCache(const ModelConfig& c, std::int64_t batch, std::int64_t max_len, DType dtype,
          Device device);
  std::vector<nn::LayerKV> layers;
  std::vector<Tensor> k, v;
  std::int64_t len = 0;
  std::int64_t capacity = 0;
};

class DecoderBody : public nn::Module {
 public:
  DecoderBody(const ModelConfig& c, const nn::Init& init);
  std::shared_ptr<nn::Embedding> embed_tokens;
  std::shared_ptr<nn::ModuleList<nn::DecoderLayer>> layers;
  std::shared_ptr<nn::Norm> norm;
};

class DecoderModel : public nn::Module {
 public:
  // Seeded random weights (normal(0, init_std); residual output projections
  // scaled by 1/sqrt(2·n_layers), as llama2.c and GPT-2 do).
  DecoderModel(const ModelConfig& c, std::uint64_t seed, DType dtype = DType::F32,
               Device device = Device::cpu());

  // ids: i32 (B, T) -> hidden states after the final norm (B, T, C).
  Tensor hidden(const Tensor& ids, std::int64_t pos_offset = 0, KVCache* cache = nullptr);
  // ids: i32 (B, T) -> logits (B, T, V).
  Tensor forward(const Tensor& ids, std::int64_t pos_offset = 0, KVCache* cache = nullptr);
  // Mean cross-entropy over targets != ignore_index.
  Tensor loss(const Tensor& ids, const Tensor& targets, std::int32_t ignore_index = -100);
  const Tensor& lm_head_weight() const;

  ModelConfig cfg;
  bool recompute = false;  // per-layer activation checkpointing in training
  std::shared_ptr<DecoderBody> model;
  std::shared_ptr<nn::Linear> lm_head;  // null when tied
  std::unique_ptr<nn::Rope> rope;
};

}  // namespace kiln::models
