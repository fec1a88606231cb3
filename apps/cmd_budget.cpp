// kiln budget: memory for training and inference, per category, three columns
// (analytic formula, meta-device dry run, optionally a measured run) with
// deltas, the breakdown at the global peak, what fits in --gpu-mem, and
// --json / --svg output (budget/budget.h). Training on --nproc ranks under
// --zero 0..3 reports one rank's figures (rank 0, the largest shards).
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/flags.h"
#include "budget/budget.h"
#include "models/gguf_model.h"
#include "models/io/gguf.h"
#include "models/param_count.h"
#include "serve/serve_budget.h"

namespace kiln::apps {

namespace {

struct BudgetOptions {
  std::string model, mode = "both", dtype = "fp32", optimizer = "adamw", gpu_mem, svg;
  std::string weights = "float";  // inference: float | q8_0 | q4_k_m
  std::string simulate;           // "": cuda when measuring on cuda, else cpu
  std::string device = "cpu";
  std::int64_t batch = 1, seq = 256, context = 0, decode = 32, nproc = 1, zero = 0;
  bool recompute = false, json = false, measure = false;
  std::int64_t loss_chunk_rows = models::DecoderModel::kDefaultLossChunkRows;
  bool serve = false;  // the serving budget (serve/serve_budget.h)
  std::int64_t seqs = 8, block_size = 16, max_batch_tokens = 256;
};

}  // namespace

Run add_budget_command(CLI::App &app) {
  auto o = std::make_shared<BudgetOptions>();
  std::string presets;
  for (auto &n : models::preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  app.add_option(
         "--model", o->model,
         "Preset (" + presets + "), a config.json, a Hugging Face model folder, or a GGUF file")
      ->required();
  app.add_option("--mode", o->mode, "train | infer | both (side by side)")
      ->check(CLI::IsMember({"train", "infer", "both"}));
  CLI::Option *batch =
      app.add_option("--batch", o->batch,
                     "Batch size (default 1). With --nproc N: the global batch, split evenly over "
                     "the ranks (default N, one row per rank)")
          ->check(int_in(1, 1 << 20));
  app.add_option("--nproc", o->nproc,
                 "Training: data-parallel ranks (mpirun -np N); figures are per rank, on "
                 "batch / N rows each, and rank 0's (the largest shards: the max over ranks)")
      ->check(int_in(1, models::kMaxBudgetRanks));
  app.add_option("--zero", o->zero,
                 "Training: ZeRO stage, what each rank shards with dist::shard_range. 0: nothing; "
                 "1: AdamW state and f32 masters; 2: also gradients (+ one full bucket, the "
                 "largest parameter's); 3: also weights (+ one gathered layer or other "
                 "parameter). 2 and 3 are what-ifs: the trainer runs 0 and 1")
      ->check(int_in(0, models::kMaxZeroStage));
  app.add_option("--seq", o->seq, "Training: tokens per row; inference: prompt tokens (prefill)")
      ->check(int_in(1, models::kMaxPositions));
  app.add_option("--context", o->context,
                 "Inference: KV-cache capacity (default: seq + decode steps)")
      ->check(int_in(0, models::kMaxPositions));
  app.add_option("--decode", o->decode, "Inference: one-token decode steps after the prefill")
      ->check(int_in(0, models::kMaxPositions));
  app.add_option("--dtype", o->dtype,
                 "Weights and activations: fp32 | bf16 (AdamW keeps f32 masters)")
      ->check(CLI::IsMember({"fp32", "f32", "bf16", "fp16", "f16"}));
  CLI::Option *weights =
      app.add_option("--weights", o->weights,
                     "Inference weights: float (in --dtype) | q8_0 | q4_k_m, as kiln holds a GGUF "
                     "file of that scheme (kiln quantize): Linear weights and the token embedding "
                     "in GGML blocks, the rest in --dtype (default: float, or a .gguf model's own "
                     "scheme). Training takes float weights (--mode both trains float beside the "
                     "quantized inference)")
          ->check(CLI::IsMember({"float", "q8_0", "q4_k_m"}));
  app.add_option("--optimizer", o->optimizer, "adamw | sgd (momentum 0.9)")
      ->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_flag("--recompute", o->recompute, "Per-layer activation recomputation (training)");
  app.add_option("--loss-chunk-rows", o->loss_chunk_rows,
                 "Training: the LM head and the loss in chunks of this many rows where that holds "
                 "less than the whole (N, V) logits; 0: the logits whole (as kiln train's flag)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option(
      "--gpu-mem", o->gpu_mem,
      "Memory to fit (per rank with --nproc), e.g. 80GiB, 24GB: largest batch (global, a "
      "multiple of --nproc) and seq or context");
  app.add_option("--simulate", o->simulate,
                 "Allocator the dry run charges like: cpu (64-byte blocks) | cuda (512-byte "
                 "blocks); default: cuda with --device cuda, else cpu")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--measure", o->measure,
               "Also run on --device and read its tracker (on cuda also the driver: runtime and "
               "unattributed rows)");
  app.add_option("--device", o->device, "Device --measure runs on: cpu | cuda[:N]")
      ->capture_default_str();
  app.add_flag("--serve", o->serve,
               "The serving budget (kiln serve): weights, the paged KV pool for --seqs sequences "
               "of --context, activations at --max-batch-tokens rows; with --gpu-mem, how many "
               "sequences fit");
  app.add_option("--seqs", o->seqs, "--serve: sequences decoding at once")
      ->capture_default_str()
      ->check(int_in(1, 4096));
  app.add_option("--block-size", o->block_size, "--serve: KV positions per block")
      ->capture_default_str()
      ->check(int_in(1, 4096));
  app.add_option("--max-batch-tokens", o->max_batch_tokens, "--serve: rows per forward pass")
      ->capture_default_str()
      ->check(int_in(1, 1 << 20));
  app.add_flag("--json", o->json, "Print JSON instead of the table");
  app.add_option("--svg", o->svg, "Write two charts (by category; training-step timeline) to FILE");
  return [o, batch, weights] {
    // A GGUF file's weights are budgeted as it stores them unless --weights says otherwise.
    const models::GgufScheme scheme = weights->count() == 0 && o->model.ends_with(".gguf")
                                          ? models::gguf_file_scheme(io::GgufFile(o->model))
                                      : o->weights == "float"
                                          ? models::GgufScheme::F32
                                          : models::parse_gguf_scheme(o->weights);
    // Measuring needs the device; without --measure, --device cuda only picks the simulated
    // allocator, which needs no GPU.
    const Device device = o->measure ? resolve_device(o->device, "budget") : [&] {
      try {
        return Device::parse(o->device);
      } catch (const Error &) {
        fail("[budget] unknown device '{}' (cpu, cuda or cuda:N)", o->device);
      }
    }();
    KILN_CHECK(!(device.is_cuda() && o->simulate == "cpu"),
               "[budget] --device {} measures the CUDA allocator: the dry run must simulate it "
               "too (drop --simulate cpu)",
               device.str());
    // BudgetSpec::validate checks --nproc and --zero against the mode and the batch.
    KILN_CHECK(!(o->nproc > 1 || o->zero > 0) || !o->measure,
               "[budget] --measure runs one process: per-rank figures under --nproc/--zero are "
               "measured by `mpirun -np {} kiln train ... --zero {}` (its memory summary)",
               o->nproc, std::min<std::int64_t>(o->zero, 1));
    if (o->serve) {
      KILN_CHECK(!device.is_cuda(),
                 "[budget] --serve --measure runs on the CPU; on CUDA, kiln serve prints its own "
                 "budget at start-up");
      KILN_CHECK(!o->json && o->svg.empty(), "[budget] --serve prints a table only");
      serve::ServeBudgetSpec ss;
      ss.cfg = models::resolve_model_config(o->model);
      ss.dtype = o->dtype == "bf16" ? DType::BF16 : DType::F32;
      ss.weights = scheme;
      ss.seqs = o->seqs;
      ss.context = o->context;
      ss.block_size = o->block_size;
      ss.max_batch_tokens = std::max(o->max_batch_tokens, o->seqs);
      ss.simulate = o->simulate == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
      const serve::ServeBudget analytic = serve::serve_budget_analytic(ss);
      const serve::ServeBudget dry = serve::serve_budget_run(ss, Device::meta());
      std::optional<serve::ServeBudget> measured;
      if (o->measure) measured = serve::serve_budget_run(ss, Device::cpu());
      std::cout << serve::serve_budget_text(
          ss, analytic, dry, measured, o->gpu_mem.empty() ? 0 : models::parse_bytes(o->gpu_mem));
      // The pool's figures must agree exactly.
      if (dry.kv_pool != analytic.kv_pool || (measured && measured->kv_pool != dry.kv_pool))
        return 2;
      return 0;
    }
    models::BudgetSpec base;
    base.cfg = models::resolve_model_config(o->model);
    base.batch = batch->count() == 0 ? o->nproc : o->batch;
    base.seq = o->seq;
    base.context = o->context;
    base.decode_steps = o->decode;
    base.dtype = o->dtype == "bf16"                          ? DType::BF16
                 : (o->dtype == "fp16" || o->dtype == "f16") ? DType::F16
                                                             : DType::F32;
    base.adamw = o->optimizer == "adamw";
    base.recompute = o->recompute;
    base.loss_chunk_rows = o->loss_chunk_rows;
    base.nproc = static_cast<int>(o->nproc);
    base.zero = static_cast<int>(o->zero);
    base.simulate = o->simulate == "cuda" || (o->simulate.empty() && device.is_cuda())
                        ? DeviceType::CUDA
                        : DeviceType::CPU;
    std::int64_t limit = o->gpu_mem.empty() ? 0 : models::parse_bytes(o->gpu_mem);

    std::vector<models::BudgetReport> reports;
    std::vector<MemEvent> timeline;
    for (auto mode : {models::BudgetMode::Train, models::BudgetMode::Infer}) {
      if (o->mode != "both" && o->mode != models::budget_mode_name(mode)) continue;
      models::BudgetReport r;
      r.spec = base;
      r.spec.mode = mode;
      // --mode both trains float weights beside the quantized inference; --mode train with
      // --weights is refused by BudgetSpec::validate, by name.
      if (mode == models::BudgetMode::Infer || o->mode == "train") r.spec.weights = scheme;
      r.analytic = models::analytic_budget(r.spec);
      bool want_timeline = !o->svg.empty() && mode == models::BudgetMode::Train;
      r.dry = models::run_budget(r.spec, Device::meta(), want_timeline);
      if (want_timeline) timeline = std::move(r.dry.timeline);
      if (o->measure) r.measured = models::run_budget(r.spec, device);
      if (limit > 0) r.fit = models::fit_budget(r.spec, limit);
      reports.push_back(std::move(r));
    }
    if (o->json)
      std::cout << models::budget_report_json(reports).dump(2) << "\n";
    else
      std::cout << models::budget_report_text(reports);
    if (!o->svg.empty()) {
      std::ofstream f(o->svg);
      KILN_CHECK(f.good(), "[budget] cannot write {}", o->svg);
      f << models::budget_svg(reports, timeline);
      if (!o->json) std::cout << fmt::format("charts written to {}\n", o->svg);
    }
    // Dry run and measured run must agree exactly: fail loudly if not.
    for (const auto &r : reports)
      if (r.measured && (r.measured->total_peak != r.dry.total_peak)) return 2;
    return 0;
  };
}

}  // namespace kiln::apps
