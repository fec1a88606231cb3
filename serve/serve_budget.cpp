#include "serve/serve_budget.h"

#include <fmt/format.h>

#include "budget/budget.h"
#include "models/decoder.h"
#include "models/param_count.h"
#include "serve/batch_forward.h"
#include "serve/kv_pool.h"
#include "tensor/memory.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

namespace kiln::serve {

ServeBudgetSpec ServeBudgetSpec::resolved() const {
  ServeBudgetSpec s = *this;
  if (s.context == 0) s.context = s.cfg.max_seq_len;
  KILN_CHECK(s.context > 0 && s.context <= s.cfg.max_seq_len,
             "[serve budget] context {} outside [1, {}] (the model's max_position_embeddings)",
             s.context, s.cfg.max_seq_len);
  KILN_CHECK(s.seqs > 0 && s.seqs <= 4096, "[serve budget] seqs {} outside [1, 4096]", s.seqs);
  KILN_CHECK(s.block_size > 0 && s.block_size <= 4096,
             "[serve budget] block size {} outside [1, 4096]", s.block_size);
  KILN_CHECK(s.max_batch_tokens >= s.seqs,
             "[serve budget] max_batch_tokens {} must hold one decode row per sequence ({})",
             s.max_batch_tokens, s.seqs);
  if (s.num_blocks == 0) s.num_blocks = s.seqs * s.blocks_per_seq();
  KILN_CHECK(s.num_blocks >= s.blocks_per_seq(),
             "[serve budget] a pool of {} blocks cannot hold one context of {} ({} blocks)",
             s.num_blocks, s.context, s.blocks_per_seq());
  return s;
}

ServeBudget serve_budget_analytic(const ServeBudgetSpec& spec) {
  const ServeBudgetSpec s = spec.resolved();
  // One allocation per tensor, rounded up as the simulated allocator rounds it.
  const std::int64_t align = s.simulate == DeviceType::CUDA ? 512 : 64;
  auto r = [&](std::int64_t bytes) { return (bytes + align - 1) / align * align; };
  const auto e = static_cast<std::int64_t>(dtype_size(s.dtype));
  ServeBudget b;
  b.weights = models::stored_weight_bytes(s.cfg, s.weights, s.dtype, s.simulate);
  // Keys and values: one (num_blocks, block_size, Hkv, D) tensor each per layer.
  b.kv_pool =
      2 * s.cfg.n_layers * r(s.num_blocks * s.block_size * s.cfg.n_kv_heads * s.cfg.head_dim * e);
  // RoPE's cos and sin tables, (max_seq_len, D / 2) in f32.
  b.runtime = s.cfg.uses_rope() ? 2 * r(s.cfg.max_seq_len * (s.cfg.head_dim / 2) * 4) : 0;
  b.total = b.weights + b.kv_pool + b.runtime;
  return b;
}

ServeBudget serve_budget_run(const ServeBudgetSpec& spec, Device device) {
  const ServeBudgetSpec s = spec.resolved();
  KILN_CHECK(device.is_meta() || device.is_cpu(),
             "[serve budget] runs on meta (dry run) or cpu (measured), not {}", device.str());
  std::optional<MetaSimulatesScope> sim;
  if (device.is_meta()) sim.emplace(s.simulate);
  if (device.is_cpu()) empty_cpu_cache();
  // The block tables: a host tensor in every run (as the engine's), made before the baseline so
  // that a CPU run does not count it where the dry run cannot (a few hundred bytes).
  const std::int64_t per_seq = s.blocks_per_seq();
  Tensor tables = ops::zeros({s.seqs, per_seq}, DType::I32);
  for (std::int64_t i = 0; i < s.seqs * per_seq; ++i)
    tables.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % s.num_blocks);
  auto& tracker = MemoryTracker::get(device.type);
  const MemStats base = tracker.stats();
  auto delta = [&](const MemStats& st, MemCategory c) {
    const auto i = static_cast<std::size_t>(c);
    return st.current[i] - base.current[i];
  };
  ServeBudget b;
  {
    const std::unique_ptr<models::DecoderModel> built =
        models::inference_model(s.cfg, s.weights, s.dtype, device);
    const models::DecoderModel& model = *built;
    KvPool pool(s.cfg, s.num_blocks, s.block_size, s.dtype, device);
    const MemStats held = tracker.stats();
    b.weights = delta(held, MemCategory::Weights);
    b.kv_pool = delta(held, MemCategory::KVCache);
    b.runtime = delta(held, MemCategory::Runtime);
    // The largest iteration: every sequence decodes at the end of its context (the longest
    // attention span), and prompt rows fill the rest of max_batch_tokens.
    BatchRows rows;
    rows.tables = tables;
    for (std::int64_t i = 0; i < s.seqs; ++i) {
      rows.tokens.push_back(0);
      rows.seq.push_back(static_cast<std::int32_t>(i));
      rows.pos.push_back(static_cast<std::int32_t>(s.context - 1));
      rows.logits_rows.push_back(i);
    }
    for (std::int64_t j = 0; j < s.max_batch_tokens - s.seqs; ++j) {
      rows.tokens.push_back(0);
      rows.seq.push_back(0);
      rows.pos.push_back(static_cast<std::int32_t>(j % s.context));
    }
    tracker.reset_peaks();
    const std::int64_t before = tracker.stats().total;
    {
      MemoryScope scope(MemCategory::Activations);
      forward_rows(model, pool, rows);
    }
    b.activations = tracker.stats().total_peak - before;
    b.has_activations = true;
    b.total = (before - base.total) + b.activations;
  }
  return b;
}

std::string serve_budget_text(const ServeBudgetSpec& spec, const ServeBudget& analytic,
                              const ServeBudget& dry, const std::optional<ServeBudget>& measured,
                              std::int64_t memory, const std::string& measured_title) {
  const ServeBudgetSpec s = spec.resolved();
  const std::int64_t block_bytes = kv_block_bytes(s.cfg, s.block_size, s.dtype);
  std::string out = fmt::format(
      "serving budget: {} layers, {} kv heads x {} dims, {}{}; {} sequences x context {}; blocks "
      "of {} positions ({} bytes each, all layers, keys and values); {} blocks = {} full "
      "contexts\n",
      s.cfg.n_layers, s.cfg.n_kv_heads, s.cfg.head_dim, dtype_name(s.dtype),
      s.weights == models::GgufScheme::F32
          ? std::string()
          : fmt::format(" (weights {})", models::gguf_scheme_name(s.weights)),
      s.seqs, s.context, s.block_size, block_bytes, s.num_blocks,
      s.num_blocks / s.blocks_per_seq());
  out += fmt::format("{:<34}{:>14}{:>14}{:>14}\n", "", "analytic", "dry run",
                     measured ? measured_title : "");
  auto row = [&](const char* name, auto get, bool analytic_has) {
    out += fmt::format("{:<34}{:>14}{:>14}{:>14}\n", name,
                       analytic_has ? format_bytes(get(analytic)) : std::string("-"),
                       format_bytes(get(dry)), measured ? format_bytes(get(*measured)) : "");
  };
  row(
      "weights", [](const ServeBudget& b) { return b.weights; }, true);
  row(
      "KV pool", [](const ServeBudget& b) { return b.kv_pool; }, true);
  out += fmt::format("{:<34}{:>14}{:>14}{:>14}\n",
                     fmt::format("activations ({} rows/forward)", s.max_batch_tokens), "-",
                     format_bytes(dry.activations),
                     !measured                   ? ""
                     : measured->has_activations ? format_bytes(measured->activations)
                                                 : "-");
  row(
      "runtime (RoPE tables)", [](const ServeBudget& b) { return b.runtime; }, true);
  row(
      measured_title == "measured" ? "total at the peak" : "total (held now: allocated)",
      [](const ServeBudget& b) { return b.total; }, false);
  if (memory > 0) {
    const std::int64_t fixed = dry.weights + dry.activations + dry.runtime;
    const std::int64_t per_seq = s.blocks_per_seq() * block_bytes;
    const std::int64_t fit = memory > fixed ? (memory - fixed) / per_seq : 0;
    out += fmt::format(
        "in {}: ({} - weights {} - activations {} - runtime {}) / {} per sequence of context {} "
        "= {} sequences{}\n",
        format_bytes(memory), format_bytes(memory), format_bytes(dry.weights),
        format_bytes(dry.activations), format_bytes(dry.runtime), format_bytes(per_seq), s.context,
        fit, fit == 0 ? ": the model does not fit" : "");
  }
  return out;
}

}  // namespace kiln::serve
