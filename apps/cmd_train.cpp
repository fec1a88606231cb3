// kiln train: see models/trainer.h for the loop.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "apps/commands.h"
#include "apps/flags.h"
#include "distributed/communicator.h"
#include "models/config.h"
#include "models/trainer.h"

namespace kiln::apps {

Run add_train_command(CLI::App& app) {
  auto o = std::make_shared<models::TrainOptions>();
  auto overwrite = std::make_shared<bool>(false);
  std::string presets;
  for (auto& n : models::preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  app.add_option("--data", o->data_path, "Training text file (last 10% is held out for validation)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--tokenizer", o->tokenizer, "char | byte | llama2c:PATH/tokenizer.bin")
      ->capture_default_str();
  app.add_option("--preset", o->preset, "Model preset: " + presets)->capture_default_str();
  app.add_option("--device", o->device,
                 "auto (cuda when a GPU is visible, else cpu) | cpu | cuda[:N]")
      ->capture_default_str();
  app.add_option("--dtype", o->dtype,
                 "auto (bf16 on cuda and on CPUs with AVX512-BF16 or AMX, else f32: without "
                 "bf16 arithmetic f32 trains faster; printed with the reason) | bf16 (bf16 "
                 "weights/activations, f32 masters and moments, on either device) | f32 "
                 "(checking mode); f16 is refused (it would need loss scaling)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "f32", "fp32", "f16", "fp16"}));
  app.add_option("--attention", o->attention,
                 "CUDA attention: auto (cuDNN for training's shape, kiln's kernels for decode; "
                 "measured) | kiln | cudnn")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "kiln", "cudnn"}));
  app.add_option("--peak-tflops", o->peak_tflops,
                 "bf16 dense peak for MFU (default: from the GPU's name; H100 SXM 989.4, H100 "
                 "PCIe 756, H200 989.4)")
      ->check(real_in(0, 1e6));
  // Every numeric flag has a checked range (apps/flags.h): a bad value is refused by name
  // before anything runs, never trained on or divided by.
  constexpr std::int64_t kMaxSteps = 1'000'000'000'000;
  app.add_option("--batch", o->batch,
                 "Sequences per step (under mpirun: the global batch, split over the ranks)")
      ->capture_default_str()
      ->check(int_in(1, 1 << 20));
  app.add_option("--seq", o->seq, "Tokens per sequence (at most the model's context)")
      ->capture_default_str()
      ->check(int_in(1, models::kMaxPositions));
  app.add_option("--steps", o->steps, "Optimizer steps")
      ->capture_default_str()
      ->check(int_in(1, kMaxSteps));
  app.add_option("--lr", o->lr, "Peak learning rate (cosine decay to --min-lr)")
      ->capture_default_str()
      ->check(real_in(0, 10, /*lo_open=*/true));
  app.add_option("--min-lr", o->min_lr, "Final learning rate")
      ->capture_default_str()
      ->check(real_in(0, 10));
  app.add_option("--warmup", o->warmup, "Linear warm-up steps")
      ->capture_default_str()
      ->check(int_in(0, kMaxSteps));
  app.add_option("--weight-decay", o->weight_decay, "AdamW weight decay (not on norms/biases)")
      ->capture_default_str()
      ->check(real_in(0, 10));
  app.add_option("--beta1", o->beta1, "AdamW beta1")->capture_default_str()->check(real_in(0, 1));
  app.add_option("--beta2", o->beta2, "AdamW beta2")->capture_default_str()->check(real_in(0, 1));
  app.add_option("--eps", o->eps, "AdamW epsilon")
      ->capture_default_str()
      ->check(real_in(0, 1, /*lo_open=*/true));
  app.add_option("--clip", o->clip, "Global gradient-norm clip (0: off)")
      ->capture_default_str()
      ->check(real_in(0, 1e6));
  app.add_option("--max-nonfinite-steps", o->max_nonfinite_steps,
                 "A step whose loss or gradient norm is NaN/inf is skipped (no update); stop "
                 "with an error after this many in a row, before any checkpoint is overwritten")
      ->capture_default_str()
      ->check(int_in(1, 1'000'000));
  app.add_option("--eval-interval", o->eval_interval, "Steps between validation runs (0: end only)")
      ->capture_default_str()
      ->check(int_in(0, kMaxSteps));
  app.add_option("--eval-batches", o->eval_batches, "Batches per validation run")
      ->capture_default_str()
      ->check(int_in(1, 1'000'000));
  app.add_option("--log-interval", o->log_interval, "Steps between log lines")
      ->capture_default_str()
      ->check(int_in(1, kMaxSteps));
  app.add_option("--ckpt-interval", o->ckpt_interval, "Steps between checkpoints (0: at the end)")
      ->capture_default_str()
      ->check(int_in(0, kMaxSteps));
  app.add_option("--out", o->out_dir, "Directory for ckpt.h5, final.h5 and log.jsonl")
      ->capture_default_str();
  app.add_flag("--resume", o->resume, "Continue bit-exactly from <out>/ckpt.h5");
  app.add_flag("--overwrite", *overwrite,
               "Start afresh even though --out holds a checkpoint (replaces it and log.jsonl)");
  app.add_option("--seed", o->seed, "Seed for weights and data order")
      ->capture_default_str()
      ->check(uint64_flag());
  app.add_flag("--recompute", o->recompute, "Per-layer activation checkpointing");
  app.add_option("--loss-chunk-rows", o->loss_chunk_rows,
                 "The LM head and the loss in chunks of this many rows, both gradients computed "
                 "in forward, where that holds less than the whole (batch x seq, vocab) logits; "
                 "0: the logits whole, then the loss")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--time-limit", o->time_limit_s, "Stop training after this many seconds (0: none)")
      ->capture_default_str()
      ->check(real_in(0, 1e9));
  app.add_flag("--fit-time-limit", o->fit_time_limit,
               "With --time-limit: after the warm-up and at every evaluation, plan only the steps "
               "that fit the limit at the measured step time, so the learning rate finishes its "
               "decay by the limit");
  app.add_option("--stop-at", o->stop_at, "Stop (and checkpoint) at this step; resume later")
      ->capture_default_str()
      ->check(int_in(0, kMaxSteps));
  app.add_option("--mem-timeline", o->mem_timeline,
                 "Write every allocation/free of the first step as JSON lines to this file");
  app.add_option(
         "--threads", o->threads,
         fmt::format("CPU threads (0: OpenMP default; capped at {} x the cores)", kThreadsPerCore))
      ->capture_default_str()
      ->check(int_in(0, 1 << 20));
  app.add_option("--zero", o->zero,
                 "Data parallel: 0 all-reduces gradients; 1 (ZeRO-1) also shards AdamW's m and v "
                 "(and bf16's f32 masters) over the ranks")
      ->capture_default_str()
      ->check(CLI::IsMember({0, 1}));
  app.add_option("--bucket-mb", o->bucket_mb,
                 "Data parallel: MiB of gradients per all-reduce bucket")
      ->capture_default_str()
      ->check(real_in(0, 65536, /*lo_open=*/true));
  app.add_option("--overlap", o->overlap,
                 "Data parallel: 1 starts each bucket's all-reduce during backward, 0 after it")
      ->capture_default_str();
  app.footer(
      "Data parallel: launch one process per rank with MPI; --batch is the global batch, split "
      "evenly over the ranks, and rank 0 logs, evaluates and writes checkpoints:\n"
      "  mpirun -np 2 kiln train --preset stories15M --tokenizer llama2c:tokenizer.bin --data "
      "tinystories.txt --threads 1\n"
      "(as root add --allow-run-as-root). On GPUs run one rank per GPU (mpirun -np <GPUs per host> "
      "... --device cuda): gradients then travel over NCCL, bootstrapped through MPI. Without "
      "mpirun, kiln train is one process and needs no MPI at run time. A lost rank ends the others "
      "with an error naming it (KILN_DIST_TIMEOUT_S, default 600 s, bounds every wait).");
  app.add_option("--progress", o->progress,
                 "Progress bar: 1 on, 0 off, -1 when stderr is a terminal")
      ->capture_default_str()
      ->check(int_in(-1, 1));
  return [o, overwrite] {
    o->threads = cap_threads(o->threads, "train");
    // A fresh run would replace another run's checkpoint and truncate its log: refuse unless
    // asked. (The library's Trainer leaves this to its caller, as tests reuse folders.)
    namespace fs = std::filesystem;
    if (!o->resume && !*overwrite)
      for (const char* name : {"ckpt.h5", "final.h5"}) {
        const fs::path p = fs::path(o->out_dir) / name;
        KILN_CHECK(!fs::exists(p),
                   "[train] --out {} already holds a checkpoint ({}); continue it with --resume, "
                   "or replace it with --overwrite",
                   o->out_dir, p.string());
      }
    const Device device = resolve_device(o->device, "train");
    const DTypeChoice dtype_choice = choose_train_dtype(o->dtype, device);
    const DType dtype = dtype_choice.dtype;
    if (!dtype_choice.why.empty() && dist::world().rank() == 0)
      std::cout << fmt::format("dtype auto: {} ({})\n", dtype_name(dtype), dtype_choice.why);
    set_attention_from_flag(o->attention, "train");
    models::TrainResult r = models::train(*o, device, dtype, std::cout);
    if (dist::world().rank() != 0) return 0;  // rank 0 reports for the run
    const std::string mfu =
        r.mfu > 0 ? fmt::format("MFU {:.1f}% of {:g} TFLOP/s", 100.0 * r.mfu, r.peak_tflops)
                  : std::string("MFU n/a: unknown peak, pass --peak-tflops");
    std::cout << fmt::format(
        "done: {} steps in {:.1f} s ({:.0f} tok/s, {}) | final train loss {:.4f} | val loss "
        "{:.4f} | best val loss {:.4f}\ncheckpoint: {}\n\n",
        r.steps_done, r.train_seconds, r.tokens_per_second, mfu, r.final_train_loss,
        r.final_val_loss, r.best_val_loss, r.checkpoint);
    std::cout << format_memory_summary(
        r.memory,
        fmt::format("memory ({}{}{}), by category:", r.device,
                    r.device_name.empty() ? "" : ", " + r.device_name,
                    r.world > 1 ? fmt::format(", rank 0 of {}", r.world) : ""),
        r.device_memory ? &*r.device_memory : nullptr);
    if (r.memory_max)
      std::cout << format_memory_summary(
          *r.memory_max,
          fmt::format("memory ({}), the max over the {} ranks, by category:", r.device, r.world),
          nullptr);
    return 0;
  };
}

}  // namespace kiln::apps
