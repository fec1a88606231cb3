// Memory budgets (budget/budget.h):
//  - the dry run on the meta device equals the run measured on the CPU, every
//    row's own peak and the breakdown at the global peak, for one stories15M
//    training step (batch 4, seq 256, fp32, AdamW) and for a prefill of 64
//    tokens plus 32 decode steps of a tiny Qwen3 (and a few variants);
//  - the analytic model against the dry run: weights, master weights,
//    gradients, optimizer state, KV cache, inputs and runtime equal; activations
//    within 5% (the stated tolerance; today they agree exactly);
//  - closed-form values computed here independently (bytes per parameter, KV
//    bytes per token), sizes, the fit search and `kiln budget` end to end.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "budget/budget.h"
#include "kernels/cuda/runtime.h"
#include "models/decoder.h"
#include "models/mfu.h"
#include "models/param_count.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tests/models/budget_rows.h"
#include "tests/run_kiln.h"
#include "tests/test_data.h"

using namespace kiln;
using namespace kiln::models;

namespace {

const std::string kQwen3_8B = test_shared_data() + "/qwen/Qwen3-8B/config.json";

// Qwen3-style: QK-norm, GQA 4:2, head_dim 32 != dim / heads, untied.
ModelConfig budget_tiny_qwen3() {
  ModelConfig c;
  c.name = "tiny-qwen3";
  c.vocab_size = 512, c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
  c.head_dim = 32, c.hidden_dim = 192, c.max_seq_len = 128;
  c.norm_eps = 1e-6, c.rope_theta = 1e6, c.rope_style = ops::RopeStyle::RotateHalf;
  c.qk_norm = true, c.tie_embeddings = false;
  return c;
}

using kiln::test::idx;

using kiln::test::expect_dry_equals_measured;

// The analytic model is compared with the dry run of a backend that computes the dtype
// natively without GEMM library scratch: the simulated one, or CUDA's where the simulated CPU
// widens bf16 to f32 copies or, in bf16, charges oneDNN's scratchpad (a few hundred KiB per
// GEMM shape that the analytic model leaves out: 1.16 MiB of 8.92 GiB for Qwen3-0.6B, but
// enough to move the peak of these tiny models).
void expect_analytic(BudgetSpec s) {
  if (!simulates_native_dtype(s) || gemm_scratch_unmodelled(s)) s.simulate = DeviceType::CUDA;
  BudgetFigures a = analytic_budget(s), d = run_budget(s, Device::meta());
  std::string what = fmt::format("{} {} {} b{} s{}{}", s.cfg.name, budget_mode_name(s.mode),
                                 dtype_name(s.dtype), s.batch, s.seq, s.recompute ? " rc" : "");
  for (BudgetRow r :
       {BudgetRow::Weights, BudgetRow::MasterWeights, BudgetRow::Gradients,
        BudgetRow::OptimizerState, BudgetRow::KVCache, BudgetRow::Inputs, BudgetRow::Runtime})
    EXPECT_EQ(a.at_peak[idx(r)], d.at_peak[idx(r)]) << what << ": " << budget_row_name(r);
  // Stated tolerance for activations: 5% of the dry run.
  const double act_d = static_cast<double>(d.at_peak[idx(BudgetRow::Activations)]);
  const double act_a = static_cast<double>(a.at_peak[idx(BudgetRow::Activations)]);
  EXPECT_LE(std::abs(act_a - act_d), 0.05 * act_d)
      << what << ": activations " << act_a << " vs " << act_d;
  EXPECT_LE(std::abs(static_cast<double>(a.total_peak - d.total_peak)),
            0.05 * static_cast<double>(d.total_peak))
      << what;
}

// Σ over parameter tensors of n·bytes rounded up to 64, computed from the
// model's own parameter list (not from the formula under test).
std::int64_t param_bytes(const ModelConfig& c, std::int64_t bytes_per) {
  DecoderModel m(c, 1, DType::F32, Device::meta());
  std::int64_t sum = 0;
  for (auto& p : m.parameters()) sum += (p.numel() * bytes_per + 63) / 64 * 64;
  return sum;
}

}  // namespace

TEST(Budget, DryRunEqualsMeasuredStories15MTrainStep) {
  BudgetSpec s;
  s.cfg = preset("stories15M");
  s.mode = BudgetMode::Train;
  s.batch = 4, s.seq = 256, s.dtype = DType::F32, s.adamw = true;
  BudgetFigures dry = run_budget(s, Device::meta());
  BudgetFigures meas = run_budget(s, Device::cpu());
  expect_dry_equals_measured(dry, meas, "stories15M train step");
  EXPECT_EQ(dry.peak_phase, Phase::Backward);
  // Weights, gradients, AdamW m and v: 4 + 4 + 8 bytes per parameter (+ rounding).
  const std::int64_t w = param_bytes(s.cfg, 4);
  EXPECT_EQ(dry.at_peak[idx(BudgetRow::Weights)], w);
  EXPECT_EQ(dry.at_peak[idx(BudgetRow::Gradients)], w);
  EXPECT_EQ(dry.at_peak[idx(BudgetRow::OptimizerState)], 2 * w);
  EXPECT_EQ(dry.at_peak[idx(BudgetRow::MasterWeights)], 0);
  // The logits gradient (B·T, V) f32 is alive at the peak.
  EXPECT_GE(dry.at_peak[idx(BudgetRow::Logits)], 4 * 256 * 32000 * 4);
}

TEST(Budget, DryRunEqualsMeasuredTinyQwen3PrefillDecode) {
  BudgetSpec s;
  s.cfg = budget_tiny_qwen3();
  s.mode = BudgetMode::Infer;
  s.batch = 1, s.seq = 64, s.decode_steps = 32, s.dtype = DType::F32;
  ASSERT_EQ(s.decodes(), 32);
  BudgetFigures dry = run_budget(s, Device::meta(), true);
  BudgetFigures meas = run_budget(s, Device::cpu());
  expect_dry_equals_measured(dry, meas, "tiny qwen3 prefill 64 + 32 decode");
  // KV: 2 (k, v) · L · context · Hkv · D · 4 bytes.
  EXPECT_EQ(dry.at_peak[idx(BudgetRow::KVCache)], 2 * 2 * 96 * 2 * 32 * 4);
  bool prefill = false, decode = false;
  for (const auto& e : dry.timeline) {
    prefill = prefill || e.phase == Phase::Prefill;
    decode = decode || e.phase == Phase::Decode;
  }
  EXPECT_TRUE(prefill && decode);
}

TEST(Budget, DryRunEqualsMeasuredVariants) {
  BudgetSpec s;
  s.cfg = budget_tiny_qwen3();
  s.mode = BudgetMode::Infer;
  s.batch = 3, s.seq = 20, s.decode_steps = 5;  // strided KV-cache slots at batch > 1
  expect_dry_equals_measured(run_budget(s, Device::meta()), run_budget(s, Device::cpu()),
                             "infer batch 3");
  s.mode = BudgetMode::Train;
  s.batch = 2, s.seq = 32;
  s.recompute = true;
  expect_dry_equals_measured(run_budget(s, Device::meta()), run_budget(s, Device::cpu()),
                             "train recompute");
  s.recompute = false;
  s.adamw = false;
  expect_dry_equals_measured(run_budget(s, Device::meta()), run_budget(s, Device::cpu()),
                             "train sgd");
}

// The CPU runs bf16 natively where it has a bf16 kernel (tensor/kernels_cpu_*.cpp: GEMMs on oneDNN
// with a user-managed scratchpad or widened blocks, and most other ops) and through f32 copies
// elsewhere; the dry run, asking the CPU's kernel table, charges exactly those copies and the
// native kernels' declared scratch.
TEST(Budget, DryRunEqualsMeasuredInBf16OnTheCpu) {
  BudgetSpec s;
  s.cfg = budget_tiny_qwen3();
  s.dtype = DType::BF16;
  s.mode = BudgetMode::Train, s.batch = 2, s.seq = 32;
  expect_dry_equals_measured(run_budget(s, Device::meta()), run_budget(s, Device::cpu()),
                             "bf16 train");
  s.recompute = true;
  expect_dry_equals_measured(run_budget(s, Device::meta()), run_budget(s, Device::cpu()),
                             "bf16 train rc");
  s.mode = BudgetMode::Infer, s.recompute = false, s.seq = 20, s.decode_steps = 4;
  expect_dry_equals_measured(run_budget(s, Device::meta()), run_budget(s, Device::cpu()),
                             "bf16 infer");
  // stories15M's shapes (dim 288, hidden 768, vocab 32000) through the bf16 GEMMs.
  BudgetSpec t;
  t.cfg = preset("stories15M");
  t.dtype = DType::BF16;
  t.mode = BudgetMode::Train, t.batch = 2, t.seq = 64, t.adamw = true;
  expect_dry_equals_measured(run_budget(t, Device::meta()), run_budget(t, Device::cpu()),
                             "stories15M bf16 train");
}

TEST(Budget, AnalyticMatchesDryRun) {
  for (const char* name : {"stories260K", "stories15M"}) {
    for (bool rc : {false, true}) {
      BudgetSpec s;
      s.cfg = preset(name);
      s.batch = 4, s.seq = 256, s.recompute = rc;
      expect_analytic(s);
    }
  }
  BudgetSpec q;
  q.cfg = budget_tiny_qwen3();
  for (DType dt : {DType::F32, DType::BF16}) {
    q.dtype = dt;
    q.mode = BudgetMode::Train, q.batch = 2, q.seq = 64;
    expect_analytic(q);
    q.mode = BudgetMode::Infer, q.batch = 2, q.seq = 64;
    expect_analytic(q);
  }
  q.simulate = DeviceType::CUDA;  // 512-byte blocks
  expect_analytic(q);
}

// A gated MLP with another activation than silu is act(gate) * up, not the fused SwiGLU: it
// saves one more (N, F) tensor per layer and, with --recompute, peaks in the product's backward.
// The dry run equals the CPU run, and the analytic model follows it, here to the byte
// (gelu_pytorch_tanh; gelu saves the same tensors).
TEST(Budget, GeluGatedMlpDryRunAndAnalytic) {
  auto expect_exact = [](const BudgetSpec& s) {
    expect_analytic(s);
    // Exact against a dry run that takes the dtype natively on the CPU allocator; a bf16 CPU
    // without bf16 kernels is compared with CUDA's dry run, within expect_analytic's tolerance.
    if (!simulates_native_dtype(s) || gemm_scratch_unmodelled(s)) return;
    test::expect_rows_at_peak_equal(analytic_budget(s), run_budget(s, Device::meta()),
                                    std::string(budget_mode_name(s.mode)));
  };
  for (MlpActivation act : {MlpActivation::GeluTanh, MlpActivation::Gelu}) {
    SCOPED_TRACE(nn::mlp_activation_name(act));
    BudgetSpec s;
    s.cfg = budget_tiny_qwen3();
    s.cfg.hidden_act = act;
    s.mode = BudgetMode::Train;
    s.batch = 2, s.seq = 32;
    for (bool rc : {false, true}) {
      s.recompute = rc;
      s.dtype = DType::F32;
      expect_dry_equals_measured(run_budget(s, Device::meta()), run_budget(s, Device::cpu()),
                                 rc ? "gelu-gated train recompute" : "gelu-gated train");
      for (DType dt : {DType::F32, DType::BF16}) {
        s.dtype = dt;
        expect_exact(s);
      }
    }
    s.mode = BudgetMode::Infer;
    s.recompute = false, s.dtype = DType::F32;
    s.batch = 2, s.seq = 20, s.decode_steps = 4;
    expect_dry_equals_measured(run_budget(s, Device::meta()), run_budget(s, Device::cpu()),
                               "gelu-gated infer");
    expect_exact(s);
    s.simulate = DeviceType::CUDA;
    expect_exact(s);
  }
}

TEST(Budget, Qwen3_8BBytesPerParamAndKvPerToken) {
  if (!std::filesystem::exists(kQwen3_8B)) GTEST_SKIP() << "no " << kQwen3_8B;
  BudgetSpec s;
  s.cfg = resolve_model_config(kQwen3_8B);
  s.dtype = DType::BF16;
  s.mode = BudgetMode::Train, s.batch = 1, s.seq = 4096;
  BudgetFigures d = run_budget(s, Device::meta());
  const double n = 8190735360.0;  // parameters (tests/models/test_param_count.cpp)
  const double model_state = static_cast<double>(
      d.at_peak[idx(BudgetRow::Weights)] + d.at_peak[idx(BudgetRow::MasterWeights)] +
      d.at_peak[idx(BudgetRow::Gradients)] + d.at_peak[idx(BudgetRow::OptimizerState)]);
  EXPECT_NEAR(model_state / n, 16.0, 1e-5);  // 2 + 2 + 4 + 4 + 4
  expect_analytic(s);
  s.recompute = true;
  expect_analytic(s);
  // Inference: KV cache 147,456 bytes per token (2 · 36 · 8 · 128 · 2).
  s.mode = BudgetMode::Infer, s.recompute = false;
  for (std::int64_t ctx : {4096, 32768}) {
    s.seq = ctx - 32, s.context = ctx;
    BudgetFigures i = run_budget(s, Device::meta());
    // The row's own peak: with bf16 Linear native on the CPU (no f32 copy of the LM head), the
    // global peak of a short context can fall in the model's construction, before the cache.
    EXPECT_EQ(i.peak[idx(BudgetRow::KVCache)], 147456 * ctx);
    expect_analytic(s);
  }
}

TEST(Budget, ParseBytes) {
  EXPECT_EQ(parse_bytes("80GiB"), 80LL << 30);
  EXPECT_EQ(parse_bytes("24GB"), 24000000000LL);
  EXPECT_EQ(parse_bytes("512 MiB"), 512LL << 20);
  EXPECT_EQ(parse_bytes("1.5e9"), 1500000000LL);
  EXPECT_EQ(parse_bytes("4096"), 4096);
  EXPECT_EQ(parse_bytes("2g"), 2LL << 30);
  for (const char* bad : {"", "GiB", "12 parsecs", "-5GB", "1e30"})
    EXPECT_THROW(parse_bytes(bad), Error) << bad;
}

TEST(Budget, FitIsTheLargestThatFits) {
  BudgetSpec s;
  s.cfg = budget_tiny_qwen3();
  s.mode = BudgetMode::Train, s.batch = 2, s.seq = 32;
  const std::int64_t limit = run_budget(s, Device::meta()).total_peak + 300000;
  FitResult f = fit_budget(s, limit);
  auto peak = [&](std::int64_t b, std::int64_t t) {
    BudgetSpec x = s;
    x.batch = b, x.seq = t;
    return run_budget(x, Device::meta()).total_peak;
  };
  ASSERT_GE(f.max_batch, 2);
  EXPECT_LE(peak(f.max_batch, 32), limit);
  EXPECT_GT(peak(f.max_batch + 1, 32), limit);
  ASSERT_GE(f.max_seq, 32);
  if (f.max_seq < s.cfg.max_seq_len) EXPECT_GT(peak(2, f.max_seq + 1), limit);
  EXPECT_LE(peak(2, f.max_seq), limit);
  EXPECT_EQ(fit_budget(s, 1000).max_batch, 0);
}

TEST(Budget, BadSpecs) {
  BudgetSpec s;
  s.cfg = budget_tiny_qwen3();
  s.seq = 200;  // > max_seq_len 128
  EXPECT_THROW(run_budget(s, Device::meta()), Error);
  s.mode = BudgetMode::Infer, s.seq = 64, s.context = 32;
  EXPECT_THROW(analytic_budget(s), Error);
  s.seq = 128,
  s.context = 0;  // the prompt fills max_seq_len: the default cache has no room to decode
  EXPECT_EQ(s.kv_capacity(), 128);
  EXPECT_EQ(s.decodes(), 0);
  EXPECT_EQ(run_budget(s, Device::meta()).at_peak[idx(BudgetRow::KVCache)],
            2 * 2 * 128 * 2 * 32 * 4);
  s.batch = 0;
  EXPECT_THROW(run_budget(s, Device::meta()), Error);
}

TEST(Budget, CommandLine) {
  if (!have_kiln()) GTEST_SKIP() << "kiln not built";
  const std::string svg = testing::TempDir() + "budget.svg";
  KilnRun run = run_kiln(
      "budget --model stories260K --mode both --batch 2 --seq 64 --measure --gpu-mem 64MiB "
      "--json --svg " +
          svg,
      /*with_stderr=*/false);
  const std::string& out = run.output;
  ASSERT_EQ(run.exit_code, 0) << out;
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 2u);
  for (const auto& r : j) {
    nlohmann::json meas = r["measured"]["at_peak"];
    meas["allocator slack"] = 0;  // the CPU allocator's cached blocks; meta has none
    EXPECT_EQ(r["dry_run"]["at_peak"], meas) << r["mode"];
    EXPECT_TRUE(r["fit"]["fits"].get<bool>());
    EXPECT_GE(r["fit"]["max_batch"].get<std::int64_t>(), 2);
  }
  std::ifstream f(svg);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(s.find("<svg"), std::string::npos);
  EXPECT_NE(s.find("<polygon"), std::string::npos);  // the timeline chart
}

// ---- CUDA rows: Runtime and Unattributed ----------------------------------------------------

TEST(Budget, CpuMeasurementsHaveNoDeviceRows) {
  EXPECT_EQ(budget_row_name(BudgetRow::Unattributed), "unattributed");
  EXPECT_EQ(idx(BudgetRow::Unattributed) + 1, kNumBudgetRows);
  BudgetSpec s;
  s.cfg = budget_tiny_qwen3();
  s.mode = BudgetMode::Train, s.batch = 1, s.seq = 16;
  BudgetFigures m = run_budget(s, Device::cpu());
  EXPECT_FALSE(m.device.has_value());
  EXPECT_EQ(m.at_peak[idx(BudgetRow::Unattributed)], 0);
  BudgetReport r;
  r.spec = s;
  r.analytic = analytic_budget(s);
  r.dry = run_budget(s, Device::meta());
  r.measured = m;
  const nlohmann::json j = budget_report_json({r});
  EXPECT_FALSE(j[0]["measured"].contains("device"));
  EXPECT_EQ(j[0]["measured"]["at_peak"]["unattributed"], 0);
  // The text shows the Unattributed row only where a GPU was measured.
  EXPECT_EQ(budget_report_text({r}).find("unattributed"), std::string::npos);
}

TEST(Budget, DeviceRowsGoIntoTheReport) {
  // A CUDA measurement as run_budget builds it, with made-up driver figures: the text and JSON
  // carry the runtime breakdown and unattributed = used - other - reserved - runtime.
  BudgetSpec s;
  s.cfg = budget_tiny_qwen3();
  s.mode = BudgetMode::Train, s.batch = 1, s.seq = 16, s.simulate = DeviceType::CUDA;
  BudgetReport r;
  r.spec = s;
  r.analytic = analytic_budget(s);
  r.dry = run_budget(s, Device::meta());
  BudgetFigures m = r.dry;
  DeviceMemoryRows d;
  d.total = 80LL << 30;
  d.used = (1LL << 30) + (123LL << 20);
  d.other = 0;
  d.reserved = 1LL << 30;
  d.allocated = 900LL << 20;
  d.context = 100LL << 20;
  d.libraries = 20LL << 20;
  d.context_measured = true;
  EXPECT_EQ(d.runtime(), 120LL << 20);
  EXPECT_EQ(d.unattributed(), 3LL << 20);
  m.at_peak[idx(BudgetRow::Runtime)] += d.runtime();
  m.at_peak[idx(BudgetRow::Unattributed)] = d.unattributed();
  m.device = d;
  r.measured = m;
  const nlohmann::json j = budget_report_json({r});
  const auto& dev = j[0]["measured"]["device"];
  EXPECT_EQ(dev["unattributed"], 3LL << 20);
  EXPECT_EQ(dev["runtime"], 120LL << 20);
  EXPECT_EQ(dev["cuda_context"], 100LL << 20);
  EXPECT_EQ(dev["kiln_reserved"], 1LL << 30);
  const std::string text = budget_report_text({r});
  EXPECT_NE(text.find("unattributed"), std::string::npos) << text;
  EXPECT_NE(text.find("3.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("CUDA context 100.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("driver used"), std::string::npos) << text;
}

TEST(Budget, MeasuredOnCudaEqualsTheCudaDryRun) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: run_budget on cuda";
  for (DType dt : {DType::BF16, DType::F32}) {
    for (BudgetMode mode : {BudgetMode::Train, BudgetMode::Infer}) {
      BudgetSpec s;
      s.cfg = budget_tiny_qwen3();
      s.mode = mode, s.dtype = dt, s.batch = 2, s.seq = 32, s.decode_steps = 8;
      s.simulate = DeviceType::CUDA;
      const std::string what = fmt::format("cuda {} {}", budget_mode_name(mode), dtype_name(dt));
      BudgetFigures dry = run_budget(s, Device::meta());
      BudgetFigures meas = run_budget(s, Device::cuda());
      ASSERT_TRUE(meas.device.has_value()) << what;
      const DeviceMemoryRows& d = *meas.device;
      // The allocator rows are exact; Runtime gains the context and libraries; Unattributed
      // is the driver's remainder.
      for (std::size_t i = 0; i < kNumBudgetRows; ++i) {
        const auto row = static_cast<BudgetRow>(i);
        if (row == BudgetRow::Runtime || row == BudgetRow::Unattributed) continue;
        EXPECT_EQ(dry.at_peak[i], meas.at_peak[i]) << what << ": " << budget_row_name(row);
      }
      EXPECT_EQ(meas.total_peak, dry.total_peak) << what;
      EXPECT_EQ(meas.at_peak[idx(BudgetRow::Runtime)],
                dry.at_peak[idx(BudgetRow::Runtime)] + d.runtime())
          << what;
      EXPECT_EQ(meas.at_peak[idx(BudgetRow::Unattributed)], d.unattributed()) << what;
      EXPECT_GT(d.context, 0) << what;
      EXPECT_GE(d.reserved, meas.total_peak) << what;
      EXPECT_LE(d.used, d.total) << what;
      std::printf("%s: driver used %lld, reserved %lld, runtime %lld, unattributed %lld\n",
                  what.c_str(), static_cast<long long>(d.used), static_cast<long long>(d.reserved),
                  static_cast<long long>(d.runtime()), static_cast<long long>(d.unattributed()));
    }
  }
}

// ---- MFU (models/mfu.h) -------------------------------------------------------------------------

TEST(TrainerMfu, FlopsPerTokenFollowPalm) {
  // stories15M, tied: per layer 4·288² (attention) + 3·288·768 (MLP) + 2·288 (norms), 6
  // layers, a final norm, and the 32000 x 288 table counted once (as the LM head).
  const std::int64_t layer = 4 * 288 * 288 + 3 * 288 * 768 + 2 * 288;
  const std::int64_t n15 = 6 * layer + 288 + 32000 * 288;
  EXPECT_EQ(matmul_params(preset("stories15M")), n15);
  EXPECT_DOUBLE_EQ(train_flops_per_token(preset("stories15M"), 256),
                   6.0 * n15 + 12.0 * 6 * 6 * 48 * 256);
  // Untied (tiny Qwen3): the input table is left out, the LM head counted.
  const ModelConfig q = budget_tiny_qwen3();
  DecoderModel m(q, 1, DType::F32, Device::meta());
  std::int64_t all = 0, table = 0;
  for (auto& [name, p] : m.named_parameters()) {
    all += p.numel();
    if (name == "model.embed_tokens.weight") table = p.numel();
  }
  ASSERT_EQ(table, q.vocab_size * q.dim);
  EXPECT_EQ(matmul_params(q), all - table);
  // Attention uses H · head_dim (32 here, not dim / heads = 16).
  EXPECT_DOUBLE_EQ(train_flops_per_token(q, 100) - train_flops_per_token(q, 0),
                   12.0 * q.n_layers * q.n_heads * q.head_dim * 100);
}

TEST(TrainerMfu, PeakTableByDeviceName) {
  EXPECT_DOUBLE_EQ(bf16_peak_tflops("NVIDIA H100 80GB HBM3"), 989.4);
  EXPECT_DOUBLE_EQ(bf16_peak_tflops("NVIDIA H100 SXM5 80GB"), 989.4);
  EXPECT_DOUBLE_EQ(bf16_peak_tflops("NVIDIA H100 PCIe"), 756.0);
  EXPECT_DOUBLE_EQ(bf16_peak_tflops("NVIDIA H200"), 989.4);
  EXPECT_DOUBLE_EQ(bf16_peak_tflops("NVIDIA H100 NVL"), 0.0);
  EXPECT_DOUBLE_EQ(bf16_peak_tflops("NVIDIA A100-SXM4-80GB"), 0.0);
  EXPECT_DOUBLE_EQ(bf16_peak_tflops(""), 0.0);
}

// The LM head + loss in chunks of rows (DecoderModel::loss, chunked_loss_rows): the analytic
// model follows to the byte, on the CUDA allocator, the logits whole (too few rows), two full
// chunks, one full chunk and a shorter last one, several full chunks and a shorter last one.
TEST(Budget, AnalyticFollowsTheLossChunksExactly) {
  struct Case {
    const char* preset;
    DType dt;
    std::int64_t batch, seq;
    const char* label;  // the peak's op without --recompute
  };
  for (const Case& k : {Case{"stories42M", DType::BF16, 16, 64, "linear"},
                        Case{"stories15M", DType::F32, 32, 256, "linear_cross_entropy"},
                        Case{"stories15M", DType::BF16, 20, 256, "linear_cross_entropy"},
                        Case{"stories15M", DType::BF16, 40, 131, "linear_cross_entropy"}}) {
    BudgetSpec s;
    s.cfg = preset(k.preset);
    s.mode = BudgetMode::Train, s.dtype = k.dt, s.batch = k.batch, s.seq = k.seq;
    s.simulate = DeviceType::CUDA;
    for (bool rc : {false, true}) {
      s.recompute = rc;
      const BudgetFigures d = run_budget(s, Device::meta());
      const std::string what = fmt::format("{} {} b{} s{}{}", k.preset, dtype_name(k.dt), k.batch,
                                           k.seq, rc ? " rc" : "");
      test::expect_rows_at_peak_equal(analytic_budget(s), d, what);
      if (!rc) EXPECT_EQ(d.peak_label, k.label) << what;
    }
  }
}

// The chunked LM head + loss measured on the CPU equals its dry run: stories260K (V 512, C 64)
// at 20 x 256 = 5120 rows, chunks of 4096 and 1024 rows. (With V this small the chunk's own dh
// (4096, C) outweighs dW (V, C): the peak is the first chunk before its dW.)
TEST(Budget, ChunkedLossMeasuredEqualsDryRun) {
  BudgetSpec s;
  s.cfg = preset("stories260K");
  s.mode = BudgetMode::Train, s.batch = 20, s.seq = 256, s.dtype = DType::F32;
  const std::int64_t N = 20 * 256, V = s.cfg.vocab_size, C = s.cfg.dim;
  ASSERT_EQ(chunked_loss_rows(N, V, C, DecoderModel::kDefaultLossChunkRows), 4096);
  const BudgetFigures dry = run_budget(s, Device::meta()), meas = run_budget(s, Device::cpu());
  expect_dry_equals_measured(dry, meas, "stories260K chunked loss");
  EXPECT_EQ(dry.peak_label, "linear_cross_entropy");
  EXPECT_EQ(dry.peak_phase, Phase::Forward);
  // One chunk's logits (4096, V), dloss, dh (N, C) and the chunk's dh (4096, C), and the loss.
  const auto r64 = [](std::int64_t b) { return (b + 63) / 64 * 64; };
  EXPECT_EQ(dry.at_peak[idx(BudgetRow::Logits)],
            r64(4096 * V * 4) + r64(4096 * 4) + r64(N * C * 4) + r64(4096 * C * 4) + r64(4));
  EXPECT_EQ(analytic_budget(s).at_peak[idx(BudgetRow::Logits)],
            dry.at_peak[idx(BudgetRow::Logits)]);
}

// Where the LM head + loss runs in chunks: only where one chunk's logits, its dh and dW hold
// less than the whole logits.
TEST(Budget, ChunkedLossRowsOnlyWhereChunksHoldLess) {
  constexpr std::int64_t n = DecoderModel::kDefaultLossChunkRows;
  EXPECT_EQ(chunked_loss_rows(16 * 1024, 32000, 512, n), 4096);     // stories42M 16 x 1024
  EXPECT_EQ(chunked_loss_rows(4 * 256, 32000, 288, n), 0);          // one chunk: nothing saved
  EXPECT_EQ(chunked_loss_rows(4096, 151936, 4096, n), 0);           // Qwen3-8B 1 x 4096
  EXPECT_EQ(chunked_loss_rows(8192, 151936, 4096, n), 0);           // 2 x 4096: dW outweighs
  EXPECT_EQ(chunked_loss_rows(16384, 151936, 4096, n), 4096);       // 4 x 4096
  EXPECT_EQ(chunked_loss_rows(64 * 256, 65, 192, n), 0);            // shakespeare-char
  EXPECT_EQ(chunked_loss_rows(16 * 1024, 32000, 512, 0), 0);        // switched off
  EXPECT_EQ(chunked_loss_rows(16 * 1024, 32000, 512, 1 << 20), 0);  // one chunk
  EXPECT_EQ(chunked_loss_rows(16 * 1024, 32000, 512, 2048), 2048);
}

// --loss-chunk-rows reaches the dry run and the analytic model alike: 0 keeps the logits whole
// (the peak is the LM head's backward over them), 2048 chunks finer than the default.
TEST(Budget, LossChunkRowsOptionReachesBothModels) {
  BudgetSpec s;
  s.cfg = preset("stories15M");
  s.mode = BudgetMode::Train, s.dtype = DType::BF16, s.batch = 32, s.seq = 256;
  s.simulate = DeviceType::CUDA;
  std::int64_t prev_logits = 0;
  for (std::int64_t rows : {0, 4096, 2048}) {
    s.loss_chunk_rows = rows;
    const BudgetFigures d = run_budget(s, Device::meta());
    test::expect_rows_at_peak_equal(analytic_budget(s), d, fmt::format("{} rows", rows));
    EXPECT_EQ(d.peak_label, rows == 0 ? "linear" : "linear_cross_entropy") << rows;
    const std::int64_t logits = d.at_peak[idx(BudgetRow::Logits)];
    if (prev_logits > 0) EXPECT_LT(logits, prev_logits) << rows;  // finer chunks hold less
    prev_logits = logits;
  }
  s.loss_chunk_rows = -1;
  EXPECT_THROW(run_budget(s, Device::meta()), Error);
}
