// The training loop behind `kiln train`: data, model, AdamW with cosine LR,
// clipping, periodic validation on the held-out tail, JSONL log, progress bar,
// checkpoints and bit-exact resume; on the CPU or a CUDA device, with tokens/s
// and model FLOPs utilization (MFU) per log line.
//
// On CUDA the model, the optimizer state and each batch live on the device; the
// default dtype there is bf16 (bf16 weights and activations, f32 master weights
// and AdamW moments), f32 is the checking mode. Timers are read after a device
// synchronize. Checkpoints have one format everywhere (f32 weights = the masters,
// f32 moments): a CUDA run writes and resumes them through a CPU copy.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "models/checkpoint.h"
#include "tensor/memory.h"

namespace kiln::models {

struct TrainOptions {
  std::string data_path;
  std::string tokenizer = "char";  // char | byte | llama2c:PATH
  std::string preset = "shakespeare-char";
  // --device, --dtype and --attention as given: recorded in the checkpoint's args. The run uses
  // the Device, DType and attention kernel its caller resolved from them (apps/flags.h).
  std::string device = "auto";     // auto (cuda when a GPU is visible, else cpu) | cpu | cuda[:N]
  std::string dtype = "auto";      // auto (bf16 on cuda, f32 on cpu) | f32 | bf16
  std::string attention = "kiln";  // CUDA attention kernel: kiln | cudnn
  double peak_tflops = 0;          // MFU denominator; 0: bf16_peak_tflops(the GPU's name)
  // Defaults: shakespeare-char on 2 CPU cores, ~3M tokens in about 5 minutes.
  std::int64_t batch = 16;
  std::int64_t seq = 128;
  std::int64_t steps = 1500;
  double lr = 1e-3;
  double min_lr = 1e-4;
  std::int64_t warmup = 100;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double clip = 1.0;
  std::int64_t eval_interval = 250;
  std::int64_t eval_batches = 20;
  std::int64_t log_interval = 10;
  std::int64_t ckpt_interval = 0;  // 0: checkpoint only at the end
  std::string out_dir = "runs/default";
  bool resume = false;  // continue from out_dir/ckpt.h5
  std::uint64_t seed = 1337;
  bool recompute = false;
  double time_limit_s = 0;   // 0: none; else stop after this much training time
  std::int64_t stop_at = 0;  // 0: none; else stop (and checkpoint) at this step
  int progress = -1;         // -1: when stderr is a terminal
  int threads = 0;           // 0: OpenMP default
  std::string mem_timeline;  // if set: JSON lines of every allocation in the first step

  nlohmann::json to_json() const;
};

struct TrainResult {
  std::int64_t steps_done = 0;
  double final_train_loss = 0;
  double final_val_loss = 0;
  double best_val_loss = 0;
  double train_seconds = 0;
  double tokens_per_second = 0;
  double flops_per_token = 0;  // train_flops_per_token(cfg, seq)
  double peak_tflops = 0;      // the MFU denominator used (0: unknown)
  double mfu = 0;              // fraction of peak_tflops (0 when unknown)
  std::string device;          // "cpu", "cuda:0"
  std::string device_name;     // the GPU's name on CUDA
  std::string dtype;
  MemStats memory;                                // the run's device tracker
  std::optional<DeviceMemoryRows> device_memory;  // CUDA: runtime and unattributed rows
  std::string checkpoint;
};

// Trains on `device` in `dtype` (bf16: f32 masters and moments), with whatever attention kernel
// is set (ops::set_attention_impl).
TrainResult train(const TrainOptions& o, Device device, DType dtype, std::ostream& log);

// Mean loss over n batches of the sampler's data (no grad), on the model's device.
double evaluate(DecoderModel& model, std::span<const std::int32_t> tokens, std::int64_t batch,
                std::int64_t seq, std::int64_t n_batches, std::uint64_t seed);

}  // namespace kiln::models
