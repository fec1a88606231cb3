// What `kiln generate` / `kiln chat` read besides the weights: Hugging Face
// generation_config.json (sampling defaults and EOS ids), and one loader that
// turns a model source (an HF folder, a llama2.c .bin, or a config.json with
// random weights) into a DecoderModel + tokenizer + generation defaults. The
// golden tests load through the same function the command uses.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/io/tokenizer.h"
#include "models/sampling.h"

namespace kiln::models {

// generation_config.json. Absent fields keep HF's defaults (do_sample false,
// temperature 1, top_k 50, top_p 1, min_p off, repetition_penalty 1).
struct GenerationConfig {
  std::vector<std::int32_t> eos_token_ids;  // "eos_token_id": int or list
  std::optional<std::int32_t> bos_token_id, pad_token_id;
  bool do_sample = false;  // false: greedy, whatever the temperature says
  double temperature = 1.0;
  std::int64_t top_k = 50;
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  std::optional<std::int64_t> max_new_tokens;

  // The sampling these defaults imply (temperature 0 when do_sample is false).
  SamplingOptions sampling(std::uint64_t seed) const;
};

// Checks types and ranges; errors start with "[generation_config] <source>:" and name the field.
GenerationConfig parse_generation_config(const nlohmann::json& j, const std::string& source);
GenerationConfig load_generation_config(const std::string& path);

// A Hugging Face config.json, as load_model reads it for random_weights (its errors name the
// file).
ModelConfig read_model_config(const std::string& path);

// Where the model comes from.
struct ModelSource {
  std::string model;   // HF folder, a .gguf file or a llama2.c .bin; empty with random_weights
  std::string config;  // config.json for random_weights (HF field names)
  bool random_weights = false;
  std::uint64_t weights_seed = 0;
  std::string tokenizer;     // make_tokenizer spec; empty: found next to the model (see below)
  DType dtype = DType::F32;  // parameter (and KV cache) dtype
  Device device = Device::cpu();
  // GGUF: keep quantized Linear weights quantized (ops::linear_quant), else dequantize them all
  // into dtype.
  bool keep_quantized = true;
};

struct LoadedModel {
  std::unique_ptr<DecoderModel> model;
  std::unique_ptr<io::Tokenizer> tokenizer;  // null when none was found
  GenerationConfig generation;               // defaults when there is no generation_config.json
  std::string description;                   // one line for the user: what was loaded
};

// HF folder: config.json (load_hf_config), weights via load_safetensors (index or
// model.safetensors; a tied model may carry lm_head.weight), generation_config.json when present,
// tokenizer from the folder (tokenizer.json or vocab.json + merges.txt) when present.
// llama2.c .bin: load_llama2c_model, tokenizer only from `tokenizer`, EOS = 2 (run.c stops at BOS
// 1, which is also treated as a stop id). random_weights: config.json + seeded random weights
// in `dtype`; the tokenizer is looked for in the config's folder and its parent (the shared Qwen
// vocab sits one level above the per-model config folders). Weights are charged to
// MemCategory::Weights.
LoadedModel load_model(const ModelSource& src);

}  // namespace kiln::models
