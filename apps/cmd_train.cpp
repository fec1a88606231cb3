// kiln train: see models/trainer.h for the loop.
#include <fmt/format.h>

#include <iostream>

#include "apps/commands.h"
#include "apps/flags.h"
#include "models/config.h"
#include "models/trainer.h"

namespace kiln::apps {

Run add_train_command(CLI::App& app) {
  auto o = std::make_shared<models::TrainOptions>();
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
                 "auto (bf16 on cuda: bf16 weights/activations, f32 masters and moments; f32 "
                 "on cpu) | bf16 | f32 (checking mode)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "f32", "fp32"}));
  app.add_option("--attention", o->attention, "CUDA attention kernel: kiln | cudnn")
      ->capture_default_str()
      ->check(CLI::IsMember({"kiln", "cudnn"}));
  app.add_option("--peak-tflops", o->peak_tflops,
                 "bf16 dense peak for MFU (default: from the GPU's name; H100 SXM 989.4, H100 "
                 "PCIe 756, H200 989.4)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", o->batch, "Sequences per step")->capture_default_str();
  app.add_option("--seq", o->seq, "Tokens per sequence (at most the model's context)")
      ->capture_default_str();
  app.add_option("--steps", o->steps, "Optimizer steps")->capture_default_str();
  app.add_option("--lr", o->lr, "Peak learning rate (cosine decay to --min-lr)")
      ->capture_default_str();
  app.add_option("--min-lr", o->min_lr, "Final learning rate")->capture_default_str();
  app.add_option("--warmup", o->warmup, "Linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", o->weight_decay, "AdamW weight decay (not on norms/biases)")
      ->capture_default_str();
  app.add_option("--beta2", o->beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--clip", o->clip, "Global gradient-norm clip (0: off)")->capture_default_str();
  app.add_option("--eval-interval", o->eval_interval, "Steps between validation runs")
      ->capture_default_str();
  app.add_option("--eval-batches", o->eval_batches, "Batches per validation run")
      ->capture_default_str();
  app.add_option("--log-interval", o->log_interval, "Steps between log lines")
      ->capture_default_str();
  app.add_option("--ckpt-interval", o->ckpt_interval, "Steps between checkpoints (0: at the end)")
      ->capture_default_str();
  app.add_option("--out", o->out_dir, "Directory for ckpt.h5, final.h5 and log.jsonl")
      ->capture_default_str();
  app.add_flag("--resume", o->resume, "Continue bit-exactly from <out>/ckpt.h5");
  app.add_option("--seed", o->seed, "Seed for weights and data order")->capture_default_str();
  app.add_flag("--recompute", o->recompute, "Per-layer activation checkpointing");
  app.add_option("--time-limit", o->time_limit_s, "Stop training after this many seconds (0: none)")
      ->capture_default_str();
  app.add_option("--stop-at", o->stop_at, "Stop (and checkpoint) at this step; resume later")
      ->capture_default_str();
  app.add_option("--mem-timeline", o->mem_timeline,
                 "Write every allocation/free of the first step as JSON lines to this file");
  app.add_option("--threads", o->threads, "CPU threads (0: OpenMP default)")->capture_default_str();
  app.add_option("--progress", o->progress,
                 "Progress bar: 1 on, 0 off, -1 when stderr is a terminal")
      ->capture_default_str();
  return [o] {
    const Device device = resolve_device(o->device, "train");
    const DType dtype = resolve_train_dtype(o->dtype, device);
    set_attention_from_flag(o->attention, "train");
    models::TrainResult r = models::train(*o, device, dtype, std::cout);
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
        fmt::format("memory ({}{}), by category:", r.device,
                    r.device_name.empty() ? "" : ", " + r.device_name),
        r.device_memory ? &*r.device_memory : nullptr);
    return 0;
  };
}

}  // namespace kiln::apps
