// Accuracy of quantized weights on a model kiln trained: held-out loss and the KL divergence of
// next-token distributions against the bf16 model, reported the way llama.cpp's perplexity tool
// reports them (mean NLL, perplexity, mean KLD, same-top-token fraction).
//
//   kiln_bench_quant_accuracy --ckpt runs/q/final.h5 --data TEXT [--seq 256] [--seqs 16]
//
// The checkpoint's model is written as GGUF in f32, q8_0 and q4_k_m (models/gguf_model.h) and
// each file is read back in bf16 (the quantized ones with their Linear weights kept quantized,
// run by ops::linear_quant). The held-out text is the last 10% of the tokens of TEXT, as
// `kiln train` holds it out. Each sequence is fed in chunks of --chunk tokens through the KV
// cache, so the quantized Linears run the int8 GEMV that decode runs (8 rows or fewer), not
// the prefill path. Prints one line per kind and one JSON object (--json FILE writes it).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/node.h"
#include "models/checkpoint.h"
#include "models/data.h"
#include "models/gguf_model.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// log-softmax of one row of logits, in double.
std::vector<double> log_probs(const float* z, std::int64_t V) {
  double mx = z[0];
  for (std::int64_t i = 1; i < V; ++i) mx = std::max(mx, double(z[i]));
  double s = 0;
  for (std::int64_t i = 0; i < V; ++i) s += std::exp(double(z[i]) - mx);
  const double lse = mx + std::log(s);
  std::vector<double> out(V);
  for (std::int64_t i = 0; i < V; ++i) out[i] = double(z[i]) - lse;
  return out;
}

// Logits (seq, V) in f32 of one sequence, fed `chunk` tokens at a time through a KV cache.
std::vector<float> logits_of(models::DecoderModel& m, const std::vector<std::int32_t>& ids,
                             std::int64_t chunk) {
  NoGradGuard no_grad;
  const auto T = static_cast<std::int64_t>(ids.size());
  models::KVCache cache(m.cfg, 1, T, m.dtype(), Device::cpu());
  std::vector<float> out;
  for (std::int64_t p = 0; p < T; p += chunk) {
    const std::int64_t n = std::min(chunk, T - p);
    std::vector<std::int32_t> part(ids.begin() + p, ids.begin() + p + n);
    const Tensor x = ops::from_vector(part, {1, n});
    const Tensor z = m.logits(m.hidden(x, p, &cache)).to(DType::F32);
    const std::vector<float> v = z.to_float_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Held-out loss and KL divergence of q8_0 / q4_k_m against bf16, on a checkpoint");
  std::string ckpt, data, json_out, work;
  std::int64_t seq = 256, seqs = 16, chunk = 8;
  app.add_option("--ckpt", ckpt, "A kiln checkpoint (final.h5) of a Qwen3 or LLaMA model")
      ->required();
  app.add_option("--data", data, "The text it trained on (its last 10% are held out)")->required();
  app.add_option("--seq", seq, "Tokens per sequence")->capture_default_str();
  app.add_option("--seqs", seqs, "Sequences (consecutive, from the held-out start)")
      ->capture_default_str();
  app.add_option("--chunk", chunk, "Tokens per forward (<= 8: the int8 GEMV)")
      ->capture_default_str();
  app.add_option("--json", json_out, "Also write the JSON result here");
  app.add_option("--work", work, "Folder for the GGUF files (default: a temporary one)");
  CLI11_PARSE(app, argc, argv);
  try {
    const models::CheckpointMeta meta = models::read_checkpoint_meta(ckpt);
    auto tok = models::run_tokenizer(meta.state.tokenizer_spec, meta.state.tokenizer_data, "");
    models::DecoderModel model(meta.config, 0, DType::F32, Device::cpu());
    models::load_checkpoint(ckpt, model, nullptr);
    model.eval();
    const std::vector<std::int32_t> val =
        models::split_tokens(tok->encode(models::read_text_file(data))).val;
    KILN_CHECK(static_cast<std::int64_t>(val.size()) >= seqs * seq + 1,
               "[quant_accuracy] {} held-out tokens, fewer than {} sequences of {}", val.size(),
               seqs, seq);
    const fs::path dir =
        work.empty() ? fs::temp_directory_path() / fmt::format("kiln_quant_acc_{}", ::getpid())
                     : fs::path(work);
    fs::create_directories(dir);
    const std::int64_t V = model.cfg.vocab_size;
    struct Kind {
      std::string name;
      models::GgufScheme scheme;
      double nll = 0, kld = 0, same_top = 0, file_mb = 0;
    };
    std::vector<Kind> kinds = {{"bf16", models::GgufScheme::F32},
                               {"q8_0", models::GgufScheme::Q8_0},
                               {"q4_k_m", models::GgufScheme::Q4_K_M}};
    // Every kind's model at once (a small model), so the bf16 reference of a sequence is at hand
    // when the others are compared with it.
    std::vector<std::unique_ptr<models::DecoderModel>> ms;
    for (Kind& k : kinds) {
      const std::string path = (dir / (k.name + ".gguf")).string();
      models::save_gguf_model(model, path, k.scheme);
      k.file_mb = static_cast<double>(fs::file_size(path)) / 1e6;
      ms.push_back(models::load_gguf_model(path, DType::BF16, Device::cpu()));
      ms.back()->eval();
      fs::remove(path);
    }
    std::int64_t positions = 0;
    for (std::int64_t s = 0; s < seqs; ++s) {
      std::vector<std::int32_t> ids(val.begin() + s * seq, val.begin() + s * seq + seq + 1);
      const std::int32_t last = ids.back();
      ids.pop_back();
      std::vector<std::vector<float>> z;
      for (auto& m : ms) z.push_back(logits_of(*m, ids, chunk));
      for (std::int64_t t = 0; t < seq; ++t, ++positions) {
        const std::int32_t target = t + 1 < seq ? ids[t + 1] : last;
        const std::vector<double> ref = log_probs(z[0].data() + t * V, V);
        const auto ref_top = std::max_element(ref.begin(), ref.end()) - ref.begin();
        kinds[0].nll -= ref[target];
        for (std::size_t k = 1; k < kinds.size(); ++k) {
          const std::vector<double> lp = log_probs(z[k].data() + t * V, V);
          kinds[k].nll -= lp[target];
          double kl = 0;
          for (std::int64_t i = 0; i < V; ++i) kl += std::exp(ref[i]) * (ref[i] - lp[i]);
          kinds[k].kld += kl;
          kinds[k].same_top += (std::max_element(lp.begin(), lp.end()) - lp.begin()) == ref_top;
        }
      }
    }
    for (Kind& k : kinds) {
      k.nll /= static_cast<double>(positions);
      k.kld /= static_cast<double>(positions);
      k.same_top /= static_cast<double>(positions);
    }
    if (work.empty()) fs::remove_all(dir);
    nlohmann::json out = {{"benchmark", "cpu_quant_accuracy"},
                          {"ckpt", ckpt},
                          {"model", meta.config.name},
                          {"params", model.num_parameters()},
                          {"positions", positions},
                          {"seq", seq},
                          {"chunk", chunk}};
    for (const Kind& k : kinds) {
      const double rel = k.nll / kinds[0].nll - 1.0;
      fmt::print(
          "{:<7} file {:7.1f} MB  NLL {:.5f}  PPL {:8.4f}  NLL vs bf16 {:+.3f}%  mean KLD "
          "{:.6f}  same top token {:.2f}%\n",
          k.name, k.file_mb, k.nll, std::exp(k.nll), 100.0 * rel, k.kld,
          100.0 * (k.name == "bf16" ? 1.0 : k.same_top));
      out["kinds"][k.name] = {{"file_mb", k.file_mb},   {"mean_nll", k.nll},
                              {"ppl", std::exp(k.nll)}, {"nll_rel_to_bf16", rel},
                              {"mean_kld", k.kld},      {"same_top", k.same_top}};
    }
    fmt::print("{}\n", out.dump());
    if (!json_out.empty()) std::ofstream(json_out) << out.dump(1) << "\n";
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
