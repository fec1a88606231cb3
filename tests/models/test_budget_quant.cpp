// The inference budget with quantized weights (`kiln budget --weights q8_0|q4_k_m`): what kiln
// holds for a GGUF file of that scheme. The weights row is checked against a real file (written
// by save_gguf_model, loaded by load_gguf_model, read from the tracker); the dry run against a
// measured CPU run, every row; the analytic model against the dry run, every row exactly where
// the simulated backend has no GEMM library scratch (the CPU's bf16 GEMMs charge oneDNN's
// scratchpad, which the analytic model leaves out: there within that scratchpad).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "budget/budget.h"
#include "models/decoder.h"
#include "models/gguf_model.h"
#include "tensor/memory.h"
#include "tests/models/budget_rows.h"

using namespace kiln;
using namespace kiln::models;

namespace {

// Qwen3-style with rows of whole 256-blocks everywhere (dim 256, q width 4 x 64, hidden 512), and
// 8 layers, so that Q4_K_M gives Q6_K to v_proj/down_proj of layers 0, 4 (every third from the
// first eighth) and 7, Q4_K elsewhere, and Q6_K to the untied LM head.
ModelConfig quant_qwen3() {
  ModelConfig c;
  c.name = "quant-qwen3";
  c.vocab_size = 640, c.dim = 256, c.n_layers = 8, c.n_heads = 4, c.n_kv_heads = 2;
  c.head_dim = 64, c.hidden_dim = 512, c.max_seq_len = 256;
  c.norm_eps = 1e-6, c.rope_theta = 1e6, c.rope_style = ops::RopeStyle::RotateHalf;
  c.qk_norm = true, c.tie_embeddings = false;
  return c;
}

using kiln::test::idx;

BudgetSpec infer_spec(const ModelConfig& c, GgufScheme w, DType dt, std::int64_t batch) {
  BudgetSpec s;
  s.cfg = c;
  s.mode = BudgetMode::Infer;
  s.weights = w;
  s.dtype = dt;
  s.batch = batch;
  s.seq = 40;  // 40 or 120 prompt rows: the quantized Linear's prefill path (> 8 rows)
  s.decode_steps = 3;
  return s;
}

TEST(BudgetQuant, WeightsRowIsWhatLoadingTheFileHolds) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("kiln_budget_quant_{}", ::getpid());
  std::filesystem::create_directories(dir);
  for (bool tied : {false, true}) {
    ModelConfig c = quant_qwen3();
    c.tie_embeddings = tied;
    DecoderModel m(c, 3, DType::F32, Device::cpu());
    for (GgufScheme w : {GgufScheme::Q8_0, GgufScheme::Q4_K_M}) {
      const std::string path =
          (dir / fmt::format("{}_{}.gguf", gguf_scheme_name(w), tied)).string();
      save_gguf_model(m, path, w);
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(fmt::format("{} {} tied {}", gguf_scheme_name(w), dtype_name(dt), tied));
        // What the process holds: allocated Weights, and the blocks used in place from the
        // file's mapping (counted as mapped, apart from allocations).
        auto& tracker = MemoryTracker::get(DeviceType::CPU);
        constexpr auto kW = static_cast<std::size_t>(MemCategory::Weights);
        auto weights_held = [&] {
          const MemStats st = tracker.stats();
          return st.current[kW] + st.mapped[kW];
        };
        const std::int64_t before = weights_held();
        std::unique_ptr<DecoderModel> loaded = load_gguf_model(path, dt, Device::cpu());
        const std::int64_t held = weights_held() - before;
        // The quantized blocks are the file's bytes in place: mapped, not allocated.
        EXPECT_GT(tracker.stats().mapped[kW], 0);
        EXPECT_EQ(held, stored_weight_bytes(c, w, dt, DeviceType::CPU));
        BudgetSpec s = infer_spec(c, w, dt, 1);
        EXPECT_EQ(analytic_budget(s).at_peak[idx(BudgetRow::Weights)], held);
        EXPECT_EQ(run_budget(s, Device::meta()).at_peak[idx(BudgetRow::Weights)], held);
        // The scheme saves real bytes: Q8_0 is 34/32 bytes a weight, Q4_K_M under 6 bits.
        EXPECT_LT(held, stored_weight_bytes(c, GgufScheme::F32, dt, DeviceType::CPU));
      }
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(BudgetQuant, DryRunEqualsMeasuredAndAnalyticFollows) {
  for (GgufScheme w : {GgufScheme::Q8_0, GgufScheme::Q4_K_M})
    for (DType dt : {DType::F32, DType::BF16})
      for (std::int64_t batch : {1, 3}) {
        const std::string what =
            fmt::format("{} {} batch {}", gguf_scheme_name(w), dtype_name(dt), batch);
        SCOPED_TRACE(what);
        const BudgetSpec s = infer_spec(quant_qwen3(), w, dt, batch);
        const BudgetFigures dry = run_budget(s, Device::meta());
        const BudgetFigures meas = run_budget(s, Device::cpu());
        test::expect_dry_equals_measured(dry, meas, "measured");
        // A quantized Linear's scratch is in the dry run (its dequantized slice at least).
        EXPECT_GT(dry.at_peak[idx(BudgetRow::Temporaries)], 0);

        const BudgetFigures a = analytic_budget(s);
        if (gemm_scratch_unmodelled(s)) {  // bf16 on the CPU: oneDNN's scratchpad apart
          // (The scratchpad can move the peak to another moment: the static rows are exact.)
          for (BudgetRow r :
               {BudgetRow::Weights, BudgetRow::KVCache, BudgetRow::Inputs, BudgetRow::Runtime})
            EXPECT_EQ(a.at_peak[idx(r)], dry.at_peak[idx(r)]) << budget_row_name(r);
          EXPECT_LE(a.total_peak, dry.total_peak);
          EXPECT_LE(dry.total_peak - a.total_peak, std::int64_t{4} << 20);
        } else {
          test::expect_rows_at_peak_equal(a, dry, "analytic");
        }
      }
}

// On CUDA a quantized Linear on more than 8 rows dequantizes its whole weight (the prefill's),
// and up to 8 rows (the LM head on each row's last position, decode) runs the GEMV on the blocks:
// the peak is down_proj's prefill with its (C, F) weight dequantized, even with an LM head
// larger than every other weight, and the analytic model places it there too, to the byte.
TEST(BudgetQuant, CudaDryRunAndAnalyticAgreeToTheByte) {
  for (GgufScheme w : {GgufScheme::Q8_0, GgufScheme::Q4_K_M})
    for (DType dt : {DType::F32, DType::BF16})
      for (std::int64_t batch : {1, 3}) {
        SCOPED_TRACE(fmt::format("{} {} batch {}", gguf_scheme_name(w), dtype_name(dt), batch));
        BudgetSpec s = infer_spec(quant_qwen3(), w, dt, batch);
        s.cfg.vocab_size = 32000;
        s.simulate = DeviceType::CUDA;
        const BudgetFigures d = run_budget(s, Device::meta());
        test::expect_rows_at_peak_equal(analytic_budget(s), d, "analytic");
        EXPECT_EQ(d.peak_label, "mlp");
        EXPECT_EQ(d.at_peak[idx(BudgetRow::Temporaries)],
                  (256 * 512 * static_cast<std::int64_t>(dtype_size(dt)) + 511) / 512 * 512);
      }
}

TEST(BudgetQuant, TrainingRefusesQuantizedWeightsByName) {
  BudgetSpec s = infer_spec(quant_qwen3(), GgufScheme::Q4_K_M, DType::BF16, 1);
  s.mode = BudgetMode::Train;
  try {
    analytic_budget(s);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[budget] --weights q4_k_m: quantized weights are for inference (kiln trains float "
              "weights); use --mode infer");
  }
}

}  // namespace
