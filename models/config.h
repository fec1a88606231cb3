// Model configuration for the one decoder that covers LLaMA (llama2.c),
// Mistral, Qwen2/2.5, Qwen3 and GPT-2, plus presets and Hugging Face config.json.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "nn/variants.h"
#include "tensor/ops.h"

namespace kiln::models {

// How positions enter the model: rotary embeddings on q and k inside every
// attention (LLaMA, Qwen), or a learned absolute table wpe (max_seq_len, dim)
// added to the token embedding before the first layer (GPT-2; no RoPE then).
enum class PosEmbedding { Rope, Learned };

// The layer variants (nn/variants.h), under models:: too.
using nn::MlpActivation;
using nn::MlpKind;
using nn::NormKind;

// Hard sanity limits on a config, far above any real model (ModelConfig::validate()).
inline constexpr std::int64_t kMaxVocab = std::int64_t{1} << 24;      // 16,777,216 ids
inline constexpr std::int64_t kMaxDim = std::int64_t{1} << 17;        // hidden_size 131,072
inline constexpr std::int64_t kMaxLayers = 4096;                      // num_hidden_layers
inline constexpr std::int64_t kMaxHeads = 4096;                       // attention heads
inline constexpr std::int64_t kMaxHeadDim = 4096;                     // head_dim
inline constexpr std::int64_t kMaxHidden = std::int64_t{1} << 20;     // intermediate_size
inline constexpr std::int64_t kMaxPositions = std::int64_t{1} << 24;  // max_position_embeddings

struct ModelConfig {
  std::string name;  // preset name or model_type
  std::int64_t vocab_size = 0;
  std::int64_t dim = 0;  // hidden_size
  std::int64_t n_layers = 0;
  std::int64_t n_heads = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;    // 0: dim / n_heads
  std::int64_t hidden_dim = 0;  // intermediate_size
  std::int64_t max_seq_len = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  ops::RopeStyle rope_style = ops::RopeStyle::Interleaved;  // llama2.c; HF uses RotateHalf
  bool qk_norm = false;                                     // Qwen3
  bool qkv_bias = false;                                    // Qwen2
  bool tie_embeddings = true;
  NormKind norm_kind = NormKind::RmsNorm;  // LayerNorm: with bias (GPT-2)
  MlpKind mlp_kind = MlpKind::Gated;       // Plain: GPT-2's fc/proj
  MlpActivation hidden_act = MlpActivation::Silu;
  bool bias = false;  // biases on every linear (classic GPT block)
  bool final_norm = true;
  PosEmbedding pos_embedding = PosEmbedding::Rope;
  double init_std = 0.02;

  std::int64_t q_dim() const { return n_heads * head_dim; }
  std::int64_t kv_dim() const { return n_kv_heads * head_dim; }
  bool uses_rope() const { return pos_embedding == PosEmbedding::Rope; }
  // Checks every field against its range and the hard limits above; failures name the field
  // and the value.
  void validate() const;
  // kiln's own JSON (checkpoints, safetensors metadata, reports). from_json also
  // reads the booleans that configs written before the enums held: "layernorm"
  // (LayerNorm) and "gelu_mlp" (a plain tanh-GELU MLP).
  nlohmann::json to_json() const;
  // Errors name `source` and the field.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source = "model config");
};

// llama2.c's rule: 4·dim, times 2/3, rounded up to a multiple of `multiple`.
std::int64_t llama2c_hidden_dim(std::int64_t dim, std::int64_t multiple = 32);

// stories260K, stories15M, stories42M, stories110M, shakespeare-char,
// qwen3-0.6b, qwen3-8b, gpt2-124m.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// A GPT-2 block (Radford et al. 2019; llm.c's train_gpt2): pre-LayerNorm with
// bias (eps 1e-5), biases on every linear, GELU (tanh) MLP of 4·dim, learned
// absolute positions (wpe, no RoPE), final LayerNorm, LM head tied to wte,
// multi-head attention (n_kv_heads = n_heads), init N(0, 0.02) with wpe
// N(0, 0.01) and the residual projections scaled by 1/sqrt(2·n_layers).
ModelConfig gpt2_config(const std::string& name, std::int64_t vocab, std::int64_t dim,
                        std::int64_t layers, std::int64_t heads, std::int64_t ctx);

// How kiln treats a field of a Hugging Face config.json. Read: it sets the model. Ignored: it
// cannot change what kiln computes (metadata, token ids, dropout, caching). Checked: accepted
// only with the value(s) in `note`, refused by name otherwise. Any field not in the table is
// refused by name with its value: a field kiln does not know may change the model, and
// silently computing a different model is the worst failure an inference engine has.
enum class HfFieldUse { Read, Ignored, Checked };
enum class HfFamily { All, Llama, Gpt2 };  // Llama: qwen3, qwen2, llama, mistral
struct HfConfigField {
  const char* name;
  HfFamily family;
  HfFieldUse use;
  const char* note;
};
// The one list (models/config.cpp); `kiln generate --help` prints it.
const std::vector<HfConfigField>& hf_config_fields();
std::string hf_config_fields_help();

// A Hugging Face config.json (model_type qwen3, qwen2, llama, mistral, gpt2).
// gpt2 gives the GPT-2 block (see gpt2_config()) with the file's vocab_size,
// unpadded; kiln has no GPT-2 weight loader (models/decoder.h maps the names).
// The others' hidden_act (silu when absent) picks the gated MLP's activation;
// any other value is refused by name. Fields are checked against hf_config_fields() first.
// `source` names the file in messages.
ModelConfig from_hf_config(const nlohmann::json& j, const std::string& source = "config.json");
ModelConfig load_hf_config(const std::string& path);

// A JSON file (config.json, generation_config.json) of at most kMaxJsonConfigBytes, from a
// regular file only, parsed by io::parse_json_limited (at most 64 levels of nesting). Errors
// start with "[who] <path>" (not a regular file, too large) or "[json] <who> file <path>" (not
// JSON, nested too deep).
inline constexpr std::uint64_t kMaxJsonConfigBytes = std::uint64_t{64} << 20;
nlohmann::json read_json_file(const std::string& path, std::string_view who);

}  // namespace kiln::models
