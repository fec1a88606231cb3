// Per-rank training budgets (budget/budget.h: BudgetSpec::nproc, zero, rank):
//  - the analytic model equals the dry run for weights, master weights, gradients and optimizer
//    state at every ZeRO stage, rank count and rank, in f32 and bf16;
//  - ZeRO-1 on 2 ranks halves stories15M's optimizer state (every dimension is even) and equals
//    the sum over parameters of dist::shard_range's shard sizes;
//  - ZeRO-2's bucket and ZeRO-3's gathered unit, recomputed here from the model's own parameter
//    list; rank 0 holds the most; each rank runs batch / nproc rows;
//  - bad specs and `kiln budget --nproc --zero` end to end.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "budget/budget.h"
#include "distributed/shard.h"
#include "models/decoder.h"
#include "models/param_count.h"
#include "tests/models/budget_rows.h"
#include "tests/run_kiln.h"
#include "tests/test_data.h"

using namespace kiln;
using namespace kiln::models;

namespace {

using kiln::test::idx;

constexpr BudgetRow kStates[] = {BudgetRow::Weights, BudgetRow::MasterWeights, BudgetRow::Gradients,
                                 BudgetRow::OptimizerState};

// Qwen3-style with dimensions that 3, 8 and 64 ranks do not divide: uneven shards, and empty
// ones for the 20-element QK-norm weights on 64 ranks.
ModelConfig odd_qwen3() {
  ModelConfig c;
  c.name = "odd-qwen3";
  c.vocab_size = 500, c.dim = 60, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
  c.head_dim = 20, c.hidden_dim = 150, c.max_seq_len = 64;
  c.norm_eps = 1e-6, c.rope_theta = 1e6, c.rope_style = ops::RopeStyle::RotateHalf;
  c.qk_norm = true, c.tie_embeddings = false;
  return c;
}

BudgetSpec train_spec(const ModelConfig& c, int nproc, int zero, int rank = 0) {
  BudgetSpec s;
  s.cfg = c;
  s.mode = BudgetMode::Train;
  s.batch = 2 * nproc, s.seq = 32;
  s.nproc = nproc, s.zero = zero, s.rank = rank;
  return s;
}

std::string what(const BudgetSpec& s) {
  return fmt::format("{} {} {} nproc {} zero {} rank {}", s.cfg.name, dtype_name(s.dtype),
                     s.simulate == DeviceType::CUDA ? "cuda" : "cpu", s.nproc, s.zero, s.rank);
}

void expect_states_equal(const BudgetSpec& s) {
  const BudgetFigures a = analytic_budget(s), d = run_budget(s, Device::meta());
  for (BudgetRow r : kStates) {
    EXPECT_EQ(a.at_peak[idx(r)], d.at_peak[idx(r)]) << what(s) << ": " << budget_row_name(r);
    EXPECT_EQ(a.peak[idx(r)], d.peak[idx(r)]) << what(s) << ": " << budget_row_name(r) << " peak";
  }
  for (BudgetRow r : {BudgetRow::Inputs, BudgetRow::Runtime})
    EXPECT_EQ(a.at_peak[idx(r)], d.at_peak[idx(r)]) << what(s) << ": " << budget_row_name(r);
}

// Bytes as the allocator charges one block (64 B on the CPU, 512 B for CUDA).
std::int64_t rounded(std::int64_t bytes, DeviceType d) {
  const std::int64_t a = d == DeviceType::CUDA ? 512 : 64;
  return (bytes + a - 1) / a * a;
}

}  // namespace

TEST(BudgetZero, AnalyticEqualsDryRunForStatesAtEveryStage) {
  // GPT-2: learned positions (a parameter, no RoPE tables), LayerNorm and biases, tied head.
  for (const ModelConfig& c : {preset("stories260K"), preset("stories15M"), odd_qwen3(),
                               gpt2_config("tiny-gpt2", 500, 60, 2, 4, 64)}) {
    for (int nproc : {1, 2, 3, 8}) {
      for (int zero = 0; zero <= kMaxZeroStage; ++zero) {
        for (int rank : {0, nproc - 1}) {
          BudgetSpec s = train_spec(c, nproc, zero, rank);
          expect_states_equal(s);
          s.adamw = false;  // SGD: one momentum buffer, sharded the same way
          expect_states_equal(s);
        }
      }
    }
  }
  // bf16 mixed precision (f32 masters), both allocators; and 64 ranks (empty shards).
  for (DeviceType sim : {DeviceType::CPU, DeviceType::CUDA}) {
    for (int zero = 0; zero <= kMaxZeroStage; ++zero) {
      for (int nproc : {2, 3, 64}) {
        BudgetSpec s = train_spec(odd_qwen3(), nproc, zero, nproc - 1);
        s.dtype = DType::BF16, s.simulate = sim;
        expect_states_equal(s);
        s.rank = 0, s.recompute = true;
        expect_states_equal(s);
      }
    }
  }
}

TEST(BudgetZero, Zero1OnTwoRanksHalvesStories15MOptimizerState) {
  const BudgetSpec s0 = train_spec(preset("stories15M"), 2, 0), s1 = train_spec(s0.cfg, 2, 1);
  const BudgetFigures z0 = run_budget(s0, Device::meta()), z1 = run_budget(s1, Device::meta());
  const std::int64_t opt0 = z0.at_peak[idx(BudgetRow::OptimizerState)];
  const std::int64_t opt1 = z1.at_peak[idx(BudgetRow::OptimizerState)];
  EXPECT_EQ(2 * opt1, opt0);
  // AdamW m and v, f32, on rank 0's shard of every parameter (all shards are multiples of 16
  // elements here, so no rounding).
  DecoderModel m(s0.cfg, 1, DType::F32, Device::meta());
  std::int64_t shard_elems = 0, full_elems = 0;
  for (const auto& p : m.parameters()) {
    shard_elems += dist::shard_range(p.numel(), 0, 2).size();
    full_elems += p.numel();
  }
  EXPECT_EQ(2 * shard_elems, full_elems);
  EXPECT_EQ(opt1, 2 * 4 * shard_elems);
  EXPECT_EQ(analytic_budget(s1).at_peak[idx(BudgetRow::OptimizerState)], opt1);
  // Weights and gradients stay whole under ZeRO-1 (f32: no masters).
  for (BudgetRow r : {BudgetRow::Weights, BudgetRow::Gradients, BudgetRow::MasterWeights})
    EXPECT_EQ(z1.at_peak[idx(r)], z0.at_peak[idx(r)]) << budget_row_name(r);
  // The activations are one rank's batch / nproc rows: the same as one process at that batch.
  BudgetSpec one = s0;
  one.nproc = 1, one.batch = s0.batch / 2;
  const BudgetFigures single = run_budget(one, Device::meta());
  for (BudgetRow r :
       {BudgetRow::Activations, BudgetRow::Logits, BudgetRow::Inputs, BudgetRow::Temporaries})
    EXPECT_EQ(z1.at_peak[idx(r)], single.at_peak[idx(r)]) << budget_row_name(r);
}

// Each stage's rows from the model's own parameter list and dist::shard_range, in bf16 (f32
// masters) on the CUDA allocator's 512-byte blocks.
TEST(BudgetZero, StagesFromTheParameterList) {
  const ModelConfig c = odd_qwen3();
  const int nproc = 3;
  DecoderModel m(c, 1, DType::BF16, Device::meta());
  std::int64_t full2 = 0, full4 = 0, shard2 = 0, shard4 = 0, largest = 0;
  std::map<std::string, std::int64_t> units;  // "model.layers.1." or the parameter's own name
  for (const auto& [name, p] : m.named_parameters()) {
    const std::int64_t n = p.numel(), k = dist::shard_range(n, 0, nproc).size();
    full2 += rounded(2 * n, DeviceType::CUDA), full4 += rounded(4 * n, DeviceType::CUDA);
    shard2 += rounded(2 * k, DeviceType::CUDA), shard4 += rounded(4 * k, DeviceType::CUDA);
    largest = std::max(largest, n);
    const auto at = name.find("layers.");
    units[at == std::string::npos ? name : name.substr(0, name.find('.', at + 7) + 1)] += n;
  }
  ASSERT_EQ(units.count("model.layers.1."), 1u);
  std::int64_t unit = 0;
  for (const auto& [u, n] : units) unit = std::max(unit, n);
  // Here one layer (41,560 elements) outweighs the LM head (500 x 60), the largest parameter;
  // in Qwen3-8B the LM head is both.
  EXPECT_EQ(unit, units["model.layers.0."]);
  EXPECT_EQ(unit, 4800 + 2400 + 2400 + 4800 + 20 + 20 + 3 * 60 * 150 + 2 * 60);
  EXPECT_EQ(largest, 500 * 60);
  const std::int64_t bucket = rounded(2 * largest, DeviceType::CUDA);
  const std::int64_t gathered = rounded(2 * unit, DeviceType::CUDA);

  struct Expect {
    std::int64_t weights, masters, grads, opt;
  };
  const Expect stages[] = {{full2, full4, full2, 2 * full4},
                           {full2, shard4, full2, 2 * shard4},
                           {full2, shard4, shard2 + bucket, 2 * shard4},
                           {shard2 + gathered, shard4, shard2 + bucket, 2 * shard4}};
  for (int zero = 0; zero <= kMaxZeroStage; ++zero) {
    BudgetSpec s = train_spec(c, nproc, zero);
    s.dtype = DType::BF16, s.simulate = DeviceType::CUDA;
    const BudgetFigures d = run_budget(s, Device::meta());
    const Expect& e = stages[zero];
    EXPECT_EQ(d.at_peak[idx(BudgetRow::Weights)], e.weights) << "zero " << zero;
    EXPECT_EQ(d.at_peak[idx(BudgetRow::MasterWeights)], e.masters) << "zero " << zero;
    EXPECT_EQ(d.at_peak[idx(BudgetRow::Gradients)], e.grads) << "zero " << zero;
    EXPECT_EQ(d.at_peak[idx(BudgetRow::OptimizerState)], e.opt) << "zero " << zero;
  }
}

TEST(BudgetZero, RankZeroHoldsTheMost) {
  for (int nproc : {3, 8, 64}) {
    for (int zero = 1; zero <= kMaxZeroStage; ++zero) {
      const BudgetFigures r0 = analytic_budget(train_spec(odd_qwen3(), nproc, zero, 0));
      std::int64_t opt_elems = 0;  // f32 moments over all ranks, without rounding
      for (int rank = 0; rank < nproc; ++rank) {
        BudgetSpec s = train_spec(odd_qwen3(), nproc, zero, rank);
        const BudgetFigures f = run_budget(s, Device::meta());
        for (BudgetRow r : kStates)
          EXPECT_LE(f.at_peak[idx(r)], r0.at_peak[idx(r)]) << what(s) << ": " << budget_row_name(r);
        DecoderModel m(s.cfg, 1, DType::F32, Device::meta());
        for (const auto& p : m.parameters())
          opt_elems += dist::shard_range(p.numel(), rank, nproc).size();
      }
      // The shards cover every element once.
      DecoderModel m(odd_qwen3(), 1, DType::F32, Device::meta());
      EXPECT_EQ(opt_elems, m.num_parameters()) << nproc;
    }
  }
}

// With one rank, ZeRO-1 shards nothing; ZeRO-2 and 3 add only their transient buffers.
TEST(BudgetZero, OneRank) {
  const BudgetFigures z0 = run_budget(train_spec(odd_qwen3(), 1, 0), Device::meta());
  const BudgetFigures z1 = run_budget(train_spec(odd_qwen3(), 1, 1), Device::meta());
  for (std::size_t i = 0; i < kNumBudgetRows; ++i)
    EXPECT_EQ(z0.at_peak[i], z1.at_peak[i]) << budget_row_name(static_cast<BudgetRow>(i));
  const BudgetFigures z2 = run_budget(train_spec(odd_qwen3(), 1, 2), Device::meta());
  EXPECT_EQ(z2.at_peak[idx(BudgetRow::Gradients)] - z0.at_peak[idx(BudgetRow::Gradients)],
            rounded(4 * 500 * 60, DeviceType::CPU));
}

TEST(BudgetZero, FitSearchesWholeLocalBatches) {
  BudgetSpec s = train_spec(odd_qwen3(), 4, 1);
  s.batch = 4;
  const std::int64_t limit = run_budget(s, Device::meta()).total_peak + 200000;
  const FitResult f = fit_budget(s, limit);
  ASSERT_GE(f.max_batch, 4);
  EXPECT_EQ(f.max_batch % 4, 0);
  auto peak = [&](std::int64_t b) {
    BudgetSpec t = s;
    t.batch = b;
    return run_budget(t, Device::meta()).total_peak;
  };
  EXPECT_LE(peak(f.max_batch), limit);
  EXPECT_GT(peak(f.max_batch + 4), limit);
}

TEST(BudgetZero, BadSpecsNameTheProblem) {
  auto message = [](const BudgetSpec& s) -> std::string {
    try {
      analytic_budget(s);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  BudgetSpec s = train_spec(odd_qwen3(), 3, 1);
  s.batch = 4;
  EXPECT_NE(message(s).find("global --batch 4 is not divisible by --nproc 3"), std::string::npos)
      << message(s);
  s = train_spec(odd_qwen3(), 2, 4);
  EXPECT_NE(message(s).find("--zero 4 is not a ZeRO stage"), std::string::npos) << message(s);
  s = train_spec(odd_qwen3(), 0, 1);
  s.batch = 2;
  EXPECT_NE(message(s).find("--nproc 0 is out of range"), std::string::npos) << message(s);
  s = train_spec(odd_qwen3(), kMaxBudgetRanks + 1, 1);
  EXPECT_NE(message(s).find("out of range"), std::string::npos) << message(s);
  s = train_spec(odd_qwen3(), 2, 1, 2);
  EXPECT_NE(message(s).find("rank 2"), std::string::npos) << message(s);
  s = train_spec(odd_qwen3(), 2, 1);
  s.mode = BudgetMode::Infer, s.seq = 16;
  EXPECT_NE(message(s).find("use --mode train"), std::string::npos) << message(s);
}

TEST(BudgetZero, Qwen3_8BOnEightRanks) {
  const std::string path = test_shared_data() + "/qwen/Qwen3-8B/config.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  BudgetSpec s = train_spec(resolve_model_config(path), 8, 0);
  s.dtype = DType::BF16, s.simulate = DeviceType::CUDA, s.seq = 4096, s.batch = 8;
  std::int64_t opt0 = 0;
  for (int zero = 0; zero <= kMaxZeroStage; ++zero) {
    s.zero = zero;
    expect_states_equal(s);
    const std::int64_t opt = run_budget(s, Device::meta()).at_peak[idx(BudgetRow::OptimizerState)];
    if (zero == 0) opt0 = opt;
    // 8 divides every Qwen3-8B dimension: the moments shrink 8 times (512-byte blocks: the
    // 16-element QK-norm shards round up, 72 tensors of 128 elements).
    if (zero >= 1) EXPECT_NEAR(static_cast<double>(opt0) / static_cast<double>(opt), 8.0, 1e-4);
  }
}

TEST(BudgetZero, CommandLine) {
  if (!have_kiln()) GTEST_SKIP() << "kiln not built";
  std::int64_t opt[2] = {0, 0};
  for (int zero : {0, 1}) {
    KilnRun run = run_kiln(fmt::format("budget --model stories15M --mode train --batch 4 --seq 64 "
                                       "--nproc 2 --zero {} --json",
                                       zero),
                           /*with_stderr=*/false);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto j = nlohmann::json::parse(run.output);
    ASSERT_EQ(j.size(), 1u);
    EXPECT_EQ(j[0]["nproc"], 2);
    EXPECT_EQ(j[0]["zero"], zero);
    EXPECT_EQ(j[0]["rank"], 0);
    EXPECT_EQ(j[0]["local_batch"], 2);
    EXPECT_EQ(j[0]["analytic"]["at_peak"]["optimizer state"],
              j[0]["dry_run"]["at_peak"]["optimizer state"]);
    opt[zero] = j[0]["dry_run"]["at_peak"]["optimizer state"].get<std::int64_t>();
  }
  EXPECT_EQ(opt[0], 2 * opt[1]);
  // Without --batch, one row per rank: the issue's `--nproc 8 --zero 1` works as written.
  KilnRun dflt = run_kiln("budget --model stories15M --mode train --nproc 8 --zero 1 --json",
                          /*with_stderr=*/false);
  ASSERT_EQ(dflt.exit_code, 0) << dflt.output;
  const auto jd = nlohmann::json::parse(dflt.output);
  EXPECT_EQ(jd[0]["batch"], 8);
  EXPECT_EQ(jd[0]["local_batch"], 1);
  KilnRun text = run_kiln(
      "budget --model stories15M --mode train --batch 4 --nproc 2 --zero 3 --gpu-mem 1GiB");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("in 1.00 GiB per rank"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("largest global batch"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("rank 0 of 2"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("mpirun -np 2 kiln train"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("what-if"), std::string::npos) << text.output;
  // Clean errors that name the flag.
  for (const auto& [args, needle] : std::initializer_list<std::pair<const char*, const char*>>{
           {"--mode train --nproc 0", "--nproc"},
           {"--mode train --nproc 70000", "--nproc"},
           {"--mode train --zero 4", "--zero"},
           {"--mode train --zero -1", "--zero"},
           {"--mode train --nproc 3 --batch 4", "not divisible by --nproc 3"},
           {"--nproc 2 --batch 2", "--mode train"},
           {"--mode train --nproc 2 --batch 2 --measure", "mpirun -np 2"}}) {
    KilnRun bad = run_kiln(std::string("budget --model stories15M ") + args);
    EXPECT_NE(bad.exit_code, 0) << args;
    EXPECT_NE(bad.output.find(needle), std::string::npos) << args << ": " << bad.output;
  }
}
