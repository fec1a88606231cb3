// llama2.c model checkpoints (.bin), float32, read through a read-only mmap.
//
// Legacy format (run.c / export.py legacy_export), little-endian:
//   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len   (28 bytes)
//     vocab_size < 0 means the classifier is NOT shared with the embedding; |vocab_size| is the
//     vocab.
//   float32, in this order (L = n_layers, D = dim, H = hidden_dim, KV = D * n_kv_heads / n_heads,
//   hs = D / n_heads):
//     tok_embeddings (V, D) | attention_norm (L, D) | wq (L, D, D) | wk (L, KV, D) | wv (L, KV, D)
//     | wo (L, D, D) | ffn_norm (L, D) | w1 (L, H, D) | w2 (L, D, H) | w3 (L, H, D) | norm (D)
//     | freq_cis_real (seq_len, hs/2) | freq_cis_imag (seq_len, hs/2)   (skipped: RoPE is
//     recomputed) | wcls (V, D)   only when unshared
//
// Version 1 (export.py version1_export):
//   uint32 magic 0x616b3432 ("ak42" read as little-endian bytes "24ka") | int32 version = 1
//   | int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len
//   | uint8 shared_classifier | zero padding up to byte 256
//   float32, in this order:
//     attention_norm (L, D) | ffn_norm (L, D) | norm (D) | tok_embeddings (V, D)
//     | wq (L, D, D) | wk (L, KV, D) | wv (L, KV, D) | wo (L, D, D)
//     | w1 (L, H, D) | w2 (L, D, H) | w3 (L, H, D) | output (V, D) only when not shared
//   (version 2 is the int8-quantized export and is rejected.)
//
// All matrices are PyTorch Linear layout (out_features, in_features). llama2.c
// applies RoPE to interleaved pairs (x[2i], x[2i+1]); the weights are returned
// as stored, and the model layer selects the interleaved RoPE style for them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/io/mapped_file.h"

namespace kiln::io {

struct Llama2cConfig {
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;  // always positive here
  int32_t seq_len = 0;
  bool shared_classifier = true;
  int version = 0;  // 0 = legacy, 1 = version 1

  int32_t head_size() const { return dim / n_heads; }
  int32_t kv_dim() const { return dim / n_heads * n_kv_heads; }
};

struct Llama2cTensor {
  std::vector<int64_t> shape;
  const float* data = nullptr;  // into the mapping; valid while the checkpoint lives

  uint64_t numel() const;
  std::span<const float> values() const { return {data, static_cast<size_t>(numel())}; }
};

struct Llama2cCheckpoint {
  Llama2cConfig config;
  // HF-style names: model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
  // model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
  // model.layers.{i}.post_attention_layernorm.weight,
  // model.layers.{i}.mlp.{gate,down,up}_proj.weight (= w1, w2, w3), model.norm.weight,
  // lm_head.weight (only when the classifier is not shared).
  std::map<std::string, Llama2cTensor> tensors;
  std::shared_ptr<MappedFile> file;

  const Llama2cTensor& at(const std::string& name) const;
};

// Reads and validates the header only (sizes sane, file size exact).
Llama2cConfig read_llama2c_config(const std::string& path);

// Maps the file and returns its tensors; throws kiln::Error "[llama2c] <path>: ..." on bad input.
Llama2cCheckpoint load_llama2c_bin(const std::string& path);

}  // namespace kiln::io
