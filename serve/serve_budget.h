// The serving budget: what `kiln serve` holds before its first request, and how many sequences
// of a given context fit. Three columns, as `kiln budget`'s:
//   analytic  weights, the KV pool and the RoPE tables as the allocator charges them (per tensor,
//             rounded to its block): exact;
//   dry run   the model, the pool and one forward at the largest batch (max_batch_tokens rows:
//             every sequence's decode row at the end of its context, the rest prompt rows) on
//             the meta device, through the same code the server runs (serve/batch_forward.h);
//   measured  the same on the CPU, with real memory.
// Weights, the pool and the runtime agree exactly in all three (tests/serve/test_serve_budget.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "models/config.h"
#include "models/gguf_model.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace kiln::serve {

struct ServeBudgetSpec {
  models::ModelConfig cfg;
  DType dtype = DType::F32;
  // The weights as a GGUF file of this scheme holds them (models/gguf_model.h: Linear weights
  // and the token embedding in GGML blocks, the rest in dtype); F32: float weights in dtype.
  models::GgufScheme weights = models::GgufScheme::F32;
  std::int64_t seqs = 8;         // sequences decoding at once
  std::int64_t context = 0;      // positions per sequence (0: the model's max_seq_len)
  std::int64_t block_size = 16;  // positions per KV block
  std::int64_t num_blocks = 0;   // 0: seqs full contexts
  std::int64_t max_batch_tokens = 256;
  DeviceType simulate = DeviceType::CPU;  // the allocator a dry run models
  // Fills the zeros from the model and checks the rest (kiln::Error naming the field).
  ServeBudgetSpec resolved() const;
  std::int64_t blocks_per_seq() const { return (context + block_size - 1) / block_size; }
};

struct ServeBudget {
  std::int64_t weights = 0, kv_pool = 0;
  std::int64_t activations = 0;  // peak above weights + pool during the largest forward
  std::int64_t runtime = 0;      // RoPE tables and the like
  std::int64_t total = 0;        // weights + pool + activations + runtime at the peak
  bool has_activations = false;  // the analytic column does not model them
};

ServeBudget serve_budget_analytic(const ServeBudgetSpec& s);
// device: meta (the dry run) or cpu (measured).
ServeBudget serve_budget_run(const ServeBudgetSpec& s, Device device);

// The table; with `memory` > 0, how many sequences of the context fit in it beside the rest.
// `measured_title` heads the third column ("measured", or "held now" at a server's start-up).
std::string serve_budget_text(const ServeBudgetSpec& s, const ServeBudget& analytic,
                              const ServeBudget& dry, const std::optional<ServeBudget>& measured,
                              std::int64_t memory, const std::string& measured_title = "measured");

}  // namespace kiln::serve
