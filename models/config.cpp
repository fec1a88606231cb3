#include "models/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/io/json_limits.h"
#include "models/io/mapped_file.h"

namespace kiln::models {

namespace {

using nlohmann::json;

// A JSON value as it appears in the file, for messages (short: a value may be a whole object).
std::string shown(const json& v) { return io::json_excerpt(v); }

// Typed reads that name the file and the field, never nlohmann's raw type_error text. The
// `opt_` forms return `fallback` when the field is absent or null.
std::int64_t int_field(const json& j, const char* field, const std::string& source) {
  KILN_CHECK(j.contains(field) && !j[field].is_null(), "[config] {}: lacks field '{}'", source,
             field);
  const json& v = j[field];
  KILN_CHECK(
      v.is_number_integer() && !(v.is_number_unsigned() &&
                                 v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)),
      "[config] {}: {} must be an integer, got {}", source, field, shown(v));
  return v.get<std::int64_t>();
}
std::int64_t opt_int(const json& j, const char* field, const std::string& source,
                     std::int64_t fallback) {
  return j.contains(field) && !j[field].is_null() ? int_field(j, field, source) : fallback;
}
double opt_number(const json& j, const char* field, const std::string& source, double fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  const json& v = j[field];
  KILN_CHECK(v.is_number(), "[config] {}: {} must be a number, got {}", source, field, shown(v));
  double d = v.get<double>();
  KILN_CHECK(std::isfinite(d), "[config] {}: {} must be finite, got {}", source, field, shown(v));
  return d;
}
bool opt_bool(const json& j, const char* field, const std::string& source, bool fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  KILN_CHECK(j[field].is_boolean(), "[config] {}: {} must be true or false, got {}", source, field,
             shown(j[field]));
  return j[field].get<bool>();
}
std::string opt_string(const json& j, const char* field, const std::string& source,
                       const std::string& fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  KILN_CHECK(j[field].is_string(), "[config] {}: {} must be a string, got {}", source, field,
             shown(j[field]));
  return j[field].get<std::string>();
}

// The string field `field` of j, parsed into an enum; `fallback` when absent.
template <typename E>
E enum_field(const json& j, const char* field, E fallback,
             std::optional<E> (*parse)(std::string_view), std::string_view known,
             const std::string& source) {
  if (!j.contains(field)) return fallback;
  std::string s = opt_string(j, field, source, "");
  std::optional<E> e = parse(s);
  KILN_CHECK(e.has_value(), "[config] {}: {} '{}' is not supported (kiln implements {})", source,
             field, s, known);
  return *e;
}

// validate()'s message with the file named: "[config] <source>: <what>".
void validate_from(const ModelConfig& c, const std::string& source) {
  try {
    c.validate();
  } catch (const Error& e) {
    std::string msg = e.what();
    const std::string tag = "[config] ";
    if (msg.starts_with(tag)) msg = msg.substr(tag.size());
    fail("[config] {}: {}", source, msg);
  }
}

}  // namespace

void ModelConfig::validate() const {
  // Hard sanity limits, far above any real model, checked before anything is built: a config
  // asking for a billion layers or 1e11 positions is refused here by name instead of building
  // layer after layer (or a RoPE table) until memory runs out. The meta device's dry runs
  // (kiln budget, kiln params) go through the same check.
  auto in_range = [](std::int64_t v, std::int64_t hi, const char* field) {
    KILN_CHECK(v > 0 && v <= hi, "[config] {} = {} is out of range [1, {}]", field, v, hi);
  };
  in_range(vocab_size, kMaxVocab, "vocab_size");
  in_range(dim, kMaxDim, "dim (hidden_size)");
  in_range(n_layers, kMaxLayers, "n_layers (num_hidden_layers)");
  in_range(n_heads, kMaxHeads, "n_heads (num_attention_heads)");
  in_range(n_kv_heads, kMaxHeads, "n_kv_heads (num_key_value_heads)");
  in_range(head_dim, kMaxHeadDim, "head_dim");
  in_range(hidden_dim, kMaxHidden, "hidden_dim (intermediate_size)");
  in_range(max_seq_len, kMaxPositions, "max_seq_len (max_position_embeddings)");
  KILN_CHECK(n_heads % n_kv_heads == 0,
             "[config] num_attention_heads {} is not divisible by num_key_value_heads {}", n_heads,
             n_kv_heads);
  KILN_CHECK(norm_eps > 0 && norm_eps < 1, "[config] norm_eps {} out of range (0, 1)", norm_eps);
  KILN_CHECK(std::isfinite(init_std) && init_std >= 0 && init_std < 10,
             "[config] init_std {} out of range [0, 10)", init_std);
  if (uses_rope()) {
    KILN_CHECK(head_dim % 2 == 0, "[config] head_dim {} must be even for RoPE", head_dim);
    KILN_CHECK(rope_theta > 1 && std::isfinite(rope_theta),
               "[config] rope_theta {} must be finite and > 1", rope_theta);
  }
}

nlohmann::json ModelConfig::to_json() const {
  return {{"name", name},
          {"vocab_size", vocab_size},
          {"dim", dim},
          {"n_layers", n_layers},
          {"n_heads", n_heads},
          {"n_kv_heads", n_kv_heads},
          {"head_dim", head_dim},
          {"hidden_dim", hidden_dim},
          {"max_seq_len", max_seq_len},
          {"norm_eps", norm_eps},
          {"rope_theta", rope_theta},
          {"rope_style", rope_style == ops::RopeStyle::Interleaved ? "interleaved" : "rotate_half"},
          {"qk_norm", qk_norm},
          {"qkv_bias", qkv_bias},
          {"tie_embeddings", tie_embeddings},
          {"norm_kind", nn::norm_kind_name(norm_kind)},
          {"mlp_kind", nn::mlp_kind_name(mlp_kind)},
          {"hidden_act", nn::mlp_activation_name(hidden_act)},
          {"bias", bias},
          {"final_norm", final_norm},
          {"pos_embedding", uses_rope() ? "rope" : "learned"},
          {"init_std", init_std}};
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source) {
  KILN_CHECK(j.is_object(), "[config] {}: must be a JSON object, got {}", source, shown(j));
  ModelConfig c;
  c.name = opt_string(j, "name", source, "custom");
  c.vocab_size = int_field(j, "vocab_size", source);
  c.dim = int_field(j, "dim", source);
  c.n_layers = int_field(j, "n_layers", source);
  c.n_heads = int_field(j, "n_heads", source);
  c.n_kv_heads = opt_int(j, "n_kv_heads", source, c.n_heads);
  c.head_dim = opt_int(j, "head_dim", source, 0);
  c.hidden_dim = int_field(j, "hidden_dim", source);
  c.max_seq_len = int_field(j, "max_seq_len", source);
  c.norm_eps = opt_number(j, "norm_eps", source, 1e-5);
  c.rope_theta = opt_number(j, "rope_theta", source, 10000.0);
  std::string style = opt_string(j, "rope_style", source, "interleaved");
  KILN_CHECK(style == "interleaved" || style == "rotate_half",
             "[config] {}: rope_style '{}' must be interleaved or rotate_half", source, style);
  c.rope_style = style == "interleaved" ? ops::RopeStyle::Interleaved : ops::RopeStyle::RotateHalf;
  c.qk_norm = opt_bool(j, "qk_norm", source, false);
  c.qkv_bias = opt_bool(j, "qkv_bias", source, false);
  c.tie_embeddings = opt_bool(j, "tie_embeddings", source, true);
  // Before the enums: "layernorm": true, "gelu_mlp": true (fc/proj with tanh GELU).
  c.norm_kind = opt_bool(j, "layernorm", source, false) ? NormKind::LayerNorm : NormKind::RmsNorm;
  const bool gelu_mlp = opt_bool(j, "gelu_mlp", source, false);
  c.mlp_kind = gelu_mlp ? MlpKind::Plain : MlpKind::Gated;
  c.hidden_act = gelu_mlp ? MlpActivation::GeluTanh : MlpActivation::Silu;
  c.norm_kind =
      enum_field(j, "norm_kind", c.norm_kind, nn::parse_norm_kind, "rmsnorm, layernorm", source);
  c.mlp_kind = enum_field(j, "mlp_kind", c.mlp_kind, nn::parse_mlp_kind, "gated, plain", source);
  c.hidden_act = enum_field(j, "hidden_act", c.hidden_act, nn::parse_mlp_activation,
                            nn::mlp_activation_names(), source);
  c.bias = opt_bool(j, "bias", source, false);
  c.final_norm = opt_bool(j, "final_norm", source, true);
  std::string pos = opt_string(j, "pos_embedding", source, "rope");
  KILN_CHECK(pos == "rope" || pos == "learned",
             "[config] {}: pos_embedding '{}' must be rope or learned", source, pos);
  c.pos_embedding = pos == "rope" ? PosEmbedding::Rope : PosEmbedding::Learned;
  c.init_std = opt_number(j, "init_std", source, 0.02);
  if (c.head_dim == 0 && c.n_heads > 0) c.head_dim = c.dim / c.n_heads;
  validate_from(c, source);
  return c;
}

std::int64_t llama2c_hidden_dim(std::int64_t dim, std::int64_t multiple) {
  std::int64_t h = 2 * (4 * dim) / 3;
  return multiple * ((h + multiple - 1) / multiple);
}

static ModelConfig llama2c(const char* name, std::int64_t dim, std::int64_t layers,
                           std::int64_t heads, std::int64_t kv_heads, std::int64_t vocab,
                           std::int64_t seq, std::int64_t hidden = 0) {
  ModelConfig c;
  c.name = name;
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = dim / heads;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.hidden_dim = hidden ? hidden : llama2c_hidden_dim(dim);
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.rope_style = ops::RopeStyle::Interleaved;
  c.tie_embeddings = true;
  return c;
}

std::vector<std::string> preset_names() {
  return {"shakespeare-char", "stories260K", "stories12M-q", "stories15M", "stories42M",
          "stories110M",      "qwen3-0.6b",  "qwen3-8b",     "gpt2-124m"};
}

ModelConfig gpt2_config(const std::string& name, std::int64_t vocab, std::int64_t dim,
                        std::int64_t layers, std::int64_t heads, std::int64_t ctx) {
  ModelConfig c;
  c.name = name;
  c.vocab_size = vocab;
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = heads;
  c.head_dim = heads > 0 ? dim / heads : 0;
  c.hidden_dim = 4 * dim;
  c.max_seq_len = ctx;
  c.norm_eps = 1e-5;
  c.norm_kind = NormKind::LayerNorm;
  c.mlp_kind = MlpKind::Plain;
  c.hidden_act = MlpActivation::GeluTanh;  // GPT-2's "gelu_new"
  c.bias = true;
  c.final_norm = true;
  c.tie_embeddings = true;
  c.pos_embedding = PosEmbedding::Learned;
  c.init_std = 0.02;
  return c;
}

ModelConfig preset(const std::string& name) {
  if (name == "stories260K") return llama2c("stories260K", 64, 5, 8, 4, 512, 512, 172);
  if (name == "stories15M") return llama2c("stories15M", 288, 6, 6, 6, 32000, 256);
  // Not one of llama2.c's: a TinyStories LLaMA whose rows (256, 768) are whole Q4_K/Q6_K blocks
  // of 256, trained by kiln to measure quantization on a model with learned weights.
  if (name == "stories12M-q") return llama2c("stories12M-q", 256, 4, 4, 4, 32000, 256, 768);
  if (name == "stories42M") return llama2c("stories42M", 512, 8, 8, 8, 32000, 1024);
  if (name == "stories110M") return llama2c("stories110M", 768, 12, 12, 12, 32000, 1024);
  if (name == "shakespeare-char") {
    // The CPU default: char-level (vocab set from the data), context 128.
    ModelConfig c = llama2c("shakespeare-char", 192, 4, 4, 4, 65, 128, 512);
    return c;
  }
  if (name == "qwen3-0.6b" || name == "qwen3-8b") {
    ModelConfig c;
    c.name = name;
    c.vocab_size = 151936;
    c.head_dim = 128;
    c.norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.rope_style = ops::RopeStyle::RotateHalf;
    c.qk_norm = true;
    c.max_seq_len = 40960;
    if (name == "qwen3-0.6b") {
      c.dim = 1024, c.hidden_dim = 3072, c.n_layers = 28, c.n_heads = 16, c.n_kv_heads = 8;
      c.tie_embeddings = true;
    } else {
      c.dim = 4096, c.hidden_dim = 12288, c.n_layers = 36, c.n_heads = 32, c.n_kv_heads = 8;
      c.tie_embeddings = false;
    }
    return c;
  }
  if (name == "gpt2-124m") {
    // GPT-2 small as llm.c trains it, for timing kiln against llm.c on the same
    // card: vocab 50257 padded to 50304 (a multiple of 128, llm.c's Vp) so the
    // LM-head GEMM has friendly sizes; 124,475,904 parameters (124,439,808
    // unpadded). The padded rows are ordinary embedding rows: logits keep 50304
    // columns and real token ids and targets are < 50257. Unlike llm.c, kiln's
    // cross-entropy normalizes over all 50304 columns (llm.c masks the 47
    // padded ones out of the softmax); the FLOPs and bytes are the same, and
    // training drives the never-seen padded logits down. There is no GPT-2
    // tokenizer here: `kiln train --preset gpt2-124m` is for speed comparison.
    // The char and byte tokenizers shrink the vocab to their own size; a
    // smaller real one (--tokenizer llama2c:tokenizer.bin, 32,000 ids) keeps
    // all 50304 rows, so the LM head costs what GPT-2's does.
    return gpt2_config("gpt2-124m", 50304, 768, 12, 12, 1024);
  }
  std::string names;
  for (auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  fail("[config] unknown preset '{}' (known: {})", name, names);
}

// ---- Hugging Face config.json ---------------------------------------------------------------

const std::vector<HfConfigField>& hf_config_fields() {
  using F = HfFamily;
  using U = HfFieldUse;
  static const std::vector<HfConfigField> fields = {
      {"model_type", F::All, U::Read, "qwen3, qwen2, llama, mistral or gpt2"},
      {"vocab_size", F::All, U::Read, "embedding rows"},
      {"tie_word_embeddings", F::All, U::Read, "LM head shares the embedding"},
      {"hidden_size", F::Llama, U::Read, "model width"},
      {"intermediate_size", F::Llama, U::Read, "MLP width"},
      {"num_hidden_layers", F::Llama, U::Read, "layers"},
      {"num_attention_heads", F::Llama, U::Read, "query heads"},
      {"num_key_value_heads", F::Llama, U::Read, "key/value heads (GQA); null: = heads"},
      {"head_dim", F::Llama, U::Read, "null: hidden_size / heads"},
      {"max_position_embeddings", F::Llama, U::Read, "context (default 4096)"},
      {"rms_norm_eps", F::Llama, U::Read, "RMSNorm epsilon"},
      {"rope_theta", F::Llama, U::Read, "RoPE base"},
      {"hidden_act", F::Llama, U::Read, "silu, gelu_pytorch_tanh or gelu"},
      {"attention_bias", F::Llama, U::Checked,
       "qwen2: q/k/v biases always; others: false only (true also biases o_proj)"},
      {"mlp_bias", F::Llama, U::Checked, "false only"},
      {"rope_scaling", F::Llama, U::Checked, "null only (no YaRN or other RoPE scaling)"},
      {"rope_parameters", F::Llama, U::Checked,
       "rope_theta read; rope_type default only, no other keys"},
      {"use_sliding_window", F::Llama, U::Checked, "false only"},
      {"sliding_window", F::Llama, U::Checked,
       "null, or unused (use_sliding_window false on qwen; >= context on mistral)"},
      {"max_window_layers", F::Llama, U::Ignored, "only used with sliding windows"},
      {"layer_types", F::Llama, U::Checked, "full_attention only"},
      {"pretraining_tp", F::Llama, U::Ignored, "a matmul split; same math"},
      {"n_embd", F::Gpt2, U::Read, "model width"},
      {"n_layer", F::Gpt2, U::Read, "layers"},
      {"n_head", F::Gpt2, U::Read, "heads"},
      {"n_positions", F::Gpt2, U::Read, "context"},
      {"n_ctx", F::Gpt2, U::Checked, "= n_positions"},
      {"n_inner", F::Gpt2, U::Read, "MLP width; null: 4 x n_embd"},
      {"layer_norm_epsilon", F::Gpt2, U::Read, "LayerNorm epsilon"},
      {"activation_function", F::Gpt2, U::Read, "gelu_new or gelu_pytorch_tanh"},
      {"scale_attn_weights", F::Gpt2, U::Checked, "true only"},
      {"scale_attn_by_inverse_layer_idx", F::Gpt2, U::Checked, "false only"},
      {"reorder_and_upcast_attn", F::Gpt2, U::Ignored, "numerics of HF's kernel only"},
      {"summary_activation", F::Gpt2, U::Ignored, "sequence-classification head"},
      {"summary_first_dropout", F::Gpt2, U::Ignored, "sequence-classification head"},
      {"summary_proj_to_labels", F::Gpt2, U::Ignored, "sequence-classification head"},
      {"summary_type", F::Gpt2, U::Ignored, "sequence-classification head"},
      {"summary_use_proj", F::Gpt2, U::Ignored, "sequence-classification head"},
      {"task_specific_params", F::Gpt2, U::Ignored, "pipeline defaults"},
      {"resid_pdrop", F::Gpt2, U::Ignored, "dropout: none at inference"},
      {"embd_pdrop", F::Gpt2, U::Ignored, "dropout: none at inference"},
      {"attn_pdrop", F::Gpt2, U::Ignored, "dropout: none at inference"},
      {"attention_dropout", F::All, U::Ignored, "dropout: none at inference"},
      {"architectures", F::All, U::Ignored, "metadata"},
      {"torch_dtype", F::All, U::Ignored, "storage dtype; kiln uses --dtype"},
      {"dtype", F::All, U::Ignored, "storage dtype; kiln uses --dtype"},
      {"transformers_version", F::All, U::Ignored, "metadata"},
      {"_name_or_path", F::All, U::Ignored, "metadata"},
      {"bos_token_id", F::All, U::Ignored, "generation_config.json / tokenizer"},
      {"eos_token_id", F::All, U::Ignored, "generation_config.json / tokenizer"},
      {"pad_token_id", F::All, U::Ignored, "generation_config.json / tokenizer"},
      {"use_cache", F::All, U::Ignored, "kiln always caches keys and values"},
      {"initializer_range", F::All, U::Ignored, "random init only (--random-weights: 0.02)"},
  };
  return fields;
}

std::string hf_config_fields_help() {
  std::string out = "config.json fields (any other field is refused by name):\n";
  auto family = [](HfFamily f) {
    return f == HfFamily::All ? "" : f == HfFamily::Gpt2 ? " [gpt2]" : " [qwen/llama/mistral]";
  };
  for (HfFieldUse u : {HfFieldUse::Read, HfFieldUse::Checked, HfFieldUse::Ignored}) {
    out += u == HfFieldUse::Read      ? "  read:\n"
           : u == HfFieldUse::Checked ? "  accepted only with these values, else refused:\n"
                                      : "  ignored (cannot change the model):\n";
    for (const auto& f : hf_config_fields())
      if (f.use == u) out += fmt::format("    {}{}: {}\n", f.name, family(f.family), f.note);
  }
  return out;
}

namespace {

// Every field must be in hf_config_fields() for this family; the first that is not is refused.
void refuse_unknown_fields(const json& j, bool gpt2, const std::string& source) {
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const auto& f : hf_config_fields())
      if (key == f.name && (f.family == HfFamily::All || (f.family == HfFamily::Gpt2) == gpt2)) {
        known = true;
        break;
      }
    KILN_CHECK(known,
               "[config] {}: field '{}' = {} is not one kiln understands, so it would be "
               "ignored and a different model computed (kiln generate --help lists the fields)",
               source, key, shown(value));
  }
}

// The fields accepted only with some values (HfFieldUse::Checked) of the LLaMA family.
void check_llama_fields(const json& j, const std::string& type, std::int64_t max_pos,
                        const std::string& source) {
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    fail("[config] {}: rope_scaling {} is not supported (kiln implements no RoPE scaling)", source,
         shown(j["rope_scaling"]));
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const json& r = j["rope_parameters"];
    KILN_CHECK(r.is_object(), "[config] {}: rope_parameters must be an object, got {}", source,
               shown(r));
    for (const auto& [k, v] : r.items())
      KILN_CHECK(k == "rope_theta" || (k == "rope_type" && v == "default"),
                 "[config] {}: rope_parameters {} is not supported (kiln implements plain RoPE: "
                 "rope_type default and rope_theta only)",
                 source, shown(r));
  }
  const bool sliding = opt_bool(j, "use_sliding_window", source, false);
  KILN_CHECK(!sliding,
             "[config] {}: use_sliding_window true is not supported (kiln implements full "
             "attention only; sliding_window {})",
             source, j.contains("sliding_window") ? shown(j["sliding_window"]) : "absent");
  // Mistral applies sliding_window whenever it is set (no use_sliding_window switch); a window
  // at least the context long changes nothing.
  if (type == "mistral" && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    std::int64_t w = int_field(j, "sliding_window", source);
    KILN_CHECK(w >= max_pos,
               "[config] {}: sliding_window {} is not supported (kiln implements full attention "
               "only; a window of at least max_position_embeddings {} would be)",
               source, w, max_pos);
  }
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& lt = j["layer_types"];
    KILN_CHECK(lt.is_array(), "[config] {}: layer_types must be a list, got {}", source, shown(lt));
    for (const auto& t : lt)
      KILN_CHECK(t == "full_attention",
                 "[config] {}: layer_types entry {} is not supported (kiln implements "
                 "full_attention only)",
                 source, shown(t));
  }
  KILN_CHECK(!opt_bool(j, "mlp_bias", source, false),
             "[config] {}: mlp_bias true is not supported (kiln's gated MLP has no biases)",
             source);
  // HF's Qwen3, LLaMA and Mistral attention put attention_bias on o_proj as well as q/k/v;
  // kiln's decoder biases only q/k/v (Qwen2's layout).
  KILN_CHECK(type == "qwen2" || !opt_bool(j, "attention_bias", source, false),
             "[config] {}: attention_bias true is not supported for model_type {} (it biases "
             "o_proj too, which kiln's decoder does not)",
             source, type);
}

ModelConfig gpt2_from_hf(const json& j, const std::string& source) {
  // GPT-2's own field names (n_embd, n_layer, n_head, n_positions, n_inner).
  ModelConfig c = gpt2_config("gpt2", int_field(j, "vocab_size", source),
                              int_field(j, "n_embd", source), int_field(j, "n_layer", source),
                              int_field(j, "n_head", source), int_field(j, "n_positions", source));
  KILN_CHECK(c.n_heads > 0 && c.dim % c.n_heads == 0,
             "[config] {}: n_embd {} is not divisible by n_head {}", source, c.dim, c.n_heads);
  KILN_CHECK(opt_int(j, "n_ctx", source, c.max_seq_len) == c.max_seq_len,
             "[config] {}: n_ctx {} differs from n_positions {}", source, shown(j["n_ctx"]),
             c.max_seq_len);
  c.hidden_dim = opt_int(j, "n_inner", source, c.hidden_dim);
  c.norm_eps = opt_number(j, "layer_norm_epsilon", source, c.norm_eps);
  std::string act = opt_string(j, "activation_function", source, "gelu_new");
  KILN_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
             "[config] {}: activation_function '{}' is not supported (kiln's GPT-2 GELU is the "
             "tanh form, gelu_new)",
             source, act);
  KILN_CHECK(opt_bool(j, "scale_attn_weights", source, true),
             "[config] {}: scale_attn_weights false is not supported (kiln scales by "
             "1/sqrt(head_dim))",
             source);
  KILN_CHECK(!opt_bool(j, "scale_attn_by_inverse_layer_idx", source, false),
             "[config] {}: scale_attn_by_inverse_layer_idx true is not supported", source);
  c.tie_embeddings = opt_bool(j, "tie_word_embeddings", source, true);
  return c;
}

}  // namespace

ModelConfig from_hf_config(const nlohmann::json& j, const std::string& source) {
  KILN_CHECK(j.is_object(), "[config] {}: must be a JSON object, got {}", source, shown(j));
  const std::string type = opt_string(j, "model_type", source, "");
  KILN_CHECK(
      type == "qwen3" || type == "qwen2" || type == "llama" || type == "mistral" || type == "gpt2",
      "[config] {}: unknown model_type '{}' (supported: qwen3, qwen2, llama, mistral, gpt2)",
      source, type);
  refuse_unknown_fields(j, type == "gpt2", source);
  ModelConfig c;
  if (type == "gpt2") {
    c = gpt2_from_hf(j, source);
    validate_from(c, source);
    return c;
  }
  c.name = type;
  c.vocab_size = int_field(j, "vocab_size", source);
  c.dim = int_field(j, "hidden_size", source);
  c.hidden_dim = int_field(j, "intermediate_size", source);
  c.n_layers = int_field(j, "num_hidden_layers", source);
  c.n_heads = int_field(j, "num_attention_heads", source);
  c.n_kv_heads = opt_int(j, "num_key_value_heads", source, c.n_heads);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = int_field(j, "head_dim", source);
  } else {
    KILN_CHECK(c.n_heads > 0 && c.dim % c.n_heads == 0,
               "[config] {}: hidden_size {} is not divisible by num_attention_heads {}", source,
               c.dim, c.n_heads);
    c.head_dim = c.dim / c.n_heads;
  }
  c.max_seq_len = opt_int(j, "max_position_embeddings", source, 4096);
  check_llama_fields(j, type, c.max_seq_len, source);
  c.norm_eps = opt_number(j, "rms_norm_eps", source, 1e-6);
  c.rope_theta = opt_number(j, "rope_theta", source, 10000.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].contains("rope_theta"))
    c.rope_theta = opt_number(j["rope_parameters"], "rope_theta", source, c.rope_theta);
  c.rope_style = ops::RopeStyle::RotateHalf;
  c.tie_embeddings = opt_bool(j, "tie_word_embeddings", source, false);
  c.qk_norm = type == "qwen3";
  c.qkv_bias = type == "qwen2" ? true : opt_bool(j, "attention_bias", source, false);
  // The gated MLP's activation (HF's default is silu). Anything else would be a different model.
  if (j.contains("hidden_act") && !j["hidden_act"].is_null()) {
    const std::string act =
        j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>() : j["hidden_act"].dump();
    auto a = nn::parse_mlp_activation(act);
    KILN_CHECK(a.has_value(),
               "[config] {}: hidden_act \"{}\" is not supported (kiln implements {})", source, act,
               nn::mlp_activation_names());
    c.hidden_act = *a;
  }
  validate_from(c, source);
  return c;
}

nlohmann::json read_json_file(const std::string& path, std::string_view who) {
  // Regular files only, and small: a FIFO or /dev/zero given as config.json is refused at once.
  const std::string text = io::read_regular_file(path, who, kMaxJsonConfigBytes);
  return io::parse_json_limited(text, fmt::format("{} file {}", who, path),
                                {.max_bytes = kMaxJsonConfigBytes});
}

ModelConfig load_hf_config(const std::string& path) {
  return from_hf_config(read_json_file(path, "config"), path);
}

}  // namespace kiln::models
