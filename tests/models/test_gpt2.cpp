// GPT-2 in kiln (models/config.h gpt2_config, preset gpt2-124m):
//  - parameter counts: the preset's 124,475,904 (vocab padded to 50304) and 124,439,808
//    unpadded, computed here term by term, from the formula and from the meta-device model,
//    and from a Hugging Face GPT-2 config.json; `kiln params --model gpt2-124m`;
//  - the config: JSON round trip of pos_embedding, GPT-2 config.json fields, bad values;
//  - golden: a tiny GPT-2 against tests/golden/reference_gpt2.py (PyTorch on the HF GPT-2
//    layout, converted from kiln's weights): logits, loss, every gradient, 10 AdamW steps;
//  - the learned positions follow pos_offset: prefill + KV-cache decode equals one forward;
//  - a reduced-size gpt2 (vocab 50304 padded, dim 64) trains on the CPU;
//  - the memory budget: analytic == dry run (static rows exactly) and dry run == CPU measured,
//    and the full gpt2-124m training step on the meta device.
// The golden test never skips: without torch it FAILS.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "budget/budget.h"
#include "models/param_count.h"
#include "models/weights.h"
#include "nn/optim.h"
#include "tests/models/budget_rows.h"
#include "tests/models/expect_param_total.h"
#include "tests/models/golden_harness.h"
#include "tests/run_kiln.h"

namespace fs = std::filesystem;
using namespace kiln;
using kiln::models::DecoderModel;
using kiln::models::ModelConfig;

namespace {

// llm.c's count, term by term (the brief's formula), for a vocab of V rows.
std::int64_t llmc_gpt2_124m_params(std::int64_t V) {
  const std::int64_t C = 768, L = 12, ctx = 1024;
  const std::int64_t per_layer = 2 * C                // ln_1
                                 + C * 3 * C + 3 * C  // c_attn (q, k, v)
                                 + C * C + C          // attn c_proj
                                 + 2 * C              // ln_2
                                 + C * 4 * C + 4 * C  // c_fc
                                 + 4 * C * C + C;     // mlp c_proj
  return V * C + ctx * C + L * per_layer + 2 * C;     // wte, wpe, blocks, ln_f
}

using kiln::test::expect_total;

// HF's openai-community/gpt2 config.json (the fields kiln reads, and a few it ignores).
nlohmann::json hf_gpt2_config() {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"activation_function", "gelu_new"},
          {"vocab_size", 50257},
          {"n_ctx", 1024},
          {"n_positions", 1024},
          {"n_embd", 768},
          {"n_layer", 12},
          {"n_head", 12},
          {"n_inner", nullptr},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.1}};
}

// The golden config: dim 64, 2 layers, 4 heads (head_dim 16), context 32, vocab 96.
ModelConfig tiny_gpt2() { return models::gpt2_config("golden-gpt2", 96, 64, 2, 4, 32); }

}  // namespace

TEST(Gpt2, PresetParamCount) {
  const ModelConfig c = models::preset("gpt2-124m");
  EXPECT_EQ(c.vocab_size, 50304);
  EXPECT_EQ(c.dim, 768);
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_EQ(c.n_heads, 12);
  EXPECT_EQ(c.n_kv_heads, 12);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.hidden_dim, 3072);
  EXPECT_EQ(c.max_seq_len, 1024);
  EXPECT_EQ(c.norm_kind, models::NormKind::LayerNorm);
  EXPECT_EQ(c.mlp_kind, models::MlpKind::Plain);
  EXPECT_EQ(c.hidden_act, models::MlpActivation::GeluTanh);
  EXPECT_TRUE(c.bias && c.final_norm && c.tie_embeddings);
  EXPECT_FALSE(c.uses_rope());
  EXPECT_FALSE(c.qk_norm);

  EXPECT_EQ(llmc_gpt2_124m_params(50304), 124'475'904);
  EXPECT_EQ(llmc_gpt2_124m_params(50257), 124'439'808);
  expect_total(c, 124'475'904);
  ModelConfig unpadded = c;
  unpadded.vocab_size = 50257;
  expect_total(unpadded, 124'439'808);

  models::ParamCount f = models::count_params(c);
  // Non-embedding (Kaplan et al.): without wte and wpe.
  EXPECT_EQ(f.embedding, 50304 * 768 + 1024 * 768);
  EXPECT_EQ(f.non_embedding(), 85'056'000);  // 12 blocks (85,054,464) + ln_f (1,536)
  bool wpe_row = false;
  for (const auto& r : f.rows) {
    if (r.key == "model.embed_positions.weight") wpe_row = r.total() == 1024 * 768;
    EXPECT_EQ(r.key.find("rope"), std::string::npos);
  }
  EXPECT_TRUE(wpe_row);
}

TEST(Gpt2, HfConfigJson) {
  ModelConfig c = models::from_hf_config(hf_gpt2_config());
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.hidden_dim, 3072);  // n_inner null: 4 * n_embd
  EXPECT_EQ(c.max_seq_len, 1024);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.pos_embedding, models::PosEmbedding::Learned);
  EXPECT_TRUE(c.tie_embeddings);
  expect_total(c, 124'439'808);  // what HF reports for GPT2LMHeadModel

  auto bad = hf_gpt2_config();
  bad["activation_function"] = "relu";
  EXPECT_THROW(models::from_hf_config(bad), Error);
  bad = hf_gpt2_config();
  bad["n_head"] = 7;  // 768 % 7 != 0
  EXPECT_THROW(models::from_hf_config(bad), Error);
  bad = hf_gpt2_config();
  bad.erase("n_embd");
  try {
    models::from_hf_config(bad);
    ADD_FAILURE() << "no error for a missing n_embd";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_embd"), std::string::npos) << e.what();
  }
}

TEST(Gpt2, ConfigJsonRoundTrip) {
  ModelConfig c = models::preset("gpt2-124m");
  nlohmann::json j = c.to_json();
  EXPECT_EQ(j["pos_embedding"], "learned");
  ModelConfig back = ModelConfig::from_json(j);
  EXPECT_EQ(back.pos_embedding, models::PosEmbedding::Learned);
  EXPECT_EQ(back.to_json(), j);
  // Older configs (checkpoints written before the field) mean RoPE.
  j.erase("pos_embedding");
  EXPECT_TRUE(ModelConfig::from_json(j).uses_rope());
  j["pos_embedding"] = "sinusoidal";
  EXPECT_THROW(ModelConfig::from_json(j), Error);
  // The layer variants are enums, by name; configs written before them held booleans
  // ("layernorm", "gelu_mlp"), which still read as the same model.
  j = c.to_json();
  EXPECT_EQ(j["norm_kind"], "layernorm");
  EXPECT_EQ(j["mlp_kind"], "plain");
  EXPECT_EQ(j["hidden_act"], "gelu_pytorch_tanh");
  for (const char* k : {"norm_kind", "mlp_kind", "hidden_act"}) j.erase(k);
  j["layernorm"] = true;
  j["gelu_mlp"] = true;
  EXPECT_EQ(ModelConfig::from_json(j).to_json(), c.to_json());
  j["layernorm"] = false;
  j["gelu_mlp"] = false;
  back = ModelConfig::from_json(j);
  EXPECT_EQ(back.norm_kind, models::NormKind::RmsNorm);
  EXPECT_EQ(back.mlp_kind, models::MlpKind::Gated);
  EXPECT_EQ(back.hidden_act, models::MlpActivation::Silu);
  j = c.to_json();
  j["norm_kind"] = "batchnorm";
  EXPECT_THROW(ModelConfig::from_json(j), Error);
  // Without RoPE an odd head_dim is fine; with it, it is not.
  ModelConfig odd = models::gpt2_config("odd", 32, 60, 1, 4, 8);  // head_dim 15
  EXPECT_NO_THROW(odd.validate());
  odd.pos_embedding = models::PosEmbedding::Rope;
  EXPECT_THROW(odd.validate(), Error);
}

TEST(Gpt2, ModelStructureOnMeta) {
  DecoderModel m(models::preset("gpt2-124m"), 0, DType::F32, Device::meta());
  EXPECT_EQ(m.rope, nullptr);
  EXPECT_EQ(m.lm_head, nullptr);
  EXPECT_EQ(m.num_parameters(), 124'475'904);
  std::map<std::string, Shape> shapes;
  for (const auto& [name, p] : m.named_parameters()) shapes[name] = p.shape();
  EXPECT_EQ(shapes.at("model.embed_tokens.weight"), (Shape{50304, 768}));
  EXPECT_EQ(shapes.at("model.embed_positions.weight"), (Shape{1024, 768}));
  const std::string p = "model.layers.11.";
  for (const char* n : {"input_layernorm", "post_attention_layernorm"}) {
    EXPECT_EQ(shapes.at(p + n + ".weight"), (Shape{768}));
    EXPECT_EQ(shapes.at(p + n + ".bias"), (Shape{768}));
  }
  for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    EXPECT_EQ(shapes.at(p + "self_attn." + n + ".weight"), (Shape{768, 768}));
    EXPECT_EQ(shapes.at(p + "self_attn." + n + ".bias"), (Shape{768}));
  }
  EXPECT_EQ(shapes.at(p + "mlp.fc.weight"), (Shape{3072, 768}));
  EXPECT_EQ(shapes.at(p + "mlp.fc.bias"), (Shape{3072}));
  EXPECT_EQ(shapes.at(p + "mlp.proj.weight"), (Shape{768, 3072}));
  EXPECT_EQ(shapes.at(p + "mlp.proj.bias"), (Shape{768}));
  EXPECT_EQ(shapes.at("model.norm.bias"), (Shape{768}));
  EXPECT_EQ(shapes.size(), 2u + 12u * 16u + 2u);
}

TEST(Gpt2, KilnParamsCommand) {
  if (!have_kiln()) GTEST_SKIP() << "kiln binary not built at " << KILN_BINARY_DIR << "/apps/kiln";
  KilnRun r = run_kiln("params --model gpt2-124m");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("124,475,904"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("identical"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("position embedding"), std::string::npos) << r.output;
}

// ---- golden ----------------------------------------------------------------------------

namespace {

constexpr std::int64_t kB = 2, kT = 16;  // T < max_seq_len 32: wpe rows past T get no gradient
constexpr int kSteps = 10;
const nn::AdamWOptions kAdamW{/*lr=*/3e-3, /*beta1=*/0.9, /*beta2=*/0.95, /*eps=*/1e-8,
                              /*weight_decay=*/0.1};

// ids in [0, V), targets = next id, a few -100 (ignored).
std::pair<Tensor, Tensor> make_batch(std::int64_t V, std::uint32_t seed) {
  return test::golden_batch(V, kB, kT, seed, {5, kT + 2});
}

bool is_key_bias(const std::string& name) { return name.ends_with("self_attn.k_proj.bias"); }

using test::max_abs;
using test::max_abs_diff;

class Gpt2Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_golden_gpt2_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in");
  }
  void TearDown() override {
    if (!HasFailure() && !std::getenv("KILN_GOLDEN_KEEP")) fs::remove_all(dir_);
  }

  void write_inputs(const DecoderModel& m, const Tensor& ids, const Tensor& targets) {
    const ModelConfig& c = m.cfg;
    nlohmann::json cfg = {{"vocab_size", c.vocab_size}, {"dim", c.dim},
                          {"n_layers", c.n_layers},     {"n_heads", c.n_heads},
                          {"hidden_dim", c.hidden_dim}, {"max_seq_len", c.max_seq_len},
                          {"norm_eps", c.norm_eps}};
    test::write_golden_inputs(dir_ / "in", cfg, m, ids, targets, kAdamW, kSteps);
  }

  std::map<std::string, std::vector<double>> run_reference() {
    return test::run_golden_reference("reference_gpt2.py", dir_);
  }

  fs::path dir_;
};

}  // namespace

TEST_F(Gpt2Golden, TinyGpt2MatchesPyTorchOnTheHfLayout) {
  const ModelConfig cfg = tiny_gpt2();
  const std::uint64_t seed = 7;
  auto [ids, targets] = make_batch(cfg.vocab_size, 11);
  DecoderModel m(cfg, seed);
  test::golden_init_weights(m, seed + 100);
  write_inputs(m, ids, targets);
  auto ref = run_reference();
  if (ref.empty()) return;
  std::map<std::string, double> worst;

  {
    NoGradGuard ng;
    auto logits = m.forward(ids).to_double_vector();
    ASSERT_EQ(logits.size(), ref.at("logits").size());
    worst["logits"] = max_abs_diff(logits, ref.at("logits"));
    EXPECT_LE(worst["logits"], 1e-4) << "max |logit| " << max_abs(ref.at("logits"));
    EXPECT_GT(max_abs(ref.at("logits")), 0.5);  // not a degenerate model
  }

  Tensor loss = m.loss(ids, targets);
  const double l = loss.item();
  worst["loss"] = std::fabs(l - ref.at("loss").at(0));
  EXPECT_LE(worst["loss"], 1e-5) << "loss " << l << " vs " << ref.at("loss").at(0);
  backward(loss);
  std::size_t n = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    auto it = ref.find("grad." + name);
    ASSERT_NE(it, ref.end()) << "reference has no grad." << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    auto g = p.grad().to_double_vector();
    ASSERT_EQ(g.size(), it->second.size()) << name;
    if (is_key_bias(name)) {
      // q·(k + b) = q·k + q·b shifts every score of a query by the same amount, which the
      // softmax ignores: the gradient is exactly 0, so both sides hold rounding noise only.
      const double w = max_abs(
          ref.at("grad." + name.substr(0, name.size() - std::string("bias").size()) + "weight"));
      EXPECT_LE(max_abs(g), 1e-5 * w) << name;
      EXPECT_LE(max_abs(it->second), 1e-5 * w) << name;
      ++n;
      continue;
    }
    const double scale = max_abs(it->second);
    EXPECT_GT(scale, 0.0) << name;
    const double rel = max_abs_diff(g, it->second) / scale;
    worst["grad (rel)"] = std::max(worst["grad (rel)"], rel);
    EXPECT_LE(rel, 1e-4) << "grad." << name << " (max |grad| " << scale << ")";
    ++n;
  }
  EXPECT_EQ(n, 2u + 2u * 16u + 2u);
  // wpe rows at positions >= T get exactly zero gradient.
  {
    auto g = m.model->embed_positions->weight.grad().to_double_vector();
    for (std::size_t i = kT * cfg.dim; i < g.size(); ++i) ASSERT_EQ(g[i], 0.0) << i;
  }

  DecoderModel t(cfg, seed);
  test::golden_init_weights(t, seed + 100);
  nn::AdamW opt(t.named_parameters(), kAdamW);
  const auto& ref_losses = ref.at("adamw_losses");
  ASSERT_EQ(ref_losses.size(), static_cast<std::size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    Tensor ls = t.loss(ids, targets);
    const double v = ls.item();
    worst["adamw loss"] = std::max(worst["adamw loss"], std::fabs(v - ref_losses[s]));
    EXPECT_LE(std::fabs(v - ref_losses[s]), 1e-5)
        << "AdamW step " << s << ": kiln " << v << ", torch " << ref_losses[s];
    backward(ls);
    opt.step();
  }
  EXPECT_LT(ref_losses.back(), ref_losses.front() - 0.5);  // training did something
  for (const auto& [name, p] : t.named_parameters()) {
    // AdamW normalizes the k bias's zero-plus-noise gradient into O(lr) steps of noise, which
    // differ between the two; the bias cannot change any output, so it is left out.
    if (is_key_bias(name)) continue;
    const auto& f = ref.at("final." + name);
    const double rel = max_abs_diff(p.to_double_vector(), f) / max_abs(f);
    worst["final weights (rel)"] = std::max(worst["final weights (rel)"], rel);
    EXPECT_LE(rel, 1e-4) << "final." << name;
  }
  std::string line = fmt::format("gpt2 golden: loss {:.6f} -> {:.6f}; worst", ref_losses.front(),
                                 ref_losses.back());
  for (const auto& [k, v] : worst) line += fmt::format(" {} {:.2e}", k, v);
  std::printf("%s\n", line.c_str());
}

// The learned positions follow pos_offset: a prefill of 5 tokens and 7 one-token decode steps
// through the KV cache give the logits of one forward over all 12 tokens.
TEST(Gpt2, KvCacheDecodeUsesPositionOffsets) {
  const ModelConfig cfg = tiny_gpt2();
  DecoderModel m(cfg, 3);
  test::golden_init_weights(m, 33);
  std::vector<std::int32_t> toks = {5, 17, 2, 90, 41, 41, 7, 63, 0, 95, 12, 30};
  const auto T = static_cast<std::int64_t>(toks.size());
  const std::int64_t V = cfg.vocab_size;
  NoGradGuard ng;
  auto full = m.forward(ops::from_vector(toks, {1, T})).to_double_vector();
  models::KVCache cache(cfg, 1, T, DType::F32, Device::cpu());
  const std::int64_t P = 5;
  std::vector<std::int32_t> prompt(toks.begin(), toks.begin() + P);
  auto got = m.forward(ops::from_vector(prompt, {1, P}), 0, &cache).to_double_vector();
  for (std::int64_t pos = P; pos < T; ++pos) {
    auto step =
        m.forward(ops::from_vector(std::vector<std::int32_t>{toks[pos]}, {1, 1}), pos, &cache)
            .to_double_vector();
    got.insert(got.end(), step.begin(), step.end());
  }
  ASSERT_EQ(got.size(), static_cast<std::size_t>(T * V));
  EXPECT_LE(max_abs_diff(got, full), 1e-5);
  // And the positions matter: the same token at positions 4 and 5 gives different logits.
  std::vector<double> a(full.begin() + 4 * V, full.begin() + 5 * V);
  std::vector<double> b(full.begin() + 5 * V, full.begin() + 6 * V);
  EXPECT_GT(max_abs_diff(a, b), 1e-3);
  // Past the context: a clear error.
  EXPECT_THROW(m.forward(ops::from_vector(std::vector<std::int32_t>(33, 1), {1, 33})), Error);
}

// gpt2-124m's vocab (50304, padded) and block at dim 64, 2 layers: constructing it and AdamW
// steps on a tiny batch work on the CPU; targets are real ids (< 50257).
TEST(Gpt2, ReducedPresetTrainsOnCpu) {
  ModelConfig cfg = models::preset("gpt2-124m");
  cfg = models::gpt2_config("gpt2-124m-reduced", cfg.vocab_size, 64, 2, 4, 64);
  DecoderModel m(cfg, 1);
  EXPECT_EQ(m.num_parameters(), models::count_params(cfg).total);
  std::vector<std::int32_t> x(2 * 16), y(2 * 16);
  std::uint32_t s = 9;
  for (std::size_t i = 0; i < x.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = static_cast<std::int32_t>((s >> 8) % 50257u);
    y[i] = static_cast<std::int32_t>((s >> 4) % 50257u);
  }
  Tensor ids = ops::from_vector(x, {2, 16}), targets = ops::from_vector(y, {2, 16});
  {
    NoGradGuard ng;
    Tensor logits = m.forward(ids);
    EXPECT_EQ(logits.shape(), (Shape{2, 16, 50304}));  // the padded columns are there
  }
  nn::AdamW opt(m.named_parameters(), {1e-3, 0.9, 0.95, 1e-8, 0.1});
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    Tensor loss = m.loss(ids, targets);
    losses.push_back(loss.item());
    backward(loss);
    nn::clip_grad_norm(m.parameters(), 1.0);
    opt.step();
  }
  // Small init: the first loss is close to ln(50304) = 10.83.
  EXPECT_NEAR(losses.front(), std::log(50304.0), 0.1);
  EXPECT_LT(losses.back(), losses.front());
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
}

// ---- memory budget -----------------------------------------------------------------------

namespace {

using kiln::test::idx;

// Against the dry run of a backend that computes the dtype natively (test_budget.cpp).
void expect_analytic(models::BudgetSpec s) {
  using models::BudgetRow;
  if (!models::simulates_native_dtype(s) || models::gemm_scratch_unmodelled(s))
    s.simulate = DeviceType::CUDA;
  models::BudgetFigures a = models::analytic_budget(s), d = models::run_budget(s, Device::meta());
  std::string what = fmt::format("{} {} {} b{} s{}{}", s.cfg.name, models::budget_mode_name(s.mode),
                                 dtype_name(s.dtype), s.batch, s.seq, s.recompute ? " rc" : "");
  for (BudgetRow r :
       {BudgetRow::Weights, BudgetRow::MasterWeights, BudgetRow::Gradients,
        BudgetRow::OptimizerState, BudgetRow::KVCache, BudgetRow::Inputs, BudgetRow::Runtime})
    EXPECT_EQ(a.at_peak[idx(r)], d.at_peak[idx(r)]) << what << ": " << models::budget_row_name(r);
  const double act_d = static_cast<double>(d.at_peak[idx(BudgetRow::Activations)]);
  const double act_a = static_cast<double>(a.at_peak[idx(BudgetRow::Activations)]);
  EXPECT_LE(std::abs(act_a - act_d), 0.05 * act_d)
      << what << ": activations " << act_a << " vs " << act_d;
  EXPECT_LE(std::abs(static_cast<double>(a.total_peak - d.total_peak)),
            0.05 * static_cast<double>(d.total_peak))
      << what << ": total " << a.total_peak << " vs " << d.total_peak;
}

}  // namespace

TEST(Gpt2, BudgetAnalyticMatchesDryRun) {
  models::BudgetSpec s;
  s.cfg = models::gpt2_config("tiny-gpt2", 512, 64, 2, 4, 128);
  for (DType dt : {DType::F32, DType::BF16}) {
    s.dtype = dt;
    s.mode = models::BudgetMode::Train, s.batch = 2, s.seq = 64;
    for (bool rc : {false, true}) {
      s.recompute = rc;
      expect_analytic(s);
    }
    s.recompute = false;
    s.mode = models::BudgetMode::Infer, s.seq = 48;
    expect_analytic(s);
  }
  s.simulate = DeviceType::CUDA;
  expect_analytic(s);
  s.mode = models::BudgetMode::Train;
  expect_analytic(s);
  // No RoPE tables: the Runtime row is empty.
  EXPECT_EQ(models::analytic_budget(s).at_peak[idx(models::BudgetRow::Runtime)], 0);
}

TEST(Gpt2, BudgetDryRunEqualsMeasured) {
  models::BudgetSpec s;
  s.cfg = models::gpt2_config("tiny-gpt2", 512, 64, 2, 4, 128);
  auto expect_same = [&](const std::string& what) {
    models::BudgetFigures dry = models::run_budget(s, Device::meta());
    models::BudgetFigures meas = models::run_budget(s, Device::cpu());
    test::expect_dry_equals_measured(dry, meas, what);
  };
  s.mode = models::BudgetMode::Train, s.batch = 2, s.seq = 32;
  expect_same("train");
  s.recompute = true;
  expect_same("train recompute");
  s.mode = models::BudgetMode::Infer, s.recompute = false, s.seq = 20, s.decode_steps = 6;
  expect_same("prefill 20 + 6 decode");
}

// The full preset: one bf16 training step at batch 4 x 1024 on the meta device (the whole
// forward, backward and AdamW step with real shapes, no memory touched), against the analytic
// model. Weights + gradients (bf16) + f32 masters + AdamW m, v: 16 bytes per parameter.
TEST(Gpt2, FullPresetBudgetOnMeta) {
  models::BudgetSpec s;
  s.cfg = models::preset("gpt2-124m");
  s.dtype = DType::BF16;
  s.simulate = DeviceType::CUDA;
  s.mode = models::BudgetMode::Train, s.batch = 4, s.seq = 1024;
  models::BudgetFigures d = models::run_budget(s, Device::meta());
  using models::BudgetRow;
  const double state = static_cast<double>(
      d.at_peak[idx(BudgetRow::Weights)] + d.at_peak[idx(BudgetRow::MasterWeights)] +
      d.at_peak[idx(BudgetRow::Gradients)] + d.at_peak[idx(BudgetRow::OptimizerState)]);
  EXPECT_NEAR(state / 124'475'904.0, 16.0, 0.01);  // + 512-byte rounding per tensor
  EXPECT_EQ(d.at_peak[idx(BudgetRow::Runtime)], 0);
  // The step really ran: the bf16 logits (B·T, 50304), or their gradient, are alive at the peak.
  EXPECT_GE(d.at_peak[idx(BudgetRow::Logits)], std::int64_t{4} * 1024 * 50304 * 2);
  EXPECT_EQ(d.peak_phase, Phase::Backward);
  fmt::print(
      "gpt2-124m bf16 train b4 x 1024 (dry run): peak {:.3f} GiB ({}), activations {:.3f} GiB\n",
      static_cast<double>(d.total_peak) / (1 << 30), d.peak_label,
      static_cast<double>(d.at_peak[idx(BudgetRow::Activations)]) / (1 << 30));
  expect_analytic(s);
}
