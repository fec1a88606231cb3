// The serving budget (serve/serve_budget.h): the KV pool and the weights come out the same in
// the analytic formula, the meta-device dry run and the measured CPU run, byte for byte; the
// pool is exactly blocks x kv_block_bytes; bad specs are refused by name; the fit line does the
// arithmetic it prints.
#include <gtest/gtest.h>

#include "models/config.h"
#include "serve/kv_pool.h"
#include "serve/serve_budget.h"
#include "tests/models/tiny_hf.h"

namespace kiln::serve {
namespace {

ServeBudgetSpec tiny_spec(DType dt) {
  ServeBudgetSpec s;
  s.cfg = test_hf::tiny_qwen3(false, 200);
  s.dtype = dt;
  s.seqs = 3;
  s.context = 100;
  s.block_size = 16;
  s.max_batch_tokens = 40;
  return s;
}

TEST(ServeBudget, PoolAndWeightsAgreeInAllThreeColumns) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const ServeBudgetSpec s = tiny_spec(dt);
    const ServeBudget a = serve_budget_analytic(s);
    const ServeBudget d = serve_budget_run(s, Device::meta());
    const ServeBudget m = serve_budget_run(s, Device::cpu());
    // 3 sequences x ceil(100 / 16) = 21 blocks of 2 layers x 2 (k, v) x 16 x 2 heads x 16 dims.
    const std::int64_t block = 2 * 2 * 16 * 2 * 16 * static_cast<std::int64_t>(dtype_size(dt));
    EXPECT_EQ(kv_block_bytes(s.cfg, 16, dt), block);
    EXPECT_EQ(a.kv_pool, 21 * block) << dtype_name(dt);
    EXPECT_EQ(d.kv_pool, a.kv_pool) << dtype_name(dt);
    EXPECT_EQ(m.kv_pool, a.kv_pool) << dtype_name(dt);
    EXPECT_EQ(d.weights, a.weights) << dtype_name(dt);
    EXPECT_EQ(m.weights, a.weights) << dtype_name(dt);
    EXPECT_EQ(d.runtime, a.runtime) << dtype_name(dt);
    EXPECT_EQ(m.runtime, a.runtime) << dtype_name(dt);
    // The forward allocates: at least the logits of the 3 decode rows (f32, vocab 1000).
    EXPECT_GE(d.activations, 3 * 1000 * 4);
    EXPECT_GE(m.activations, 3 * 1000 * 4);
    EXPECT_EQ(d.total, d.weights + d.kv_pool + d.runtime + d.activations);
  }
}

// Weights as a GGUF file of each scheme holds them (rows of whole 256-blocks, so Q4_K_M takes
// Q4_K and Q6_K), float beside them: weights, pool and runtime agree in all three columns, and
// the dry run's forward allocates what the measured one does, byte for byte (the meta device
// tiles the rows as the CPU it simulates).
TEST(ServeBudget, QuantizedWeightsAndTheForwardAgreeWithTheMeasuredRun) {
  for (models::GgufScheme w :
       {models::GgufScheme::F32, models::GgufScheme::Q8_0, models::GgufScheme::Q4_K_M})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(models::gguf_scheme_name(w)) + " " + std::string(dtype_name(dt)));
      ServeBudgetSpec s = tiny_spec(dt);
      s.cfg.dim = 256, s.cfg.hidden_dim = 512, s.cfg.head_dim = 64, s.cfg.n_layers = 8;
      s.weights = w;
      s.max_batch_tokens = 37;  // 3 decode rows and 34 prompt rows: tiles of 8 and a partial one
      const ServeBudget a = serve_budget_analytic(s);
      const ServeBudget d = serve_budget_run(s, Device::meta());
      const ServeBudget m = serve_budget_run(s, Device::cpu());
      EXPECT_EQ(d.weights, a.weights);
      EXPECT_EQ(m.weights, a.weights);
      EXPECT_EQ(m.kv_pool, a.kv_pool);
      EXPECT_EQ(m.runtime, a.runtime);
      EXPECT_EQ(d.activations, m.activations);
      EXPECT_EQ(d.total, m.total);
      if (w != models::GgufScheme::F32) {
        ServeBudgetSpec f = s;
        f.weights = models::GgufScheme::F32;
        EXPECT_LT(a.weights, serve_budget_analytic(f).weights);
      }
    }
}

TEST(ServeBudget, TheFitLineDoesItsArithmetic) {
  const ServeBudgetSpec s = tiny_spec(DType::F32);
  const ServeBudget a = serve_budget_analytic(s), d = serve_budget_run(s, Device::meta());
  const std::int64_t per_seq = 7 * kv_block_bytes(s.cfg, 16, DType::F32);
  const std::int64_t memory = d.weights + d.activations + d.runtime + 5 * per_seq + 1;
  const std::string text = serve_budget_text(s, a, d, std::nullopt, memory);
  EXPECT_NE(text.find("= 5 sequences"), std::string::npos) << text;
  EXPECT_NE(text.find("21 blocks = 3 full contexts"), std::string::npos) << text;
  const std::string tight = serve_budget_text(s, a, d, std::nullopt, d.weights);
  EXPECT_NE(tight.find("= 0 sequences: the model does not fit"), std::string::npos) << tight;
}

TEST(ServeBudget, RefusesImpossibleSpecsByName) {
  auto message = [](ServeBudgetSpec s) {
    try {
      serve_budget_analytic(s);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ServeBudgetSpec s = tiny_spec(DType::F32);
  s.context = 201;
  EXPECT_EQ(message(s),
            "[serve budget] context 201 outside [1, 200] (the model's max_position_embeddings)");
  s = tiny_spec(DType::F32);
  s.max_batch_tokens = 2;
  EXPECT_EQ(message(s),
            "[serve budget] max_batch_tokens 2 must hold one decode row per sequence (3)");
  s = tiny_spec(DType::F32);
  s.num_blocks = 6;
  EXPECT_EQ(message(s),
            "[serve budget] a pool of 6 blocks cannot hold one context of 100 (7 "
            "blocks)");
}

}  // namespace
}  // namespace kiln::serve
