// Writes a Hugging Face model folder with random weights for a config.json: sharded bf16 (or
// f32) safetensors with model.safetensors.index.json, and the config (and
// generation_config.json, when one sits beside it) copied in. For loading benchmarks of models
// whose real weights cannot be downloaded here (Qwen3-8B: 16.4 GB of bf16).
//
// Memory: one shard at a time (--shard-gb), so writing 16.4 GB needs about 4 GB of RAM.
// Values: uniform with the config's init std (norm weights 1), from a counter-based hash,
// so a folder is the same for the same --seed whatever the shard size.
//
// Usage: kiln_write_random_safetensors --config config.json --out DIR [--dtype bf16|f16|f32]
//        [--shard-gb 4] [--seed 0]
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/io/safetensors.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// A uniform value in [-1, 1) for element i of tensor t (splitmix64 of the pair).
float unit(std::uint64_t seed, std::uint64_t t, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + (t << 40) + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / 8388608.0 - 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write random safetensors shards for a config.json"};
  std::string config, out, dtype_name = "bf16";
  double shard_gb = 4.0;
  std::uint64_t seed = 0;
  app.add_option("--config", config, "HF config.json")->required();
  app.add_option("--out", out, "Folder to create (must not exist)")->required();
  app.add_option("--dtype", dtype_name, "bf16 | f16 | f32")->capture_default_str();
  app.add_option("--shard-gb", shard_gb, "Largest shard, GB")->capture_default_str();
  app.add_option("--seed", seed, "Seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const DType dtype = parse_dtype(dtype_name);
    KILN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32,
               "[write_random_safetensors] --dtype {} must be bf16, f16 or f32", dtype_name);
    KILN_CHECK(shard_gb > 0, "[write_random_safetensors] --shard-gb must be > 0");
    KILN_CHECK(!fs::exists(out), "[write_random_safetensors] {} exists: give a new folder", out);
    const models::ModelConfig cfg = models::load_hf_config(config);
    // The parameters' names and shapes, from a model on meta (no memory).
    models::DecoderModel meta(cfg, 0, dtype, Device::meta());
    std::vector<std::pair<std::string, Shape>> params;
    for (const auto& [name, p] : meta.named_parameters()) params.emplace_back(name, p.shape());

    fs::create_directories(out);
    fs::copy_file(config, fs::path(out) / "config.json");
    const fs::path gen = fs::path(config).parent_path() / "generation_config.json";
    if (fs::exists(gen)) fs::copy_file(gen, fs::path(out) / "generation_config.json");

    // Shards: consecutive parameters up to --shard-gb each.
    const auto limit = static_cast<std::int64_t>(shard_gb * 1e9);
    std::vector<std::vector<std::size_t>> shards(1);
    std::int64_t in_shard = 0, total = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::int64_t bytes = shape_numel(params[i].second) * std::int64_t(dtype_size(dtype));
      if (in_shard > 0 && in_shard + bytes > limit) shards.emplace_back(), in_shard = 0;
      shards.back().push_back(i);
      in_shard += bytes;
      total += bytes;
    }
    std::map<std::string, std::string> weight_map;
    const float scale = static_cast<float>(cfg.init_std * std::sqrt(3.0));
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const std::string file =
          fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      io::SafetensorsWriter w;
      std::vector<Tensor> keep;  // the writer does not copy
      for (std::size_t i : shards[s]) {
        const auto& [name, shape] = params[i];
        Tensor f = Tensor::empty(shape, DType::F32, Device::cpu());
        float* v = f.data<float>();
        const std::int64_t n = f.numel();
        const bool norm = shape.size() == 1;
#pragma omp parallel for schedule(static)
        for (std::int64_t k = 0; k < n; ++k) v[k] = norm ? 1.0f : scale * unit(seed, i, k);
        Tensor t = f.to(dtype);
        f = Tensor();
        keep.push_back(t);
        w.add(name, std::string(dtype_safetensors_name(dtype)), shape, t.raw_data(), t.nbytes());
        weight_map[name] = file;
      }
      w.write((fs::path(out) / file).string());
      std::fprintf(stderr, "wrote %s (%zu tensors, %.2f GB)\n", file.c_str(), shards[s].size(),
                   static_cast<double>(w.total_bytes()) / 1e9);
    }
    io::write_safetensors_index((fs::path(out) / "model.safetensors.index.json").string(),
                                {{"total_size", std::to_string(total)}}, weight_map);
    std::fprintf(stderr, "%s: %zu tensors, %.2f GB in %zu shards\n", out.c_str(), params.size(),
                 static_cast<double>(total) / 1e9, shards.size());
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
