// Parameter counts per component: an analytic formula from a ModelConfig, and
// the actual count from the model instantiated on the meta device (real
// shapes, no memory). `kiln params` prints the two side by side.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/config.h"

namespace kiln::models {

// One row of the table. Per-layer rows have `layers` = n_layers; the others 1.
struct ParamRow {
  std::string key;             // the HF name, "layers.*." for per-layer rows:
                               // "layers.*.mlp.up_proj.weight"
  std::string label;           // for the table: "q_proj", "q_proj bias", "QK-norm q_norm", ...
  std::int64_t per_layer = 0;  // count in one layer (or the whole count when layers = 1)
  std::int64_t layers = 1;
  bool tied = false;  // the LM head row of a tied model: shares the embedding, counts 0
  std::int64_t total() const { return per_layer * layers; }
};

struct ParamCount {
  std::vector<ParamRow> rows;
  std::int64_t total = 0;
  // vocab × dim for the input table, plus vocab × dim again for an untied LM
  // head (the output embedding), plus max_seq_len × dim for a learned position
  // table (GPT-2's wpe; Kaplan et al. leave it out too). Qwen's "non-embedding"
  // figures use this.
  std::int64_t embedding = 0;
  std::int64_t non_embedding() const { return total - embedding; }
};

// The formula. Overflow-checked: an absurd config fails instead of wrapping.
ParamCount count_params(const ModelConfig &c);

// Builds DecoderModel(c) on Device::meta() and sums numel per row key (see
// ParamRow::key); "total" holds the sum over all parameters.
std::map<std::string, std::int64_t> count_meta_params(const ModelConfig &c);

// The row key of a parameter name: "model.layers.3.self_attn.q_proj.weight"
// -> "layers.*.self_attn.q_proj.weight"; other names are returned unchanged.
std::string param_row_key(const std::string &name);

// What-ifs applied on top of a loaded config (unset fields keep the config's).
struct WhatIf {
  std::optional<std::int64_t> kv_heads, intermediate, layers;
  std::optional<bool> tie;       // --tie / --untie
  std::optional<NormKind> norm;  // --norm layernorm|rmsnorm
  std::optional<MlpKind> mlp;    // --mlp plain (fc/proj) | gated (gate/up/down)
  // --act: the MLP's activation; without it, --mlp plain takes gelu_pytorch_tanh, gated silu.
  std::optional<MlpActivation> act;
  std::optional<bool> final_norm;  // --no-final-norm
  bool bias = false;               // --bias: biases on every linear
  bool any() const {
    return kv_heads || intermediate || layers || tie || norm || mlp || act || final_norm || bias;
  }
};
// Returns the modified config, validated; the name gets a "+what-if" suffix.
ModelConfig apply_what_if(ModelConfig c, const WhatIf &w);

// A preset name, a config.json (Hugging Face, or kiln's own ModelConfig JSON
// when it has no "model_type"), or a folder holding config.json.
ModelConfig resolve_model_config(const std::string &spec);

// The table as JSON: config, rows (with actual counts), totals and "identical".
nlohmann::json param_report_json(const ModelConfig &c, const ParamCount &formula,
                                 const std::map<std::string, std::int64_t> &actual);
// The aligned text table; `identical` is set when every row and the total
// match.
std::string param_report_text(const ModelConfig &c, const ParamCount &formula,
                              const std::map<std::string, std::int64_t> &actual, bool *identical);

}  // namespace kiln::models
