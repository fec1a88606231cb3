#include "models/generation_config.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "models/gguf_model.h"
#include "models/io/gguf_tokenizer.h"
#include "models/io/qwen_tokenizer.h"
#include "models/weights.h"

namespace fs = std::filesystem;

namespace kiln::models {

namespace {

std::int32_t token_id(const nlohmann::json& v, const std::string& source, const char* field) {
  KILN_CHECK(v.is_number_integer(),
             "[generation_config] {}: '{}' must be an integer or a list of "
             "integers, got {}",
             source, field, v.dump());
  auto x = v.get<std::int64_t>();
  KILN_CHECK(x >= 0 && x <= std::numeric_limits<std::int32_t>::max(),
             "[generation_config] {}: '{}' value {} is not a valid token id", source, field, x);
  return static_cast<std::int32_t>(x);
}

double number(const nlohmann::json& j, const char* field, const std::string& source, double lo,
              double hi, double fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  KILN_CHECK(j[field].is_number(), "[generation_config] {}: '{}' must be a number, got {}", source,
             field, j[field].dump());
  double v = j[field].get<double>();
  KILN_CHECK(v >= lo && v <= hi, "[generation_config] {}: '{}' = {} is outside [{}, {}]", source,
             field, v, lo, hi);
  return v;
}

// The model of `cfg`; an out-of-memory error names the config file its sizes came from.
std::unique_ptr<DecoderModel> build_model(const ModelConfig& cfg, const ModelSource& src,
                                          const std::string& config_path) {
  try {
    return std::make_unique<DecoderModel>(cfg, src.weights_seed, src.dtype, src.device);
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(fmt::format("{} (sizes from {})", e.what(), config_path));
  }
}

bool has_tokenizer_files(const fs::path& d) {
  return fs::exists(d / "tokenizer.json") ||
         (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt"));
}

}  // namespace

SamplingOptions GenerationConfig::sampling(std::uint64_t seed) const {
  SamplingOptions s;
  s.temperature = do_sample ? temperature : 0.0;
  s.top_k = top_k;
  s.top_p = top_p;
  s.min_p = min_p;
  s.repetition_penalty = repetition_penalty;
  s.seed = seed;
  return s;
}

GenerationConfig parse_generation_config(const nlohmann::json& j, const std::string& source) {
  KILN_CHECK(j.is_object(), "[generation_config] {}: must be a JSON object", source);
  GenerationConfig g;
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const auto& e = j["eos_token_id"];
    if (e.is_array()) {
      for (const auto& x : e) g.eos_token_ids.push_back(token_id(x, source, "eos_token_id"));
    } else {
      g.eos_token_ids.push_back(token_id(e, source, "eos_token_id"));
    }
  }
  for (const char* f : {"bos_token_id", "pad_token_id"})
    if (j.contains(f) && !j[f].is_null())
      (std::string(f) == "bos_token_id" ? g.bos_token_id : g.pad_token_id) =
          token_id(j[f], source, f);
  if (j.contains("do_sample") && !j["do_sample"].is_null()) {
    KILN_CHECK(j["do_sample"].is_boolean(),
               "[generation_config] {}: 'do_sample' must be true or "
               "false, got {}",
               source, j["do_sample"].dump());
    g.do_sample = j["do_sample"].get<bool>();
  }
  g.temperature = number(j, "temperature", source, 0.0, 1e6, g.temperature);
  g.top_p = number(j, "top_p", source, 0.0, 1.0, g.top_p);
  KILN_CHECK(g.top_p > 0, "[generation_config] {}: 'top_p' must be > 0", source);
  g.min_p = number(j, "min_p", source, 0.0, 1.0, g.min_p);
  g.repetition_penalty = number(j, "repetition_penalty", source, 1e-6, 1e6, g.repetition_penalty);
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    KILN_CHECK(j["top_k"].is_number_integer() && j["top_k"].get<std::int64_t>() >= 0,
               "[generation_config] {}: 'top_k' must be an integer >= 0, got {}", source,
               j["top_k"].dump());
    g.top_k = j["top_k"].get<std::int64_t>();
  }
  if (j.contains("max_new_tokens") && !j["max_new_tokens"].is_null()) {
    KILN_CHECK(
        j["max_new_tokens"].is_number_integer() && j["max_new_tokens"].get<std::int64_t>() > 0,
        "[generation_config] {}: 'max_new_tokens' must be an integer > 0, got {}", source,
        j["max_new_tokens"].dump());
    g.max_new_tokens = j["max_new_tokens"].get<std::int64_t>();
  }
  return g;
}

GenerationConfig load_generation_config(const std::string& path) {
  return parse_generation_config(read_json_file(path, "generation_config"), path);
}

ModelConfig read_model_config(const std::string& path) {
  // load_hf_config's messages name the field; add the file they came from.
  try {
    return load_hf_config(path);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.find(path) != std::string::npos) throw;
    fail("[load_model] {}: {}", path, msg);
  }
}

LoadedModel load_model(const ModelSource& src) {
  LoadedModel out;
  KILN_CHECK(src.dtype == DType::F32 || src.dtype == DType::BF16 || src.dtype == DType::F16,
             "[load_model] dtype {} is not a model dtype (f32, bf16 or f16)",
             dtype_name(src.dtype));
  fs::path tok_dir;  // folder that may hold Qwen tokenizer files
  if (src.random_weights) {
    KILN_CHECK(!src.config.empty(),
               "[load_model] --random-weights needs --config PATH/config.json");
    ModelConfig cfg = read_model_config(src.config);
    out.model = build_model(cfg, src, src.config);
    out.model->eval();
    fs::path cdir = fs::path(src.config).parent_path();
    if (cdir.empty()) cdir = ".";
    if (fs::exists(cdir / "generation_config.json"))
      out.generation = load_generation_config((cdir / "generation_config.json").string());
    tok_dir = has_tokenizer_files(cdir) ? cdir : cdir.parent_path();
    out.description =
        fmt::format("{} (random weights, seed {}) from {}", cfg.name, src.weights_seed, src.config);
  } else {
    KILN_CHECK(!src.model.empty(),
               "[load_model] no model given (a folder, a .bin, or "
               "--random-weights --config)");
    KILN_CHECK(fs::exists(src.model), "[load_model] {} does not exist", src.model);
    if (fs::is_directory(src.model)) {
      fs::path d(src.model);
      KILN_CHECK(fs::exists(d / "config.json"), "[load_model] {}: no config.json in the folder",
                 src.model);
      ModelConfig cfg = read_model_config((d / "config.json").string());
      LoadOptions lo;
      lo.ignore_tied_lm_head = cfg.tie_embeddings;  // some tied checkpoints still carry it
      // Built on meta (no memory), then each weight gets its bytes on src.device: on the CPU
      // in place in the file mapping where the file holds --dtype (Qwen3-8B's 16.4 GB of bf16
      // are never copied), else a converted copy. load_safetensors checks the config against
      // the files before it materializes anything, so a config that disagrees with the weights
      // (a billion layers over a 3-layer file) is refused before any memory is taken.
      out.model = std::make_unique<DecoderModel>(cfg, 0, src.dtype, Device::meta());
      lo.materialize_on = src.device;
      if (!cfg.tie_embeddings) lo.read_by_rows = {"model.embed_tokens.weight"};
      try {
        load_safetensors(*out.model, src.model, lo);
      } catch (const OutOfMemory& e) {
        throw OutOfMemory(
            fmt::format("{} (sizes from {})", e.what(), (d / "config.json").string()));
      }
      if (cfg.uses_rope())
        out.model->rope = std::make_unique<nn::Rope>(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta,
                                                     cfg.rope_style, src.dtype, src.device);
      out.model->eval();
      if (fs::exists(d / "generation_config.json"))
        out.generation = load_generation_config((d / "generation_config.json").string());
      tok_dir = d;
      out.description = fmt::format("{} from {}", cfg.name, src.model);
    } else if (fs::path(src.model).extension() == ".gguf") {
      // GGUF (llama.cpp): f32/f16/bf16 weights converted; Q8_0/Q4_K/Q6_K Linear weights kept
      // quantized (or dequantized into --dtype). The tokenizer: --tokenizer, else the file's
      // own (tokenizer.ggml.*), else Qwen's tokenizer files beside it.
      const auto gguf = std::make_shared<const io::GgufFile>(src.model);
      out.model = load_gguf_model(gguf, src.dtype, src.device, src.keep_quantized);
      if (src.tokenizer.empty()) out.tokenizer = io::gguf_tokenizer(*gguf);
      out.model->eval();
      fs::path gdir = fs::path(src.model).parent_path();
      if (gdir.empty()) gdir = ".";
      if (fs::exists(gdir / "generation_config.json"))
        out.generation = load_generation_config((gdir / "generation_config.json").string());
      tok_dir = gdir;
      out.description = fmt::format("{} from GGUF {}", out.model->cfg.name, src.model);
    } else {
      // llama2.c .bin: read in f32, then converted when another dtype is asked for.
      auto m = load_llama2c_model(src.model);
      if (src.dtype != DType::F32 || src.device != Device::cpu()) {
        auto conv = std::make_unique<DecoderModel>(m->cfg, 0, src.dtype, src.device);
        auto from = m->state_dict();
        for (auto& [name, p] : conv->named_parameters()) {
          Tensor d = p.detach();
          d.copy_(from.at(name).detach());
        }
        m = std::move(conv);
      }
      m->eval();
      out.model = std::move(m);
      // run.c stops at BOS (1), which separates stories; EOS (2) as well.
      out.generation.eos_token_ids = {1, 2};
      out.description = fmt::format("llama2.c checkpoint {}", src.model);
    }
  }
  if (!src.tokenizer.empty()) {
    out.tokenizer = io::make_tokenizer(src.tokenizer);
  } else if (!out.tokenizer && !tok_dir.empty() && has_tokenizer_files(tok_dir)) {
    out.tokenizer = io::QwenTokenizer::from_dir(tok_dir.string());
  }
  if (out.generation.eos_token_ids.empty() && out.tokenizer && out.tokenizer->eos_id() >= 0)
    out.generation.eos_token_ids.push_back(out.tokenizer->eos_id());
  for (auto id : out.generation.eos_token_ids)
    KILN_CHECK(id < out.model->cfg.vocab_size,
               "[generation_config] eos_token_id {} is not below the model's vocab_size {}", id,
               out.model->cfg.vocab_size);
  return out;
}

}  // namespace kiln::models
