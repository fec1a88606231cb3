// `kiln quantize`: a Hugging Face Qwen3/Qwen2 folder (or seeded random weights for a config) to
// a GGUF v3 file with Q8_0 or Q4_K_M weights (models/gguf_model.h: save_gguf_model), which `kiln
// generate
// --model file.gguf` runs with the int8 GEMV (ops::linear_quant). The folder's Qwen tokenizer goes
// into the file (tokenizer.ggml.*), and generation_config.json (which GGUF has no place for) is
// copied beside it, where generate looks for it.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "apps/commands.h"
#include "apps/flags.h"
#include "models/generation_config.h"
#include "models/gguf_model.h"
#include "models/io/qwen_tokenizer.h"
#include "models/io/safetensors.h"
#include "models/param_count.h"

namespace kiln::apps {
namespace {

namespace fs = std::filesystem;

struct QuantizeCmd {
  std::string model, config, type = "q8_0", out, tokenizer;
  bool random_weights = false, force = false;
  std::uint64_t weights_seed = 0;
};

// Whether every tensor of a Hugging Face folder's safetensors is stored in bf16.
bool all_bf16(const std::string& dir) {
  const io::SafetensorsIndex index = io::SafetensorsIndex::open_dir(dir);
  for (const std::string& name : index.names()) {
    const auto found = index.find(name);
    if (!found || found->entry->dtype != "BF16") return false;
  }
  return true;
}

int run_quantize(const QuantizeCmd& o) {
  KILN_CHECK(o.random_weights != !o.model.empty(),
             "[quantize] give --model DIR, or --random-weights --config config.json");
  const models::GgufScheme scheme = models::parse_gguf_scheme(o.type);
  KILN_CHECK(o.out.ends_with(".gguf"), "[quantize] --out {} must name a .gguf file", o.out);
  KILN_CHECK(o.force || !fs::exists(o.out), "[quantize] {} exists; pass --force to replace it",
             o.out);
  models::ModelSource src;
  src.model = o.model;
  src.config = o.config;
  src.random_weights = o.random_weights;
  src.weights_seed = o.weights_seed;
  if (o.random_weights) src.tokenizer = "byte";  // none to embed
  if (!o.tokenizer.empty()) src.tokenizer = o.tokenizer;
  // A folder whose weights are all bf16 loads in bf16, used in place from the file mapping: each
  // tensor is widened to f32 (exactly) only while it is quantized, so an 8B model needs its
  // quantized bytes in memory, not a 32 GB f32 copy (which was killed for memory on a 23 GB
  // machine). Anything else loads in f32, so nothing is rounded before quantizing.
  src.dtype =
      !o.model.empty() && fs::is_directory(o.model) && all_bf16(o.model) ? DType::BF16 : DType::F32;
  // Random weights are drawn in f32, unless an f32 copy of them would not fit in the memory
  // available (Qwen3-8B: 33 GB, which the kernel killed on a 23 GB machine): then in bf16, each
  // tensor widened only while it is quantized, as for a bf16 folder.
  if (o.random_weights && !o.config.empty()) {  // no --config: load_model says so
    const std::int64_t f32_bytes =
        models::count_params(models::read_model_config(o.config)).total * 4;
    const std::int64_t available = available_memory(Device::cpu());
    if (available > 0 && f32_bytes > available / 4 * 3) {
      src.dtype = DType::BF16;
      fmt::print(stderr,
                 "[quantize] random weights in f32 would take {:.1f} GB of the {:.1f} GB "
                 "available: drawing them in bf16\n",
                 static_cast<double>(f32_bytes) / 1e9, static_cast<double>(available) / 1e9);
    }
  }
  src.keep_quantized = false;  // a .gguf input is read back as f32 (requantized or f32 out)
  auto t0 = std::chrono::steady_clock::now();
  models::LoadedModel m = models::load_model(src);
  fmt::print(stderr, "[quantize] loaded {} ({} parameters) in {:.1f} s\n", m.description,
             m.model->num_parameters(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  t0 = std::chrono::steady_clock::now();
  // A Qwen (byte-level BPE) or llama2.c (SentencePiece) tokenizer goes into the file.
  const io::Tokenizer* tok = m.tokenizer.get();
  const bool embeds = dynamic_cast<const io::QwenTokenizer*>(tok) != nullptr ||
                      dynamic_cast<const io::Llama2cTokenizer*>(tok) != nullptr;
  if (!o.model.empty() && !embeds)
    fmt::print(stderr,
               "[quantize] {} has no Qwen or llama2.c tokenizer: the file gets no tokenizer\n",
               o.model);
  // A progress bar on a terminal (quantizing a large model to q4_k_m takes minutes).
  const bool bar = isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  models::save_gguf_model(
      *m.model, o.out, scheme, embeds ? tok : nullptr, [&](std::size_t done, std::size_t all) {
        if (!bar) return;
        const int width = 30,
                  filled = static_cast<int>(width * done / std::max<std::size_t>(all, 1));
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        fmt::print(stderr, "\r[{}{}] {}/{} tensors {:.0f}s ", std::string(filled, '#'),
                   std::string(width - filled, '.'), done, all, secs);
        if (done == all) fmt::print(stderr, "\r{}\r", std::string(60, ' '));
        std::fflush(stderr);
      });
  fmt::print(stderr, "[quantize] wrote {} ({:.1f} MB, {}) in {:.1f} s\n", o.out,
             static_cast<double>(fs::file_size(o.out)) / 1e6, o.type,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (!o.model.empty()) {
    fs::path dst = fs::path(o.out).parent_path();
    if (dst.empty()) dst = ".";
    for (const char* f : {"generation_config.json"}) {
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
  app.add_option("--model", o->model,
                 "Hugging Face Qwen3/Qwen2/LLaMA folder (safetensors), a llama2.c .bin model, "
                 "or a .gguf file (its weights dequantized to f32 first: --type f32 writes "
                 "kiln's dequantized values)");
  app.add_option("--tokenizer", o->tokenizer,
                 "Tokenizer to embed instead of the model's own: llama2c:PATH (a llama2.c "
                 "tokenizer.bin, written as SentencePiece 'llama'), byte, char. A folder's Qwen "
                 "tokenizer and a GGUF file's are embedded without it");
  app.add_option("--config", o->config, "config.json (HF names) for --random-weights");
  app.add_flag("--random-weights", o->random_weights,
               "Seeded random weights for --config instead of a folder (drawn in f32, or in "
               "bf16 when an f32 copy would not fit in the available memory)");
  app.add_option("--weights-seed", o->weights_seed, "Seed of --random-weights")
      ->capture_default_str()
      ->check(uint64_flag());
  app.add_option("--type", o->type,
                 "q8_0 (every 2-d weight with rows of whole 32-blocks, llama.cpp's bytes), "
                 "q4_k_m (llama.cpp's mix of Q4_K and Q6_K, kiln's own scale choice) or f32; "
                 "norms stay f32")
      ->capture_default_str();
  app.add_option("--out", o->out, "The .gguf file to write (atomically)")->required();
  app.add_flag("--force", o->force, "Replace --out if it exists");
  return [o] { return run_quantize(*o); };
}

}  // namespace kiln::apps
