#include "models/config.h"

#include <fstream>
#include <type_traits>

namespace kiln::models {

namespace {

// The string field `field` of j, parsed into an enum; `fallback` when absent.
template <typename E>
E enum_field(const nlohmann::json& j, const char* field, E fallback,
             std::optional<E> (*parse)(std::string_view), const char* known) {
  if (!j.contains(field)) return fallback;
  std::string s = j.at(field).get<std::string>();
  std::optional<E> e = parse(s);
  KILN_CHECK(e.has_value(), "[config] {} '{}' is not supported (kiln implements {})", field, s,
             known);
  return *e;
}

// An optional config.json field of JSON type T (bool, double or std::string): `fallback` when
// absent or null. A value of another type is refused by name: nlohmann's j.value() would throw a
// raw type_error that names neither the file nor the field.
template <typename T>
T hf_field(const nlohmann::json& j, const char* field, T fallback, const std::string& source) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  const nlohmann::json& v = j[field];
  const char* want = "a number";
  bool ok = v.is_number();
  if constexpr (std::is_same_v<T, bool>) {
    want = "true or false";
    ok = v.is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    want = "a string";
    ok = v.is_string();
  }
  KILN_CHECK(ok, "[config] {}: field '{}' must be {}, got {}", source, field, want, v.dump());
  return v.get<T>();
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [](std::int64_t v, const char* field) {
    KILN_CHECK(v > 0 && v < (std::int64_t{1} << 40), "[config] {} = {} must be positive", field, v);
  };
  positive(vocab_size, "vocab_size");
  positive(dim, "dim (hidden_size)");
  positive(n_layers, "n_layers (num_hidden_layers)");
  positive(n_heads, "n_heads (num_attention_heads)");
  positive(n_kv_heads, "n_kv_heads (num_key_value_heads)");
  positive(head_dim, "head_dim");
  positive(hidden_dim, "hidden_dim (intermediate_size)");
  positive(max_seq_len, "max_seq_len (max_position_embeddings)");
  KILN_CHECK(n_heads % n_kv_heads == 0,
             "[config] num_attention_heads {} is not divisible by num_key_value_heads {}", n_heads,
             n_kv_heads);
  KILN_CHECK(norm_eps > 0 && norm_eps < 1, "[config] norm_eps {} out of range", norm_eps);
  if (uses_rope()) {
    KILN_CHECK(head_dim % 2 == 0, "[config] head_dim {} must be even for RoPE", head_dim);
    KILN_CHECK(rope_theta > 1, "[config] rope_theta {} must be > 1", rope_theta);
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

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  ModelConfig c;
  try {
    c.name = j.value("name", std::string("custom"));
    c.vocab_size = j.at("vocab_size").get<std::int64_t>();
    c.dim = j.at("dim").get<std::int64_t>();
    c.n_layers = j.at("n_layers").get<std::int64_t>();
    c.n_heads = j.at("n_heads").get<std::int64_t>();
    c.n_kv_heads = j.value("n_kv_heads", c.n_heads);
    c.head_dim = j.value("head_dim", std::int64_t{0});
    c.hidden_dim = j.at("hidden_dim").get<std::int64_t>();
    c.max_seq_len = j.at("max_seq_len").get<std::int64_t>();
    c.norm_eps = j.value("norm_eps", 1e-5);
    c.rope_theta = j.value("rope_theta", 10000.0);
    std::string style = j.value("rope_style", std::string("interleaved"));
    KILN_CHECK(style == "interleaved" || style == "rotate_half",
               "[config] rope_style '{}' must be interleaved or rotate_half", style);
    c.rope_style =
        style == "interleaved" ? ops::RopeStyle::Interleaved : ops::RopeStyle::RotateHalf;
    c.qk_norm = j.value("qk_norm", false);
    c.qkv_bias = j.value("qkv_bias", false);
    c.tie_embeddings = j.value("tie_embeddings", true);
    // Before the enums: "layernorm": true, "gelu_mlp": true (fc/proj with tanh GELU).
    c.norm_kind = j.value("layernorm", false) ? NormKind::LayerNorm : NormKind::RmsNorm;
    const bool gelu_mlp = j.value("gelu_mlp", false);
    c.mlp_kind = gelu_mlp ? MlpKind::Plain : MlpKind::Gated;
    c.hidden_act = gelu_mlp ? MlpActivation::GeluTanh : MlpActivation::Silu;
    c.norm_kind =
        enum_field(j, "norm_kind", c.norm_kind, nn::parse_norm_kind, "rmsnorm, layernorm");
    c.mlp_kind = enum_field(j, "mlp_kind", c.mlp_kind, nn::parse_mlp_kind, "gated, plain");
    c.hidden_act = enum_field(j, "hidden_act", c.hidden_act, nn::parse_mlp_activation,
                              nn::kMlpActivationNames);
    c.bias = j.value("bias", false);
    c.final_norm = j.value("final_norm", true);
    std::string pos = j.value("pos_embedding", std::string("rope"));
    KILN_CHECK(pos == "rope" || pos == "learned",
               "[config] pos_embedding '{}' must be rope or learned", pos);
    c.pos_embedding = pos == "rope" ? PosEmbedding::Rope : PosEmbedding::Learned;
    c.init_std = j.value("init_std", 0.02);
  } catch (const nlohmann::json::exception& e) {
    fail("[config] bad model config: {}", e.what());
  }
  if (c.head_dim == 0 && c.n_heads > 0) c.head_dim = c.dim / c.n_heads;
  c.validate();
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
  return {"shakespeare-char", "stories260K", "stories15M", "stories42M",
          "stories110M",      "qwen3-0.6b",  "qwen3-8b",   "gpt2-124m"};
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

ModelConfig from_hf_config(const nlohmann::json& j, const std::string& source) {
  ModelConfig c;
  auto get_int = [&](const char* field) -> std::int64_t {
    KILN_CHECK(j.contains(field), "[config] config.json lacks field '{}'", field);
    KILN_CHECK(j[field].is_number_integer(), "[config] field '{}' must be an integer", field);
    return j[field].get<std::int64_t>();
  };
  KILN_CHECK(j.is_object(), "[config] config.json must be a JSON object");
  std::string type = hf_field(j, "model_type", std::string(), source);
  KILN_CHECK(
      type == "qwen3" || type == "qwen2" || type == "llama" || type == "mistral" || type == "gpt2",
      "[config] unknown model_type '{}' (supported: qwen3, qwen2, llama, mistral, gpt2)", type);
  if (type == "gpt2") {
    // GPT-2's own field names (n_embd, n_layer, n_head, n_positions, n_inner).
    c = gpt2_config("gpt2", get_int("vocab_size"), get_int("n_embd"), get_int("n_layer"),
                    get_int("n_head"), get_int("n_positions"));
    KILN_CHECK(c.n_heads > 0 && c.dim % c.n_heads == 0,
               "[config] n_embd {} is not divisible by n_head {}", c.dim, c.n_heads);
    if (j.contains("n_inner") && !j["n_inner"].is_null()) c.hidden_dim = get_int("n_inner");
    if (j.contains("layer_norm_epsilon") && j["layer_norm_epsilon"].is_number())
      c.norm_eps = j["layer_norm_epsilon"].get<double>();
    std::string act = hf_field(j, "activation_function", std::string("gelu_new"), source);
    KILN_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
               "[config] GPT-2 activation_function '{}' is not supported (kiln's GELU is the "
               "tanh form, gelu_new)",
               act);
    c.tie_embeddings = hf_field(j, "tie_word_embeddings", true, source);
    c.validate();
    return c;
  }
  c.name = type;
  c.vocab_size = get_int("vocab_size");
  c.dim = get_int("hidden_size");
  c.hidden_dim = get_int("intermediate_size");
  c.n_layers = get_int("num_hidden_layers");
  c.n_heads = get_int("num_attention_heads");
  c.n_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                     ? get_int("num_key_value_heads")
                     : c.n_heads;
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = get_int("head_dim");
  } else {
    KILN_CHECK(c.n_heads > 0 && c.dim % c.n_heads == 0,
               "[config] hidden_size {} is not divisible by num_attention_heads {}", c.dim,
               c.n_heads);
    c.head_dim = c.dim / c.n_heads;
  }
  c.max_seq_len = j.contains("max_position_embeddings") ? get_int("max_position_embeddings") : 4096;
  c.norm_eps = hf_field(j, "rms_norm_eps", 1e-6, source);
  double theta = 10000.0;
  if (j.contains("rope_theta") && j["rope_theta"].is_number())
    theta = j["rope_theta"].get<double>();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    theta = hf_field(j["rope_parameters"], "rope_theta", theta, source);
  c.rope_theta = theta;
  c.rope_style = ops::RopeStyle::RotateHalf;
  c.tie_embeddings = hf_field(j, "tie_word_embeddings", false, source);
  c.qk_norm = type == "qwen3";
  c.qkv_bias = type == "qwen2" ? true : hf_field(j, "attention_bias", false, source);
  // The gated MLP's activation (HF's default is silu). Anything else would be a different model.
  if (j.contains("hidden_act") && !j["hidden_act"].is_null()) {
    const std::string act =
        j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>() : j["hidden_act"].dump();
    auto a = nn::parse_mlp_activation(act);
    KILN_CHECK(a.has_value(),
               "[config] {}: hidden_act \"{}\" is not supported (kiln implements {})", source, act,
               nn::kMlpActivationNames);
    c.hidden_act = *a;
  }
  c.validate();
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  std::ifstream f(path);
  KILN_CHECK(f.good(), "[config] cannot open {}", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("[config] {} is not valid JSON: {}", path, e.what());
  }
  return from_hf_config(j, path);
}

}  // namespace kiln::models
