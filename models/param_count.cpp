#include "models/param_count.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "models/decoder.h"
#include "models/gguf_model.h"
#include "models/io/gguf.h"

namespace kiln::models {

namespace {

std::int64_t mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  KILN_CHECK(!__builtin_mul_overflow(a, b, &r), "[params] {} x {} overflows a 64-bit count", a, b);
  return r;
}

std::int64_t add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  KILN_CHECK(!__builtin_add_overflow(a, b, &r), "[params] {} + {} overflows a 64-bit count", a, b);
  return r;
}

std::string with_commas(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string attention_kind(const ModelConfig &c) {
  if (c.n_kv_heads == c.n_heads) return "MHA";
  if (c.n_kv_heads == 1) return "MQA";
  return "GQA";
}

// "SwiGLU" (gated silu), "GELU-tanh" (GPT-2's plain MLP); others by kind and hidden_act.
std::string mlp_name(const ModelConfig &c) {
  const bool gated = c.mlp_kind == MlpKind::Gated;
  if (gated && c.hidden_act == MlpActivation::Silu) return "SwiGLU";
  if (!gated && c.hidden_act == MlpActivation::GeluTanh) return "GELU-tanh";
  return fmt::format("{} {}", gated ? "gated" : "plain", nn::mlp_activation_name(c.hidden_act));
}

std::string describe(const ModelConfig &c) {
  return fmt::format(
      "vocab {}, dim {}, {} layers, {}/{} heads ({}), head_dim {}, "
      "intermediate {}, {} MLP, {}{}{}, {}, "
      "{}{}",
      c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, attention_kind(c), c.head_dim,
      c.hidden_dim, mlp_name(c), c.norm_kind == NormKind::LayerNorm ? "LayerNorm" : "RMSNorm",
      c.qk_norm ? ", QK-norm" : "",
      c.bias ? ", biases everywhere" : (c.qkv_bias ? ", QKV bias" : ""),
      c.uses_rope() ? "RoPE" : fmt::format("learned positions ({})", c.max_seq_len),
      c.tie_embeddings ? "tied" : "untied", c.final_norm ? "" : ", no final norm");
}

}  // namespace

ParamCount count_params(const ModelConfig &cfg) {
  ModelConfig c = cfg;
  c.validate();
  ParamCount pc;
  auto row = [&](std::string key, std::string label, std::int64_t n, std::int64_t layers) {
    pc.rows.push_back({std::move(key), std::move(label), n, layers, false});
  };
  const std::int64_t L = c.n_layers, q_dim = mul(c.n_heads, c.head_dim);
  const std::int64_t kv_dim = mul(c.n_kv_heads, c.head_dim);
  const std::int64_t table = mul(c.vocab_size, c.dim);
  const bool qkv_bias = c.qkv_bias || c.bias;  // as DecoderModel's attention_config

  row("model.embed_tokens.weight", "embedding", table, 1);
  // GPT-2's learned position table wpe: max_seq_len x dim.
  const std::int64_t positions =
      c.pos_embedding == PosEmbedding::Learned ? mul(c.max_seq_len, c.dim) : 0;
  if (positions) row("model.embed_positions.weight", "position embedding", positions, 1);
  // Attention: q (dim -> H·D), k/v (dim -> Hkv·D), o (H·D -> dim).
  auto linear = [&](const std::string &prefix, const std::string &name, std::int64_t in,
                    std::int64_t out, bool bias) {
    row("layers.*." + prefix + name + ".weight", name, mul(in, out), L);
    if (bias) row("layers.*." + prefix + name + ".bias", name + " bias", out, L);
  };
  linear("self_attn.", "q_proj", c.dim, q_dim, qkv_bias);
  linear("self_attn.", "k_proj", c.dim, kv_dim, qkv_bias);
  linear("self_attn.", "v_proj", c.dim, kv_dim, qkv_bias);
  linear("self_attn.", "o_proj", q_dim, c.dim, c.bias);
  // QK-norm is an RMSNorm over head_dim (shared by all heads), not over dim.
  if (c.qk_norm) {
    row("layers.*.self_attn.q_norm.weight", "q_norm (QK-norm)", c.head_dim, L);
    row("layers.*.self_attn.k_norm.weight", "k_norm (QK-norm)", c.head_dim, L);
  }
  if (c.mlp_kind == MlpKind::Plain) {
    linear("mlp.", "fc", c.dim, c.hidden_dim, c.bias);
    linear("mlp.", "proj", c.hidden_dim, c.dim, c.bias);
  } else {
    linear("mlp.", "gate_proj", c.dim, c.hidden_dim, c.bias);
    linear("mlp.", "up_proj", c.dim, c.hidden_dim, c.bias);
    linear("mlp.", "down_proj", c.hidden_dim, c.dim, c.bias);
  }
  for (const char *norm : {"input_layernorm", "post_attention_layernorm"}) {
    row(fmt::format("layers.*.{}.weight", norm), norm, c.dim, L);
    if (c.norm_kind == NormKind::LayerNorm)
      row(fmt::format("layers.*.{}.bias", norm), fmt::format("{} bias", norm), c.dim, L);
  }
  if (c.final_norm) {
    row("model.norm.weight", "final norm", c.dim, 1);
    if (c.norm_kind == NormKind::LayerNorm) row("model.norm.bias", "final norm bias", c.dim, 1);
  }
  if (c.tie_embeddings) {
    pc.rows.push_back({"lm_head.weight", "lm_head (tied to embedding)", 0, 1, true});
  } else {
    row("lm_head.weight", "lm_head", table, 1);
  }

  for (const auto &r : pc.rows) pc.total = add(pc.total, mul(r.per_layer, r.layers));
  pc.embedding = add(c.tie_embeddings ? table : mul(2, table), positions);
  return pc;
}

std::string param_row_key(const std::string &name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return name;
  std::size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return name;
  return "layers.*" + name.substr(dot);
}

std::map<std::string, std::int64_t> count_meta_params(const ModelConfig &c) {
  // On meta, random init and fills allocate no memory and run no kernel; the
  // tracker sees the bytes, released when the model goes out of scope.
  DecoderModel model(c, 0, DType::F32, Device::meta());
  std::map<std::string, std::int64_t> out;
  std::int64_t total = 0;
  for (const auto &[name, t] : model.named_parameters()) {
    KILN_CHECK(t.device().is_meta(), "[params] parameter {} is not on the meta device", name);
    out[param_row_key(name)] += t.numel();
    total = add(total, t.numel());
  }
  out["total"] = total;
  return out;
}

ModelConfig apply_what_if(ModelConfig c, const WhatIf &w) {
  std::vector<std::string> changes;
  if (w.kv_heads) {
    KILN_CHECK(*w.kv_heads > 0, "[params] --kv-heads {} must be positive", *w.kv_heads);
    KILN_CHECK(c.n_heads % *w.kv_heads == 0,
               "[params] --kv-heads {} must divide the {} attention heads", *w.kv_heads, c.n_heads);
    c.n_kv_heads = *w.kv_heads;
    changes.push_back(fmt::format("kv-heads {}", c.n_kv_heads));
  }
  if (w.intermediate) {
    KILN_CHECK(*w.intermediate > 0, "[params] --intermediate {} must be positive", *w.intermediate);
    c.hidden_dim = *w.intermediate;
    changes.push_back(fmt::format("intermediate {}", c.hidden_dim));
  }
  if (w.layers) {
    KILN_CHECK(*w.layers > 0, "[params] --layers {} must be positive", *w.layers);
    c.n_layers = *w.layers;
    changes.push_back(fmt::format("layers {}", c.n_layers));
  }
  if (w.tie) {
    c.tie_embeddings = *w.tie;
    changes.push_back(c.tie_embeddings ? "tied" : "untied");
  }
  if (w.norm) {
    c.norm_kind = *w.norm;
    changes.push_back(nn::norm_kind_name(c.norm_kind));
  }
  if (w.mlp || w.act) {
    if (w.mlp) c.mlp_kind = *w.mlp;
    const bool plain = c.mlp_kind == MlpKind::Plain;
    if (w.act)
      c.hidden_act = *w.act;
    else
      c.hidden_act = plain ? MlpActivation::GeluTanh : MlpActivation::Silu;
    changes.push_back(mlp_name(c));
  }
  if (w.final_norm) {
    c.final_norm = *w.final_norm;
    changes.push_back(c.final_norm ? "final norm" : "no final norm");
  }
  if (w.bias) {
    c.bias = true;
    changes.push_back("bias");
  }
  if (!changes.empty()) {
    std::string s;
    for (auto &ch : changes) s += (s.empty() ? "" : ", ") + ch;
    c.name += " + what-if (" + s + ")";
  }
  c.validate();
  return c;
}

ModelConfig resolve_model_config(const std::string &spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    fs::path cfg = fs::path(spec) / "config.json";
    KILN_CHECK(fs::is_regular_file(cfg, ec), "[config] folder {} has no config.json", spec);
    ModelConfig c = load_hf_config(cfg.string());
    c.name = spec + " (" + c.name + ")";
    return c;
  }
  if (spec.ends_with(".gguf") && fs::is_regular_file(spec, ec)) {  // llama.cpp's format
    ModelConfig c = gguf_model_config(io::GgufFile(spec));
    c.name = spec + " (" + c.name + ")";
    return c;
  }
  if (fs::exists(spec, ec)) {  // read_json_file refuses what is not a regular file
    nlohmann::json j = read_json_file(spec, "config");
    ModelConfig c = j.is_object() && j.contains("model_type") ? from_hf_config(j, spec)
                                                              : ModelConfig::from_json(j, spec);
    c.name = spec + " (" + c.name + ")";
    return c;
  }
  KILN_CHECK(spec.find('/') == std::string::npos && !spec.ends_with(".json"),
             "[config] no such file or folder: {}", spec);
  return preset(spec);
}

nlohmann::json param_report_json(const ModelConfig &c, const ParamCount &formula,
                                 const std::map<std::string, std::int64_t> &actual) {
  auto get = [&](const std::string &k) {
    auto it = actual.find(k);
    return it == actual.end() ? std::int64_t{0} : it->second;
  };
  nlohmann::json rows = nlohmann::json::array();
  bool identical = true;
  std::set<std::string> known{"total"};
  for (const auto &r : formula.rows) {
    known.insert(r.key);
    std::int64_t a = get(r.key);
    identical = identical && a == r.total();
    rows.push_back(
        {{"key", r.key},
         {"label", r.label},
         {"per_layer", r.per_layer},
         {"layers", r.layers},
         {"total", r.total()},
         {"tied", r.tied},
         {"percent", 100.0 * static_cast<double>(r.total()) / static_cast<double>(formula.total)},
         {"actual", a}});
  }
  nlohmann::json unexpected = nlohmann::json::object();
  for (const auto &[k, v] : actual)
    if (!known.count(k)) unexpected[k] = v, identical = false;
  identical = identical && get("total") == formula.total;
  return {{"model", c.name},
          {"config", c.to_json()},
          {"rows", rows},
          {"unexpected_actual_rows", unexpected},
          {"formula_total", formula.total},
          {"actual_total", get("total")},
          {"difference", get("total") - formula.total},
          {"identical", identical},
          {"embedding", formula.embedding},
          {"non_embedding", formula.non_embedding()}};
}

std::string param_report_text(const ModelConfig &c, const ParamCount &formula,
                              const std::map<std::string, std::int64_t> &actual, bool *identical) {
  nlohmann::json j = param_report_json(c, formula, actual);
  std::string s = fmt::format("{}: {}\n\n", c.name, describe(c));
  s += fmt::format("{:<34} {:>15} {:>20} {:>8}\n", "component", "per layer",
                   fmt::format("total (x{} layers)", c.n_layers), "% total");
  s += std::string(80, '-') + "\n";
  for (const auto &r : j["rows"]) {
    const bool per_layer = r["layers"].get<std::int64_t>() > 1 ||
                           r["key"].get<std::string>().rfind("layers.*.", 0) == 0;
    std::string label =
        per_layer ? "  " + r["label"].get<std::string>() : r["label"].get<std::string>();
    std::string per = per_layer ? with_commas(r["per_layer"].get<std::int64_t>()) : "";
    std::string tot = r["tied"].get<bool>() ? "tied" : with_commas(r["total"].get<std::int64_t>());
    s += fmt::format(
        "{:<34} {:>15} {:>20} {:>8}", label, per, tot,
        r["tied"].get<bool>() ? "" : fmt::format("{:.2f}%", r["percent"].get<double>()));
    if (r["actual"].get<std::int64_t>() != r["total"].get<std::int64_t>())
      s += fmt::format("  (actual {})", with_commas(r["actual"].get<std::int64_t>()));
    s += "\n";
  }
  for (const auto &[k, v] : j["unexpected_actual_rows"].items())
    s += fmt::format("{:<34} {:>15} {:>20}  (in the model, not in the formula)\n", k, "",
                     with_commas(v.get<std::int64_t>()));
  s += std::string(80, '-') + "\n";
  std::int64_t per_layer_sum = 0;
  for (const auto &r : formula.rows)
    if (r.key.rfind("layers.*.", 0) == 0) per_layer_sum += r.per_layer;
  s += fmt::format("{:<34} {:>15}\n", "one layer", with_commas(per_layer_sum));
  std::int64_t ft = j["formula_total"], at = j["actual_total"];
  s += fmt::format("{:<34} {:>36}\n", "formula total", with_commas(ft));
  s += fmt::format("{:<34} {:>36}  ", "actual total (meta-device model)", with_commas(at));
  const bool same = j["identical"].get<bool>();
  s += same ? "identical\n"
            : fmt::format("DIFFERENT: actual - formula = {}\n", with_commas(at - ft));
  s += fmt::format("{:<34} {:>36}  ({:.2f}%; excludes {})\n", "non-embedding",
                   with_commas(formula.non_embedding()),
                   100.0 * static_cast<double>(formula.non_embedding()) / static_cast<double>(ft),
                   c.uses_rope() ? (c.tie_embeddings ? "the vocab x dim embedding"
                                                     : "embedding and lm_head, vocab x dim each")
                                 : (c.tie_embeddings ? "the token and position embeddings"
                                                     : "token/position embeddings and lm_head"));
  if (identical) *identical = same;
  return s;
}

}  // namespace kiln::models
