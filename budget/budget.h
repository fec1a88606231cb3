// Memory budgets for training and inference (`kiln budget`), three ways:
//   analytic  closed-form formulas per category (docs/memory.md derives them);
//   dry run   the real training step, or prefill + decode, run on the meta
//             device: the same allocation decisions, no memory, exact for kiln;
//   measured  the same code on a real device, reading its tracker; on a CUDA
//             device also the driver's figure, for the Runtime (CUDA context,
//             cuBLASLt/cuDNN) and Unattributed rows.
// Figures are bytes at the moment of the global peak, per row, plus each
// category's own peak.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/config.h"
#include "models/decoder.h"
#include "models/gguf_model.h"
#include "tensor/memory.h"

namespace kiln::models {

enum class BudgetMode { Train, Infer };
std::string_view budget_mode_name(BudgetMode m);

// Rows of the report, in display order. All but Slack are tracker categories.
enum class BudgetRow : int {
  Weights,
  MasterWeights,
  Gradients,
  OptimizerState,
  Activations,
  KVCache,
  Temporaries,
  Logits,
  Inputs,
  Runtime,       // tracker's Runtime category (RoPE tables); measured on CUDA, plus the context
                 // and the cuBLASLt/cuDNN handles and workspaces
  Slack,         // allocator slack: reserved minus allocated
  Unattributed,  // measured on CUDA: driver used - kiln reserved - runtime (the goal is 0)
  Count
};
inline constexpr std::size_t kNumBudgetRows = static_cast<std::size_t>(BudgetRow::Count);
// Largest --nproc the budget accepts (a sanity bound: shards of small tensors are empty long
// before it).
inline constexpr int kMaxBudgetRanks = 1 << 16;
inline constexpr int kMaxZeroStage = 3;
std::string_view budget_row_name(BudgetRow r);
// The row a tracker category is reported in.
BudgetRow budget_row_of(MemCategory c);

using RowBytes = std::array<std::int64_t, kNumBudgetRows>;

struct BudgetSpec {
  ModelConfig cfg;
  BudgetMode mode = BudgetMode::Train;
  std::int64_t batch = 1;
  std::int64_t seq = 256;  // training: tokens per row; inference: prompt (prefill) tokens
  std::int64_t context =
      0;  // inference: KV-cache capacity; 0: seq + decode_steps, at most max_seq_len
  std::int64_t decode_steps = 32;  // inference: one-token steps after the prefill
  DType dtype = DType::F32;        // weights and activations (bf16: AdamW keeps f32 masters)
  // Inference: the weights as a GGUF file of this scheme holds them and kiln keeps them
  // (models/gguf_model.h: the Linear weights and the token embedding in GGML blocks, the rest in
  // dtype); F32 means float weights in dtype. Training takes float weights only.
  GgufScheme weights = GgufScheme::F32;
  bool adamw = true;       // else SGD with momentum 0.9 (one f32 buffer per parameter)
  bool recompute = false;  // per-layer activation checkpointing (training)
  // Training: the LM head + loss's chunks of rows (DecoderModel::loss_chunk_rows; 0: the logits
  // whole, then the loss).
  std::int64_t loss_chunk_rows = DecoderModel::kDefaultLossChunkRows;
  // Whose allocator the dry run and the analytic model charge for: CPU rounds
  // every block up to 64 bytes, the CUDA caching allocator to 512.
  DeviceType simulate = DeviceType::CPU;
  // Training on `nproc` data-parallel ranks: `batch` is the global batch and each rank runs
  // batch / nproc rows. ZeRO shards each parameter's flat elements with dist::shard_range:
  //   0  every rank holds everything (plain data parallel);
  //   1  AdamW m, v (SGD momentum) and the f32 masters: shards;
  //   2  also the gradients: shards, plus one full-gradient bucket of the largest parameter,
  //      modelled as held through the whole step;
  //   3  also the weights: shards, plus one gathered unit (a decoder layer, or one parameter
  //      outside the layers, whichever is largest) as one flat buffer held through the step.
  // The figures are rank `rank`'s; shard_range gives rank 0 the largest shard of every
  // parameter, so rank 0's are the max over ranks. ZeRO-2 and 3 are what-ifs: the trainer
  // implements 0 and 1.
  int nproc = 1;
  int zero = 0;
  int rank = 0;

  std::int64_t local_batch() const { return mode == BudgetMode::Train ? batch / nproc : batch; }

  std::int64_t kv_capacity() const {
    return context > 0 ? context : std::min(seq + decode_steps, std::max(cfg.max_seq_len, seq));
  }
  // Decode steps that fit the cache after the prefill.
  std::int64_t decodes() const;
  // Checks sizes against the config (context, max_seq_len); fails with a message.
  void validate() const;
};

struct BudgetFigures {
  RowBytes at_peak{};           // breakdown at the moment of the global peak
  RowBytes peak{};              // each row's own peak (at its own moment)
  std::int64_t total_peak = 0;  // allocated bytes at the global peak (slack not included)
  Phase peak_phase = Phase::Idle;
  std::string peak_label;          // op or layer running at the peak
  std::vector<MemEvent> timeline;  // with run_budget(..., timeline = true)
  double seconds = 0;              // wall time of the run
  // Measured on CUDA: the device as the driver saw it at the end of the run, with the
  // allocator's segments still cached (so at the reserved peak). Its runtime() is in the
  // Runtime row and its unattributed() is the Unattributed row.
  std::optional<DeviceMemoryRows> device;
};

// Bytes of an inference model's parameters as the allocator of `simulate` charges them, one
// allocation per tensor: float in dtype, or (scheme other than F32) the Linear weights and the
// token embedding in the GGML blocks the scheme gives them (models/gguf_model.h), as
// load_gguf_model keeps a file of that scheme. Exact, as the dry run allocates.
std::int64_t stored_weight_bytes(const ModelConfig& c, GgufScheme scheme, DType dtype,
                                 DeviceType simulate);

// The model an inference budget runs: seeded random float weights in dtype, or (weights other
// than F32) the layout load_gguf_model gives a file of that scheme (zero_model_as_stored). On
// the meta device the quantized model's float skeleton leaves no trace in the peaks or the
// simulated cache.
std::unique_ptr<DecoderModel> inference_model(const ModelConfig& c, GgufScheme weights, DType dtype,
                                              Device device);

// Closed-form model of the dry run (see docs/memory.md). Weights, master
// weights, gradients, optimizer state, KV cache, inputs and runtime are exact
// (per-tensor allocator rounding included); activations, temporaries and
// logits at the peak follow the saved-tensor accounting of autograd/ops_*.cpp.
BudgetFigures analytic_budget(const BudgetSpec& s);

// The analytic model describes a backend that computes the budget's dtype natively (no f32
// copies of bf16 tensors). True when the simulated backend's kernel table has native kernels for
// it (every kernel that any backend takes in that dtype); false for bf16 on a CPU that still
// converts some ops (today all but the GEMMs), whose dry run charges the f32 conversions.
bool simulates_native_dtype(const BudgetSpec& s);

// Whether the simulated backend's GEMMs in s.dtype declare library scratch that the analytic
// model leaves out (the CPU's bf16 GEMMs: oneDNN's user-managed scratchpad, or the widening
// blocks below AMX). The dry run and a real run charge it to Temporaries.
bool gemm_scratch_unmodelled(const BudgetSpec& s);

// Runs the workload on `device` and reads that device's tracker, as deltas
// from a baseline taken before the model is built (everything is created and
// freed inside). Training: one steady-state step as models/trainer.cpp does it
// (gradients already exist from the previous step): forward + loss, backward,
// clip_grad_norm, optimizer step, zero_grad; on rank s.rank's local batch, with its ZeRO shards
// (the optimizer updates each parameter's dist::shard_range shard; ZeRO-2's gradients alias one
// bucket, ZeRO-3's weights one gathered unit, and the full weights ZeRO-3 never holds are built
// before the baseline). Inference: KV cache of
// kv_capacity() positions, prefill of `seq` tokens, then decodes() one-token
// steps, each under Prefill/Decode phases as models/sampling.cpp does.
// Device::meta() is the dry run (rounding as s.simulate); a CPU or a CUDA
// device is measured (compare a CUDA measurement with simulate = CUDA). Each
// run starts from an empty allocator cache, so slack is the run's own.
BudgetFigures run_budget(const BudgetSpec& s, Device device, bool timeline = false);

// The largest batch (at s.seq / s.kv_capacity()) and the largest sequence
// (training) or context (inference, at s.batch) whose dry-run peak fits in
// `limit` bytes; 0 when even 1 does not fit. The analytic model brackets the
// search and the dry run decides, so the answer is exact for kiln.
struct FitResult {
  std::int64_t max_batch = 0;
  std::int64_t max_seq = 0;  // training: seq; inference: context
  std::int64_t limit = 0;
};
FitResult fit_budget(const BudgetSpec& s, std::int64_t limit);

// "80GiB", "24GB", "512 MiB", "1.5e9", "4096" -> bytes. Fails on anything else.
std::int64_t parse_bytes(std::string_view text);

// One mode's report: the spec and its three columns.
struct BudgetReport {
  BudgetSpec spec;
  BudgetFigures analytic, dry;
  std::optional<BudgetFigures> measured;
  std::optional<FitResult> fit;
};

std::string budget_report_text(const std::vector<BudgetReport>& reports);
nlohmann::json budget_report_json(const std::vector<BudgetReport>& reports);
// Two charts: stacked bars by row for each report (training vs inference),
// and the timeline of `timeline` (one training step) by category.
std::string budget_svg(const std::vector<BudgetReport>& reports,
                       const std::vector<MemEvent>& timeline);

}  // namespace kiln::models
