// `kiln quantize`: a Hugging Face Qwen3/Qwen2 folder (or seeded random weights for a config) to
// a GGUF v3 file with Q8_0 weights (models/gguf_model.h: save_gguf_model), which `kiln generate
// --model file.gguf` runs with the int8 GEMV (ops::linear_quant). The tokenizer files are
// copied beside the output, where generate looks for them (GGUF tokenizer metadata is not
// written yet).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "apps/commands.h"
#include "apps/flags.h"
#include "models/generation_config.h"
#include "models/gguf_model.h"

namespace kiln::apps {
namespace {

namespace fs = std::filesystem;

struct QuantizeCmd {
  std::string model, config, type = "q8_0", out;
  bool random_weights = false, force = false;
  std::uint64_t weights_seed = 0;
};

int run_quantize(const QuantizeCmd& o) {
  KILN_CHECK(o.random_weights != !o.model.empty(),
             "[quantize] give --model DIR, or --random-weights --config config.json");
  KILN_CHECK(o.type == "q8_0",
             "[quantize] --type {}: kiln writes q8_0 only so far (q4_k_m's "
             "K-quant search is not implemented)",
             o.type);
  KILN_CHECK(o.out.ends_with(".gguf"), "[quantize] --out {} must name a .gguf file", o.out);
  KILN_CHECK(o.force || !fs::exists(o.out), "[quantize] {} exists; pass --force to replace it",
             o.out);
  models::ModelSource src;
  src.model = o.model;
  src.config = o.config;
  src.random_weights = o.random_weights;
  src.weights_seed = o.weights_seed;
  src.tokenizer = "byte";  // not needed to quantize; the files are copied below
  src.dtype = DType::F32;
  auto t0 = std::chrono::steady_clock::now();
  models::LoadedModel m = models::load_model(src);
  fmt::print(stderr, "[quantize] loaded {} ({} parameters) in {:.1f} s\n", m.description,
             m.model->num_parameters(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  t0 = std::chrono::steady_clock::now();
  models::save_gguf_model(*m.model, o.out, quant::QuantType::Q8_0);
  fmt::print(stderr, "[quantize] wrote {} ({:.1f} MB, q8_0) in {:.1f} s\n", o.out,
             static_cast<double>(fs::file_size(o.out)) / 1e6,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (!o.model.empty()) {
    fs::path dst = fs::path(o.out).parent_path();
    if (dst.empty()) dst = ".";
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                          "generation_config.json"}) {
      const fs::path from = fs::path(o.model) / f, to = dst / f;
      if (!fs::exists(from) || fs::equivalent(from.parent_path(), dst)) continue;
      if (fs::exists(to)) {
        fmt::print(stderr, "[quantize] kept the existing {} (not copied)\n", to.string());
        continue;
      }
      fs::copy_file(from, to);
      fmt::print(stderr, "[quantize] copied {} beside it\n", f);
    }
  }
  return 0;
}

}  // namespace

Run add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeCmd>();
  app.add_option("--model", o->model, "Hugging Face Qwen3/Qwen2 folder (safetensors)");
  app.add_option("--config", o->config, "config.json (HF names) for --random-weights");
  app.add_flag("--random-weights", o->random_weights,
               "Seeded random weights for --config instead of a folder");
  app.add_option("--weights-seed", o->weights_seed, "Seed of --random-weights")
      ->capture_default_str()
      ->check(uint64_flag());
  app.add_option("--type", o->type,
                 "q8_0: every 2-d weight with rows of whole 32-blocks, llama.cpp's bytes; norms "
                 "stay f32")
      ->capture_default_str();
  app.add_option("--out", o->out, "The .gguf file to write (atomically)")->required();
  app.add_flag("--force", o->force, "Replace --out if it exists");
  return [o] { return run_quantize(*o); };
}

}  // namespace kiln::apps
