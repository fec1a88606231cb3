// The training loop behind `kiln train`: data, model, AdamW with cosine LR,
// clipping, periodic validation on the held-out tail, JSONL log, progress bar,
// checkpoints and bit-exact resume; on the CPU or a CUDA device, with tokens/s
// and model FLOPs utilization (MFU) per log line.
//
// A Trainer owns one run and splits it into its parts: step() is one optimizer
// step on one batch and logs nothing, so a data-parallel trainer can put its
// gradient all-reduce between backward and the update, and let only rank 0 call
// log_step(), evaluate() and save(). run() is the whole loop; train() runs it.
//
// On CUDA the model, the optimizer state and each batch live on the device; the
// default dtype there is bf16 (bf16 weights and activations, f32 master weights
// and AdamW moments), f32 is the checking mode. Timers are read after a device
// synchronize. Checkpoints have one format everywhere (f32 weights = the masters,
// f32 moments): a CUDA run writes and resumes them through a CPU copy.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <utility>

#include "distributed/communicator.h"
#include "models/checkpoint.h"
#include "models/data.h"
#include "nn/data_parallel.h"
#include "nn/optim.h"
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
  std::string attention = "auto";  // CUDA attention kernel: auto | kiln | cudnn
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
  double eps = 1e-8;
  double clip = 1.0;
  // A step whose loss or gradient norm is not finite is skipped (no update); this many in a row
  // stop the run with an error before any checkpoint is written.
  std::int64_t max_nonfinite_steps = 5;
  std::int64_t eval_interval = 250;
  std::int64_t eval_batches = 20;
  std::int64_t log_interval = 10;
  std::int64_t ckpt_interval = 0;  // 0: checkpoint only at the end
  std::string out_dir = "runs/default";
  bool resume = false;  // continue from out_dir/ckpt.h5
  std::uint64_t seed = 1337;
  bool recompute = false;
  // The LM head and the loss in chunks of this many rows where that holds less than the whole
  // (N, V) logits (DecoderModel::loss_chunk_rows); 0: the logits whole.
  std::int64_t loss_chunk_rows = DecoderModel::kDefaultLossChunkRows;
  double time_limit_s = 0;  // 0: none; else stop after this much training time
  // With time_limit_s: from the end of the warm-up, and again at every evaluation, `steps` becomes
  // what fits the limit at the step time measured so far (fitted_steps), so that the learning
  // rate's cosine ends by the limit instead of being cut off mid-decay on a slower machine.
  bool fit_time_limit = false;
  std::int64_t stop_at = 0;  // 0: none; else stop (and checkpoint) at this step
  int progress = -1;         // -1: when stderr is a terminal
  int threads = 0;           // 0: OpenMP default
  std::string mem_timeline;  // if set: JSON lines of every allocation in the first step
  // Data parallel (a world of more than one rank, `mpirun -np N kiln train`): `batch` is the
  // global batch, split evenly over the ranks (rank r takes rows [r B/N, (r+1) B/N) of every
  // global batch, so the run sees the batches a single process would).
  int zero = 0;          // 0: gradients all-reduced; 1: ZeRO-1, AdamW state sharded
  double bucket_mb = 4;  // gradient bucket size in MiB
  bool overlap = true;   // start each bucket's collective during backward

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
  MemStats memory;                                // the run's device tracker, this rank's
  std::optional<MemStats> memory_max;             // data parallel: each figure's max over ranks
  int world = 1;                                  // ranks in the run
  std::optional<DeviceMemoryRows> device_memory;  // CUDA: runtime and unattributed rows
  std::string checkpoint;
};

// One optimizer step: what its log line and its log.jsonl record show.
struct StepStats {
  std::int64_t step = 0;  // steps done after it: the number the log shows
  double loss = 0;        // the batch's loss, before the update
  double lr = 0;
  double norm = 0;          // the global gradient norm, before clipping
  double ms = 0;            // wall time, the device's work included
  double comm_wait_ms = 0;  // data parallel: waiting for gradient buckets after backward
  bool skipped = false;     // loss or norm not finite: no update was made
  double tok_per_s = 0;
  double mfu = 0;                 // 0 when the peak is unknown
  bool timeline_written = false;  // its allocations went to TrainOptions::mem_timeline
};

// The steps a run limited to `limit` seconds of training can plan for, when `done` steps took
// `secs`: done plus 95% (a margin for the machine's variation) of what the rest of the limit holds
// at that rate, at most `planned` and at least done + 1.
std::int64_t fitted_steps(std::int64_t done, double secs, double limit, std::int64_t planned);

class Trainer {
 public:
  // Reads and tokenizes the data, builds the model and AdamW on `device` in `dtype` (bf16: f32
  // masters and moments), resumes from out_dir/ckpt.h5 when o.resume, and logs the run's header.
  // The attention kernel is whatever ops::set_attention_impl set.
  // The ranks are `comm`'s (nullptr: dist::world(), a world of one unless under mpirun); only
  // rank 0 logs, evaluates and writes files.
  Trainer(const TrainOptions& o, Device device, DType dtype, std::ostream& log,
          dist::Communicator* comm = nullptr);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  // One optimizer step on the next batch: forward, backward, clip, AdamW, timed from an idle
  // device to an idle device. Logs nothing.
  StepStats step();
  // The step's log.jsonl record, its log line (the first step and every log_interval) and the
  // progress bar.
  void log_step(const StepStats& s);
  // Mean loss over eval_batches of the held-out tail; keeps the best, logs a line and a record.
  double evaluate();
  // out_dir/ckpt.h5: weights, AdamW state, step and data position; with `final`, also
  // out_dir/final.h5 (weights only).
  void save(bool final = false);
  // Loads out_dir/ckpt.h5 into the model and AdamW and continues at its step and data position.
  void resume();
  // Steps until `steps`, stop_at or the time limit, evaluating and checkpointing at their
  // intervals; then a last evaluation, the memory figures and the final checkpoints.
  TrainResult run();

  const TrainState& state() const { return st_; }
  DecoderModel& model() { return *model_; }
  dist::Communicator& comm() { return *comm_; }

 private:
  void resume_from(const CheckpointMeta& meta);
  void clear_progress();
  void open_log(bool append);
  void write_log_record(const nlohmann::json& record);

  std::string world_text() const;  // "world N, global batch B": the end of every log line

  TrainOptions o_;
  std::int64_t planned_steps_ = 0;  // o_.steps as asked; fit_time_limit moves o_.steps under it
  void fit_steps_to_time_limit();
  Device device_;
  std::unique_ptr<dist::Communicator> own_comm_;  // NCCL over the MPI world, on CUDA
  dist::Communicator* comm_;
  std::ostream& log_;  // the caller's on rank 0, a null stream on the others
  std::string ckpt_path_, final_path_;
  TokenSplit split_;  // the token vectors that the samplers view
  TrainState st_;
  std::unique_ptr<DecoderModel> model_;
  std::unique_ptr<nn::AdamW> opt_;        // ZeRO-0 (null under ZeRO-1: dp_ shards it)
  std::unique_ptr<nn::DataParallel> dp_;  // world > 1 or ZeRO-1
  std::optional<BatchSampler> sampler_;
  // The last step's batch, freed when the next step starts or run()'s loop ends, as when the loop
  // held it in a local: an evaluation between steps still adds to it in the Inputs peak, so the
  // memory summary keeps its figures.
  std::pair<Tensor, Tensor> batch_;
  TrainResult res_;    // the run's constants (device, peak, ...); run() adds the outcome
  int jsonl_fd_ = -1;  // log.jsonl, O_APPEND: one write() per whole record line
  bool progress_ = false;
  MemoryTracker& tracker_;
  std::int64_t first_step_ = 0;  // the step this run started at: the one --mem-timeline records
  double train_secs_ = 0;
  double last_loss_ = 0;
  std::int64_t tokens_done_ = 0;
  std::int64_t nonfinite_run_ = 0;  // consecutive skipped steps
};

// Trainer(o, device, dtype, log).run().
TrainResult train(const TrainOptions& o, Device device, DType dtype, std::ostream& log,
                  dist::Communicator* comm = nullptr);

// Mean loss over n batches of the sampler's data (no grad), on the model's device.
double evaluate(DecoderModel& model, std::span<const std::int32_t> tokens, std::int64_t batch,
                std::int64_t seq, std::int64_t n_batches, std::uint64_t seed);

}  // namespace kiln::models
