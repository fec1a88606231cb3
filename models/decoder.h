// The decoder: token embedding (plus a learned position table for GPT-2), N
// DecoderLayers, final norm, LM head (or the embedding, tied). Parameter names
// follow Hugging Face's LLaMA/Qwen layout ("model.layers.N.self_attn.q_proj.weight").
//
// GPT-2 uses the same names; its HF checkpoints (GPT2LMHeadModel) map as below.
// HF's Conv1D stores weights as (in, out), the transpose of a Linear's
// (out, in), and c_attn fuses q, k and v. kiln has no GPT-2 weight loader.
//   transformer.wte.weight (V, C)          model.embed_tokens.weight (V, C)
//   transformer.wpe.weight (ctx, C)        model.embed_positions.weight (ctx, C)
//   transformer.h.N.ln_1.{weight,bias}     model.layers.N.input_layernorm.{weight,bias}
//   transformer.h.N.attn.c_attn.weight     (C, 3C): columns [0,C) q, [C,2C) k, [2C,3C) v,
//                                          each transposed -> self_attn.{q,k,v}_proj.weight (C, C)
//   transformer.h.N.attn.c_attn.bias (3C)  self_attn.{q,k,v}_proj.bias (C) each, same split
//   transformer.h.N.attn.c_proj.{w,b}      self_attn.o_proj.{weight,bias} (weight transposed)
//   transformer.h.N.ln_2.{weight,bias}     model.layers.N.post_attention_layernorm.{weight,bias}
//   transformer.h.N.mlp.c_fc.{w,b}         mlp.fc.{weight,bias} (weight (C, 4C) -> (4C, C))
//   transformer.h.N.mlp.c_proj.{w,b}       mlp.proj.{weight,bias} (weight (4C, C) -> (C, 4C))
//   transformer.ln_f.{weight,bias}         model.norm.{weight,bias}
//   lm_head.weight (tied to wte)           none: the LM head is model.embed_tokens.weight
#pragma once

#include <map>
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

// The rows per chunk in which DecoderModel::loss runs the LM head and the loss over `rows` rows,
// at most max_chunk_rows each, or 0 where it keeps the logits whole: max_chunk_rows 0, or where
// chunks would hold more. At its peak the chunked path holds one chunk's logits (n, V), the
// chunk's dh (n, C) and dW (V, C) where the whole path holds the (N, V) logits (both hold an
// (N, C) gradient), so it chunks only where (N - n) V > n C + V C. (Qwen3-8B at 1 or 2 x 4096
// keeps the logits whole, as does shakespeare-char's 65-token vocabulary; stories42M at
// 16 x 1024 saves 0.70 GiB in bf16.)
std::int64_t chunked_loss_rows(std::int64_t rows, std::int64_t vocab, std::int64_t dim,
                               std::int64_t max_chunk_rows);

class DecoderBody : public nn::Module {
 public:
  DecoderBody(const ModelConfig& c, const nn::Init& init);
  std::shared_ptr<nn::Embedding> embed_tokens;
  // GPT-2's wpe (max_seq_len, C), only with PosEmbedding::Learned.
  std::shared_ptr<nn::Embedding> embed_positions;
  std::shared_ptr<nn::ModuleList<nn::DecoderLayer>> layers;
  std::shared_ptr<nn::Norm> norm;
};

class DecoderModel : public nn::Module {
 public:
  // Seeded random weights (normal(0, init_std); residual output projections
  // scaled by 1/sqrt(2·n_layers), as llama2.c and GPT-2 do; a learned position
  // table normal(0, init_std / 2): 0.01, as in OpenAI's GPT-2 code).
  DecoderModel(const ModelConfig& c, std::uint64_t seed, DType dtype = DType::F32,
               Device device = Device::cpu());

  // ids: i32 (B, T) -> hidden states after the final norm (B, T, C). With a
  // learned position table, its rows [pos_offset, pos_offset + T) are added to
  // the token embeddings (broadcast over the batch).
  Tensor hidden(const Tensor& ids, std::int64_t pos_offset = 0, KVCache* cache = nullptr);
  // ids: i32 (B, T) -> logits (B, T, V).
  Tensor forward(const Tensor& ids, std::int64_t pos_offset = 0, KVCache* cache = nullptr);
  // Mean cross-entropy over targets != ignore_index.
  Tensor loss(const Tensor& ids, const Tensor& targets, std::int32_t ignore_index = -100);
  // The LM head's weight: lm_head's, or the token embedding when tied. With a quantized LM head
  // (set_quantized_weight) it holds GGML blocks: use logits() to apply it, dtype() for the
  // model's compute dtype.
  const Tensor& lm_head_weight() const;
  // h (..., C) -> logits (..., V) through the LM head, without recording a graph (inference).
  Tensor logits(const Tensor& h) const;
  // Every Linear by its weight's full name ("model.layers.0.self_attn.q_proj.weight"): the
  // weights a quantized file can keep quantized (nn::Linear::set_quantized_weight).
  std::map<std::string, nn::Linear*> linears() const;
  // The dtype the model computes in: the token embedding's, or the dtype of its rows when it is
  // quantized.
  DType dtype() const {
    const auto& e = *model->embed_tokens;
    return e.weight_quant ? e.rows_dtype : e.weight.dtype();
  }
  // Where the model's inputs must live: the token embedding table's device. Callers that build
  // token ids on the host (generation, training batches) move them here before forward().
  Device device() const { return model->embed_tokens->weight.device(); }

  ModelConfig cfg;
  bool recompute = false;  // per-layer activation checkpointing in training
  // loss() runs the LM head and the cross-entropy in chunks of at most this many rows, computing
  // both gradients in forward (ag::linear_cross_entropy), so the (N, V) logits never exist
  // whole; where that would hold more (chunked_loss_rows), and with 0, the logits whole, then the
  // loss (forward(), then ag::cross_entropy). Unused with a bias or quantized LM head. 4096 rows
  // keep the chunks' GEMMs efficient: on an H200, chunks of about 1000 rows cost stories15M 14%
  // of its tokens/s against the whole logits (docs/memory.md).
  std::int64_t loss_chunk_rows = kDefaultLossChunkRows;
  static constexpr std::int64_t kDefaultLossChunkRows = 4096;
  std::shared_ptr<DecoderBody> model;
  std::shared_ptr<nn::Linear> lm_head;  // null when tied
  std::unique_ptr<nn::Rope> rope;       // null without RoPE (PosEmbedding::Learned)
};

}  // namespace kiln::models
