// Test helpers: a tiny Qwen3 written as a Hugging Face folder (config.json in
// HF field names, generation_config.json, two safetensors shards + index), a
// llama2.c legacy .bin writer, and a runner for tests/golden/reference_qwen3.py.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/weights.h"
#include "tests/test_python.h"

namespace kiln::test_hf {

namespace fs = std::filesystem;

// hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16, QK-norm, vocab 1000.
inline models::ModelConfig tiny_qwen3(bool tied, std::int64_t max_seq_len = 64) {
  models::ModelConfig c;
  c.name = "qwen3";
  c.vocab_size = 1000;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.hidden_dim = 160;
  c.max_seq_len = max_seq_len;
  c.norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.rope_style = ops::RopeStyle::RotateHalf;
  c.qk_norm = true;
  c.tie_embeddings = tied;
  return c;
}

// Weights at a scale where every path matters (the default 0.02 init gives flat
// logits and near-tie argmaxes): matrices N(0, 1/sqrt(fan_in)), embedding and LM head N(0, 1),
// norms 1 + N(0, 0.1).
inline void init_weights(models::DecoderModel& m, std::uint64_t seed) {
  Generator gen(seed);
  for (auto& [name, p] : m.named_parameters()) {
    Tensor v;
    if (p.dim() == 1)
      v = ops::randn(p.shape(), gen, 1.0, 0.1);
    else if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
      v = ops::randn(p.shape(), gen, 0.0, 1.0);
    else
      v = ops::randn(p.shape(), gen, 0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))));
    Tensor d = p.detach();
    d.copy_(v);
  }
}

inline nlohmann::json hf_config_json(const models::ModelConfig& c) {
  return {{"architectures", {"Qwen3ForCausalLM"}},
          {"model_type", "qwen3"},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.dim},
          {"intermediate_size", c.hidden_dim},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.n_kv_heads},
          {"head_dim", c.head_dim},
          {"max_position_embeddings", c.max_seq_len},
          {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"tie_word_embeddings", c.tie_embeddings},
          {"attention_bias", false},
          {"hidden_act", nn::mlp_activation_name(c.hidden_act)},
          {"torch_dtype", "float32"}};
}

inline void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream(p) << j.dump(2);
}

// config.json + generation_config.json + model-0000{1,2}-of-00002.safetensors
// (embeddings and layer 0 in the first, the rest in the second) + index.
inline void write_hf_folder(const models::DecoderModel& m, const fs::path& dir,
                            const nlohmann::json& generation = nullptr, DType dtype = DType::F32) {
  fs::create_directories(dir);
  write_json(dir / "config.json", hf_config_json(m.cfg));
  if (!generation.is_null()) write_json(dir / "generation_config.json", generation);
  io::SafetensorsWriter w1, w2;
  std::vector<Tensor> keep;  // the writers do not copy
  std::map<std::string, std::string> weight_map;
  const std::string s1 = "model-00001-of-00002.safetensors",
                    s2 = "model-00002-of-00002.safetensors";
  for (const auto& [name, p] : m.named_parameters()) {
    Tensor t = p.detach().to(dtype).contiguous();
    keep.push_back(t);
    bool first = name.find("layers.1.") == std::string::npos && name != "model.norm.weight" &&
                 name != "lm_head.weight";
    (first ? w1 : w2)
        .add(name, std::string(dtype_safetensors_name(dtype)), t.shape(), t.raw_data(), t.nbytes());
    weight_map[name] = first ? s1 : s2;
  }
  w1.write((dir / s1).string());
  w2.write((dir / s2).string());
  io::write_safetensors_index((dir / "model.safetensors.index.json").string(),
                              {{"total_size", std::to_string(w1.total_bytes() + w2.total_bytes())}},
                              weight_map);
}

// run.c's legacy layout: 7 int32 header (vocab negative when the classifier is
// not shared), then f32 weights layer-stacked by kind, freq_cis, [wcls].
// freq_cis is ignored by readers; a non-zero fill lets a test prove that.
inline void write_llama2c_bin(const models::DecoderModel& m, const std::string& path,
                              float freq_cis_fill = 0.0f) {
  const models::ModelConfig& c = m.cfg;
  auto sd = m.state_dict();
  std::ofstream f(path, std::ios::binary);
  auto i32 = [&](std::int64_t v) {
    auto x = static_cast<std::int32_t>(v);
    f.write(reinterpret_cast<const char*>(&x), 4);
  };
  auto put = [&](const std::string& name) {
    auto v = sd.at(name).to_float_vector();
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  };
  auto per_layer = [&](const std::string& suffix) {
    for (std::int64_t l = 0; l < c.n_layers; ++l)
      put("model.layers." + std::to_string(l) + "." + suffix);
  };
  i32(c.dim), i32(c.hidden_dim), i32(c.n_layers), i32(c.n_heads), i32(c.n_kv_heads);
  i32(c.tie_embeddings ? c.vocab_size : -c.vocab_size), i32(c.max_seq_len);
  put("model.embed_tokens.weight");
  per_layer("input_layernorm.weight");
  per_layer("self_attn.q_proj.weight");
  per_layer("self_attn.k_proj.weight");
  per_layer("self_attn.v_proj.weight");
  per_layer("self_attn.o_proj.weight");
  per_layer("post_attention_layernorm.weight");
  per_layer("mlp.gate_proj.weight");  // w1
  per_layer("mlp.down_proj.weight");  // w2
  per_layer("mlp.up_proj.weight");    // w3
  put("model.norm.weight");
  std::vector<float> freq(static_cast<std::size_t>(c.max_seq_len * c.head_dim), freq_cis_fill);
  f.write(reinterpret_cast<const char*>(freq.data()),
          static_cast<std::streamsize>(freq.size() * 4));
  if (!c.tie_embeddings) put("lm_head.weight");
}

struct Reference {
  std::vector<double> prompt_logits, step_logits, step_margin;
  std::vector<std::int32_t> greedy_ids;
};

// Runs reference_qwen3.py MODE MODEL request.json OUT; ADD_FAILURE (never a skip)
// when torch is missing or the script fails. ok=false then.
inline Reference run_reference(const std::string& mode, const std::string& model,
                               const std::vector<std::int32_t>& prompt, int n_greedy,
                               const fs::path& work, bool* ok) {
  *ok = false;
  Reference r;
  if (std::system((test_python() + " -c 'import torch, numpy' > /dev/null 2>&1").c_str()) != 0) {
    ADD_FAILURE() << test_python()
                  << " cannot import torch and numpy: the golden tests need "
                     "Debian's python3-torch. They are not skipped on purpose.";
    return r;
  }
  fs::create_directories(work);
  write_json(work / "request.json", {{"prompt_ids", prompt}, {"n_greedy", n_greedy}});
  std::string script = std::string(KILN_SOURCE_DIR) + "/tests/golden/reference_qwen3.py";
  std::string log = (work / "reference.log").string();
  std::string cmd = test_python() + " '" + script + "' " + mode + " '" + model + "' '" +
                    (work / "request.json").string() + "' '" + (work / "out").string() + "' > '" +
                    log + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream f(log);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ADD_FAILURE() << "reference_qwen3.py failed:\n" << text;
    return r;
  }
  io::SafetensorsFile f((work / "out" / "outputs.safetensors").string());
  auto get = [&](const char* name) {
    const auto& e = f.at(name);
    return models::tensor_from_bytes(e.dtype, e.shape, f.data(e), e.nbytes()).to_double_vector();
  };
  r.prompt_logits = get("prompt_logits");
  r.step_logits = get("step_logits");
  r.step_margin = get("step_margin");
  for (double v : get("greedy_ids")) r.greedy_ids.push_back(static_cast<std::int32_t>(v));
  *ok = true;
  return r;
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? m : INFINITY;
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace kiln::test_hf
