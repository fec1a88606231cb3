// What the golden model tests share (test_golden.cpp: LLaMA and Qwen3 blocks against
// tests/golden/reference_llama.py; test_gpt2.cpp: GPT-2 against reference_gpt2.py). The
// exchange with a reference script (contract in tests/golden/README.md):
//   <dir>/in/config.json, train.json, weights.safetensors, batch.safetensors  (written here)
//   <dir>/out/outputs.safetensors                                            (the script's)
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "models/weights.h"
#include "nn/optim.h"
#include "tests/test_python.h"

namespace kiln::test {

// A (B, T) batch of ids in [0, V) from a seeded LCG; targets are the next ids, -100 (ignored)
// at the flat positions in `ignored`.
inline std::pair<Tensor, Tensor> golden_batch(std::int64_t V, std::int64_t B, std::int64_t T,
                                              std::uint32_t seed,
                                              const std::vector<std::int64_t>& ignored) {
  std::vector<std::int32_t> ids(B * (T + 1)), x(B * T), y(B * T);
  std::uint32_t s = seed;
  for (auto& v : ids) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(V));
  }
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      x[b * T + t] = ids[b * (T + 1) + t];
      y[b * T + t] = ids[b * (T + 1) + t + 1];
    }
  for (std::int64_t i : ignored) y[i] = -100;
  return {ops::from_vector(x, {B, T}), ops::from_vector(y, {B, T})};
}

// Seeded weights at a scale where every path matters (the default 0.02 init makes attention
// nearly uniform and logits nearly flat): matrices N(0, 1/sqrt(fan_in)), embedding tables
// (token, and GPT-2's positions) N(0, 0.5), norm weights 1 + N(0, 0.1), biases N(0, 0.1).
inline void golden_init_weights(models::DecoderModel& m, std::uint64_t seed) {
  Generator gen(seed);
  for (auto& [name, p] : m.named_parameters()) {
    Tensor v;
    const bool bias = name.ends_with(".bias");
    if (p.dim() == 1)
      v = ops::randn(p.shape(), gen, bias ? 0.0 : 1.0, 0.1);
    else if (name.find("embed_") != std::string::npos)
      v = ops::randn(p.shape(), gen, 0.0, 0.5);
    else
      v = ops::randn(p.shape(), gen, 0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))));
    Tensor d = p.detach();
    d.copy_(v);
  }
}

// max |a - b|
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}
inline double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::fabs(v));
  return m;
}

// Writes <in_dir>/{config,train}.json, the model's weights and the batch.
inline void write_golden_inputs(const std::filesystem::path& in_dir, const nlohmann::json& cfg,
                                const models::DecoderModel& m, const Tensor& ids,
                                const Tensor& targets, const nn::AdamWOptions& adamw, int steps) {
  std::ofstream(in_dir / "config.json") << cfg.dump(2);
  nlohmann::json tr = {{"lr", adamw.lr},
                       {"beta1", adamw.beta1},
                       {"beta2", adamw.beta2},
                       {"eps", adamw.eps},
                       {"weight_decay", adamw.weight_decay},
                       {"steps", steps}};
  std::ofstream(in_dir / "train.json") << tr.dump(2);
  models::save_safetensors(m, (in_dir / "weights.safetensors").string());
  io::SafetensorsWriter w;
  w.add("input_ids", "I32", ids.shape(), ids.raw_data(), ids.nbytes());
  w.add("targets", "I32", targets.shape(), targets.raw_data(), targets.nbytes());
  w.write((in_dir / "batch.safetensors").string());
}

// Runs tests/golden/<script> on <dir>/in -> <dir>/out and returns its outputs as f64 vectors;
// empty after a failure (reported with ADD_FAILURE: the golden tests never skip).
inline std::map<std::string, std::vector<double>> run_golden_reference(
    const std::string& script, const std::filesystem::path& dir) {
  if (std::system((test_python() + " -c 'import torch, numpy' > /dev/null 2>&1").c_str()) != 0) {
    ADD_FAILURE() << test_python() << " cannot import torch and numpy: the golden tests need "
                  << "Debian's python3-torch (run scripts/setup.sh). They are not skipped on "
                     "purpose.";
    return {};
  }
  const std::string path = std::string(KILN_SOURCE_DIR) + "/tests/golden/" + script;
  const std::string log = (dir / "reference.log").string();
  const std::string cmd = test_python() + " '" + path + "' '" + (dir / "in").string() + "' '" +
                          (dir / "out").string() + "' > '" + log + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream f(log);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ADD_FAILURE() << script << " failed:\n" << text;
    return {};
  }
  io::SafetensorsFile f((dir / "out" / "outputs.safetensors").string());
  std::map<std::string, std::vector<double>> out;
  for (const auto& e : f.entries())
    out[e.name] =
        models::tensor_from_bytes(e.dtype, e.shape, f.data(e), e.nbytes()).to_double_vector();
  return out;
}

}  // namespace kiln::test
