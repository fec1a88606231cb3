#include "models/trainer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "distributed/nccl_communicator.h"
#include "models/data.h"
#include "models/io/mapped_file.h"
#include "models/io/tokenizer.h"
#include "models/mfu.h"
#include "models/train_step.h"
#include "tensor/device_info.h"

namespace kiln::models {

namespace {

using Clock = std::chrono::steady_clock;

std::string with_commas(double v) {
  auto n = static_cast<std::int64_t>(std::llround(v));
  std::string s = std::to_string(n), out;
  int c = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (c && c % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++c;
  }
  return out;
}

void draw_progress(std::int64_t step, std::int64_t total, double loss, double secs) {
  const int width = 30;
  int filled = static_cast<int>(width * step / std::max<std::int64_t>(total, 1));
  double eta = step > 0 ? secs / static_cast<double>(step) * static_cast<double>(total - step) : 0;
  fmt::print(stderr, "\r[{}{}] {}/{} loss {:.4f} eta {:.0f}s ", std::string(filled, '#'),
             std::string(width - filled, '.'), step, total, loss, eta);
  std::fflush(stderr);
}

std::string mfu_text(double mfu) { return mfu > 0 ? fmt::format("{:.1f}%", 100.0 * mfu) : "n/a"; }

// Ranks other than 0 log nothing.
std::ostream& null_stream() {
  static std::ostream s(nullptr);  // no buffer: every write fails silently
  return s;
}

// Every figure of `m`, the largest over the ranks (a collective).
MemStats max_over_ranks(dist::Communicator& comm, const MemStats& m) {
  std::vector<double> v;
  for (auto x : m.current) v.push_back(static_cast<double>(x));
  for (auto x : m.peak) v.push_back(static_cast<double>(x));
  for (auto x : m.at_peak) v.push_back(static_cast<double>(x));
  for (auto x : {m.total, m.total_peak, m.reserved, m.reserved_peak, m.num_allocs, m.num_frees})
    v.push_back(static_cast<double>(x));
  const auto n = static_cast<std::int64_t>(v.size());
  Tensor mine = Tensor::empty({n}, DType::F64), all = Tensor::empty({n * comm.size()}, DType::F64);
  std::copy(v.begin(), v.end(), mine.data<double>());
  comm.all_gather(mine, all, std::vector<std::int64_t>(static_cast<std::size_t>(comm.size()), n));
  const double* a = all.data<double>();
  for (int q = 1; q < comm.size(); ++q)
    for (std::int64_t i = 0; i < n; ++i) v[i] = std::max(v[i], a[q * n + i]);
  MemStats out = m;
  std::size_t i = 0;
  for (auto& x : out.current) x = static_cast<std::int64_t>(v[i++]);
  for (auto& x : out.peak) x = static_cast<std::int64_t>(v[i++]);
  for (auto& x : out.at_peak) x = static_cast<std::int64_t>(v[i++]);
  for (std::int64_t* x : {&out.total, &out.total_peak, &out.reserved, &out.reserved_peak,
                          &out.num_allocs, &out.num_frees})
    *x = static_cast<std::int64_t>(v[i++]);
  return out;
}

// On --resume the checkpoint must exist and hold the optimizer state.
CheckpointMeta read_resume_meta(const std::string& ckpt_path) {
  KILN_CHECK(std::filesystem::exists(ckpt_path), "[train] --resume: no checkpoint at {}",
             ckpt_path);
  CheckpointMeta meta = read_checkpoint_meta(ckpt_path);
  KILN_CHECK(meta.has_optimizer, "[train] {} holds no optimizer state", ckpt_path);
  return meta;
}

}  // namespace

nlohmann::json TrainOptions::to_json() const {
  return {{"data", data_path},
          {"tokenizer", tokenizer},
          {"preset", preset},
          {"device", device},
          {"dtype", dtype},
          {"attention", attention},
          {"batch", batch},
          {"seq", seq},
          {"steps", steps},
          {"lr", lr},
          {"min_lr", min_lr},
          {"warmup", warmup},
          {"weight_decay", weight_decay},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"clip", clip},
          {"eval_interval", eval_interval},
          {"eval_batches", eval_batches},
          {"seed", seed},
          {"recompute", recompute},
          {"loss_chunk_rows", loss_chunk_rows}};
}

double evaluate(DecoderModel& model, std::span<const std::int32_t> tokens, std::int64_t batch,
                std::int64_t seq, std::int64_t n_batches, std::uint64_t seed) {
  NoGradGuard no_grad;
  bool was_training = model.is_training();
  model.eval();
  const Device device = model.device();
  BatchSampler s(tokens, batch, seq, seed);
  double sum = 0;
  for (std::int64_t i = 0; i < n_batches; ++i) {
    auto [x, y] = s.next();
    {
      MemoryScope inputs(MemCategory::Inputs);  // a copy only off the CPU
      x = x.to(device);
      y = y.to(device);
    }
    MemoryScope scope(MemCategory::Activations);
    PhaseScope phase(Phase::Forward);
    sum += model.loss(x, y).item();
  }
  model.train(was_training);
  return sum / static_cast<double>(std::max<std::int64_t>(n_batches, 1));
}

Trainer::Trainer(const TrainOptions& o, Device device, DType dtype, std::ostream& log,
                 dist::Communicator* comm)
    : o_(o),
      device_(device),
      comm_(dist::communicator_for(device, comm, own_comm_)),
      log_(comm_->rank() == 0 ? log : null_stream()),
      tracker_(MemoryTracker::get(device.type)) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  KILN_CHECK(o.peak_tflops >= 0, "[train] --peak-tflops must be >= 0");
  KILN_CHECK(o.steps > 0 && o.batch > 0 && o.seq > 0, "[train] steps, batch and seq must be > 0");
  KILN_CHECK(o.lr > 0 && o.min_lr >= 0 && o.min_lr <= o.lr,
             "[train] need 0 <= min_lr <= lr, lr > 0");
  // The command line checks each flag's range (apps/flags.h); a caller of the library gets the
  // same refusals here, by name, instead of a NaN checkpoint or a division by zero.
  auto finite_in = [](double v, double lo, double hi, const char* flag) {
    KILN_CHECK(std::isfinite(v) && v >= lo && v <= hi, "[train] {} {} is out of range [{}, {}]",
               flag, v, lo, hi);
  };
  finite_in(o.lr, 0, 10, "--lr");
  finite_in(o.weight_decay, 0, 10, "--weight-decay");
  finite_in(o.beta1, 0, 1, "--beta1");
  finite_in(o.beta2, 0, 1, "--beta2");
  finite_in(o.eps, 1e-30, 1, "--eps");
  finite_in(o.clip, 0, 1e6, "--clip");
  KILN_CHECK(o.log_interval >= 1, "[train] --log-interval {} must be >= 1", o.log_interval);
  KILN_CHECK(o.loss_chunk_rows >= 0, "[train] --loss-chunk-rows {} must be >= 0",
             o.loss_chunk_rows);
  KILN_CHECK(o.eval_batches >= 1, "[train] --eval-batches {} must be >= 1", o.eval_batches);
  KILN_CHECK(o.max_nonfinite_steps >= 1, "[train] --max-nonfinite-steps {} must be >= 1",
             o.max_nonfinite_steps);
  const int world = comm_->size();
  KILN_CHECK(o.batch % world == 0,
             "[train] --batch {} (the global batch) must be divisible by the {} ranks", o.batch,
             world);
  KILN_CHECK(o.zero == 0 || o.zero == 1,
             "[train] --zero {}: the trainer implements 0 and 1 (2 and 3 are `kiln budget` "
             "what-ifs)",
             o.zero);
  KILN_CHECK(std::isfinite(o.bucket_mb) && o.bucket_mb > 0 && o.bucket_mb <= 1 << 16,
             "[train] --bucket-mb {} is out of range (0, 65536]", o.bucket_mb);
  namespace fs = std::filesystem;
  fs::create_directories(o.out_dir);
  ckpt_path_ = (fs::path(o.out_dir) / "ckpt.h5").string();
  final_path_ = (fs::path(o.out_dir) / "final.h5").string();

  // Data and tokenizer. On resume the tokenizer comes from the checkpoint.
  std::string text = read_text_file(o.data_path);
  KILN_CHECK(!text.empty(), "[train] {} is empty", o.data_path);
  CheckpointMeta meta;
  if (o.resume) meta = read_resume_meta(ckpt_path_);
  auto tok = run_tokenizer(o.tokenizer, o.resume ? meta.state.tokenizer_data : "", text);
  split_ = split_tokens(tok->encode(text, false, false), 0.1);

  ModelConfig cfg = o.resume ? meta.config : preset(o.preset);
  if (!o.resume && (o.tokenizer == "char" || o.tokenizer == "byte"))
    cfg.vocab_size = tok->vocab_size();
  KILN_CHECK(tok->vocab_size() <= cfg.vocab_size,
             "[train] tokenizer has {} tokens but the model's vocab is {}", tok->vocab_size(),
             cfg.vocab_size);
  KILN_CHECK(o.seq <= cfg.max_seq_len, "[train] --seq {} exceeds the model's context of {}", o.seq,
             cfg.max_seq_len);
  // Both splits must hold a whole sequence plus its target before step 1: a validation split
  // found too small at the first evaluation would lose every step trained before it.
  KILN_CHECK(static_cast<std::int64_t>(split_.train.size()) > o.seq + 1,
             "[train] --data {}: the training split has {} tokens, too few for --seq {} (+1 for "
             "targets); give more data or a smaller --seq",
             o.data_path, split_.train.size(), o.seq);
  KILN_CHECK(static_cast<std::int64_t>(split_.val.size()) > o.seq + 1,
             "[train] --data {}: the validation split (the last 10%) has {} tokens, too few for "
             "--seq {} (+1 for targets); give more data or a smaller --seq",
             o.data_path, split_.val.size(), o.seq);

  st_.model_seed = o.seed;
  st_.data_seed = o.seed + 1;
  st_.tokenizer_spec = o.tokenizer;
  if (auto* ct = dynamic_cast<io::CharTokenizer*>(tok.get())) st_.tokenizer_data = ct->serialize();
  st_.args_json = o.to_json().dump();
  st_.best_val_loss = INFINITY;

  model_ = std::make_unique<DecoderModel>(cfg, o.seed, dtype, device);
  model_->recompute = o.recompute;
  model_->loss_chunk_rows = o.loss_chunk_rows;
  const nn::AdamWOptions adamw{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  if (o.zero == 0) opt_ = std::make_unique<nn::AdamW>(model_->named_parameters(), adamw);
  if (world > 1 || o.zero > 0) {
    // Every rank starts from the same weights: the same seed builds the same model, and a resumed
    // run loads the same file.
    const auto bucket_bytes = static_cast<std::int64_t>(o.bucket_mb * (1 << 20));
    dp_ = std::make_unique<nn::DataParallel>(
        *comm_, model_->named_parameters(), adamw,
        nn::DataParallelOptions{o.zero, bucket_bytes, o.overlap});
  }
  if (o.resume)
    resume_from(meta);
  else
    sampler_.emplace(split_.train, o.batch, o.seq, st_.data_seed, st_.data_position,
                     comm_->rank() * (o.batch / world), o.batch / world);

  res_.device = device.str();
  res_.dtype = std::string(dtype_name(dtype));
  res_.device_name = device_model_name(device);
  res_.flops_per_token = train_flops_per_token(cfg, o.seq);
  res_.peak_tflops = o.peak_tflops > 0 ? o.peak_tflops : bf16_peak_tflops(res_.device_name);

  // Mixed precision on either device: AdamW keeps f32 masters and moments (nn/optim.h).
  const char* masters = dtype == DType::F32 ? "" : " (f32 masters and moments)";
  log_ << fmt::format(
      "kiln train: {} | {} params | vocab {} | {} train / {} val tokens | batch {} x {} | {}\n",
      cfg.name, with_commas(static_cast<double>(model_->num_parameters())), cfg.vocab_size,
      with_commas(static_cast<double>(split_.train.size())),
      with_commas(static_cast<double>(split_.val.size())), o.batch, o.seq,
      fmt::format("{}, {}{}", describe_device(device), dtype_name(dtype), masters));
  log_ << fmt::format(
      "MFU: {:.3g} GFLOP per token (6N + 12 L H Dh T, N = {} matmul params) over {}\n",
      res_.flops_per_token / 1e9, with_commas(static_cast<double>(matmul_params(cfg))),
      res_.peak_tflops > 0 ? fmt::format("a {:.1f} TFLOP/s bf16 peak", res_.peak_tflops)
                           : std::string("an unknown peak (pass --peak-tflops)"));
  log_ << fmt::format("world {} ({}): global batch {} = {} x {} rows per rank{}\n", world,
                      comm_->backend(), o.batch, world, o.batch / world,
                      world > 1 || o.zero > 0
                          ? fmt::format(", ZeRO-{}, {:g} MiB gradient buckets{}", o.zero,
                                        o.bucket_mb, o.overlap ? " overlapping backward" : "")
                          : "");
  if (o.resume) log_ << fmt::format("resumed from {} at step {}\n", ckpt_path_, st_.step);

  if (comm_->rank() == 0) open_log(o.resume);
  progress_ = o.progress < 0 ? isatty(STDERR_FILENO) != 0 : o.progress != 0;
}

void Trainer::resume() { resume_from(read_resume_meta(ckpt_path_)); }

void Trainer::resume_from(const CheckpointMeta& meta) {
  // One path on every device (load_checkpoint reads into device tensors through the host). With
  // ZeRO-1 every rank reads the whole state and keeps its shards (a full copy while loading).
  if (o_.zero == 1) {
    std::unique_ptr<nn::Optimizer> full = dp_->empty_full_optimizer_state();
    load_checkpoint(ckpt_path_, *model_, full.get());
    dp_->scatter_optimizer_state(*full);
  } else {
    load_checkpoint(ckpt_path_, *model_, opt_.get());
  }
  st_.step = meta.state.step;
  st_.data_position = meta.state.data_position;
  st_.data_seed = meta.state.data_seed;
  st_.best_val_loss = meta.state.best_val_loss;
  first_step_ = st_.step;
  const int world = comm_->size();
  sampler_.emplace(split_.train, o_.batch, o_.seq, st_.data_seed, st_.data_position,
                   comm_->rank() * (o_.batch / world), o_.batch / world);
}

StepStats Trainer::step() {
  batch_ = {};  // the last step's (see batch_)
  const bool record_timeline = !o_.mem_timeline.empty() && st_.step == first_step_;
  if (record_timeline) {
    tracker_.reset_peaks();
    tracker_.set_timeline(true);
  }
  synchronize(device_);  // the timer starts when the device is idle
  auto t0 = Clock::now();
  StepStats s;
  s.lr = nn::cosine_lr(st_.step, o_.warmup, o_.steps, o_.lr, o_.min_lr);
  nn::Optimizer& opt = opt_ ? static_cast<nn::Optimizer&>(*opt_) : dp_->shard_optimizer();
  opt.lr = s.lr;
  batch_ = sampler_->next();
  auto& [x, y] = batch_;
  {
    MemoryScope inputs(MemCategory::Inputs);  // a copy only off the CPU
    x = x.to(device_);
    y = y.to(device_);
  }
  // Every rank sees the same loss (the global batch's: the mean of the ranks' equal shares) and
  // norm, so all skip a non-finite step together (run() stops after max_nonfinite_steps).
  const bool zero1 = o_.zero == 1;
  TrainStepParts parts;
  if (dp_) {
    // Each bucket's all-reduce (or reduce-scatter) starts as soon as its gradients are final.
    parts.grad_ready = dp_->grad_ready_hook();
    parts.after_backward = [&] { s.comm_wait_ms = dp_->finish_backward().wait_ms; };
  }
  parts.reduce_loss = [&](double l) { return comm_->all_reduce_scalar(l, dist::ReduceOp::Avg); };
  parts.clip = [&] {
    return zero1 ? dp_->clip_grad_norm(o_.clip) : nn::clip_grad_norm(model_->parameters(), o_.clip);
  };
  parts.update = [&] { zero1 ? dp_->step() : opt_->step(); };
  parts.zero_grad = [&] { zero1 ? dp_->zero_grad() : opt_->zero_grad(); };
  const TrainStepResult r = run_train_step(*model_, x, y, parts);
  s.loss = r.loss;
  s.norm = r.norm;
  s.skipped = r.skipped;
  synchronize(device_);
  st_.step++;
  st_.data_position = sampler_->position();
  if (record_timeline) {
    tracker_.dump_timeline(o_.mem_timeline);
    tracker_.set_timeline(false);
    s.timeline_written = true;
  }
  s.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  train_secs_ += s.ms / 1000.0;
  tokens_done_ += o_.batch * o_.seq;  // the global batch
  last_loss_ = s.loss;
  s.step = st_.step;
  s.tok_per_s = static_cast<double>(o_.batch * o_.seq) / (s.ms / 1000.0);
  s.mfu = model_flops_utilization(s.tok_per_s, res_.flops_per_token, res_.peak_tflops);
  return s;
}

void Trainer::log_step(const StepStats& s) {
  if (s.timeline_written)
    log_ << fmt::format("memory timeline of step {} written to {}\n", s.step, o_.mem_timeline);
  nlohmann::json rec{{"step", s.step}, {"loss", s.loss},           {"lr", s.lr},  {"norm", s.norm},
                     {"ms", s.ms},     {"tok_per_s", s.tok_per_s}, {"mfu", s.mfu}};
  if (dp_) {
    rec["world"] = comm_->size();
    rec["global_batch"] = o_.batch;
    rec["comm_wait_ms"] = s.comm_wait_ms;
  }
  if (s.skipped) rec["skipped"] = true;
  write_log_record(rec);
  if (s.skipped) {
    clear_progress();
    log_ << fmt::format(
        "step {}/{} | loss {} | norm {} | not finite: step skipped, no update ({} in a row, "
        "stop at {})\n",
        s.step, o_.steps, s.loss, s.norm, nonfinite_run_, o_.max_nonfinite_steps);
    log_.flush();
  }
  if (s.step % o_.log_interval == 0 || s.step == 1) {
    clear_progress();
    log_ << fmt::format(
        "step {}/{} | loss {:.4f} | lr {:.2e} | norm {:.2f} | {:.1f} ms | {} tok/s | MFU {} | {}\n",
        s.step, o_.steps, s.loss, s.lr, s.norm, s.ms, with_commas(s.tok_per_s), mfu_text(s.mfu),
        world_text());
    log_.flush();
  }
  if (progress_ && comm_->rank() == 0) draw_progress(s.step, o_.steps, s.loss, train_secs_);
}

double Trainer::evaluate() {
  const double val =
      models::evaluate(*model_, split_.val, o_.batch, o_.seq, o_.eval_batches, o_.seed + 2);
  st_.best_val_loss = std::min(st_.best_val_loss, val);
  res_.final_val_loss = val;
  clear_progress();
  log_ << fmt::format("step {}/{} | val loss {:.4f} | best {:.4f} | {:.1f} s | {}\n", st_.step,
                      o_.steps, val, st_.best_val_loss, train_secs_, world_text());
  write_log_record({{"step", st_.step}, {"val_loss", val}, {"time_s", train_secs_}});
  return val;
}

// One path on every device: save_checkpoint copies device tensors to the host one at a time.
// With ZeRO-1 the shards are gathered first (on every rank: a collective), and rank 0 writes the
// file a single process would.
void Trainer::save(bool final) {
  std::unique_ptr<nn::Optimizer> gathered;
  if (o_.zero == 1) gathered = dp_->gather_optimizer_state();
  if (comm_->rank() != 0) return;
  save_checkpoint(ckpt_path_, *model_, gathered ? gathered.get() : opt_.get(), st_);
  if (final) save_checkpoint(final_path_, *model_, nullptr, st_);
}

std::int64_t fitted_steps(std::int64_t done, double secs, double limit, std::int64_t planned) {
  if (done <= 0 || secs <= 0) return planned;
  const double more = 0.95 * std::max(0.0, limit - secs) / (secs / static_cast<double>(done));
  const double fit = static_cast<double>(done) + std::floor(more);
  if (fit >= static_cast<double>(planned)) return planned;
  return std::max(done + 1, static_cast<std::int64_t>(fit));
}

// fit_time_limit: rank 0's measurement decides, so that every rank plans the same steps.
void Trainer::fit_steps_to_time_limit() {
  if (!o_.fit_time_limit || o_.time_limit_s <= 0) return;
  const std::int64_t start = std::max<std::int64_t>(o_.warmup, 20);
  const bool at_eval = o_.eval_interval > 0 && st_.step % o_.eval_interval == 0;
  if (st_.step < start || (st_.step != start && !at_eval)) return;
  const double mine = comm_->rank() == 0
                          ? static_cast<double>(fitted_steps(st_.step, train_secs_, o_.time_limit_s,
                                                             planned_steps_))
                          : 0.0;
  const auto fit = static_cast<std::int64_t>(comm_->all_reduce_scalar(mine, dist::ReduceOp::Sum));
  if (fit == o_.steps) return;
  log_ << fmt::format(
      "[train] --time-limit {:.0f} s at {:.1f} ms a step (the mean of {} steps): the schedule "
      "now ends at step {} (was {}; asked {})\n",
      o_.time_limit_s, 1000.0 * train_secs_ / static_cast<double>(st_.step), st_.step, fit,
      o_.steps, planned_steps_);
  o_.steps = fit;
}

TrainResult Trainer::run() {
  planned_steps_ = std::max(planned_steps_, o_.steps);
  while (st_.step < o_.steps) {
    if (o_.stop_at > 0 && st_.step >= o_.stop_at) break;
    // Every rank must stop at the same step: rank 0's clock decides.
    if (o_.time_limit_s > 0 &&
        comm_->all_reduce_scalar(comm_->rank() == 0 && train_secs_ >= o_.time_limit_s ? 1 : 0,
                                 dist::ReduceOp::Sum) > 0) {
      log_ << fmt::format("time limit of {:.0f} s reached at step {}\n", o_.time_limit_s, st_.step);
      break;
    }
    StepStats s = step();
    nonfinite_run_ = s.skipped ? nonfinite_run_ + 1 : 0;
    log_step(s);
    KILN_CHECK(nonfinite_run_ < o_.max_nonfinite_steps,
               "[train] {} steps in a row (the last: step {}, loss {}, grad norm {}) had a "
               "non-finite loss or gradient norm; stopped before writing any checkpoint ({} is "
               "as it was). Lower --lr, check --beta1/--beta2/--weight-decay, or raise "
               "--max-nonfinite-steps",
               nonfinite_run_, s.step, s.loss, s.norm, ckpt_path_);
    if (o_.eval_interval > 0 && st_.step % o_.eval_interval == 0 && comm_->rank() == 0) evaluate();
    if (o_.ckpt_interval > 0 && st_.step % o_.ckpt_interval == 0) save();
    fit_steps_to_time_limit();
  }
  batch_ = {};
  if ((o_.eval_interval <= 0 || st_.step % o_.eval_interval != 0) && comm_->rank() == 0) evaluate();
  clear_progress();
  // The memory figures of the training itself, before the checkpoint's copies: this rank's, and
  // with several ranks the largest of each figure over them.
  synchronize(device_);
  res_.memory = tracker_.stats();
  res_.world = comm_->size();
  if (comm_->size() > 1) res_.memory_max = max_over_ranks(*comm_, res_.memory);
  res_.device_memory = driver_memory(device_);
  save(/*final=*/true);

  res_.steps_done = st_.step;
  res_.final_train_loss = last_loss_;
  res_.best_val_loss = st_.best_val_loss;
  res_.train_seconds = train_secs_;
  res_.tokens_per_second = train_secs_ > 0 ? static_cast<double>(tokens_done_) / train_secs_ : 0;
  res_.mfu =
      model_flops_utilization(res_.tokens_per_second, res_.flops_per_token, res_.peak_tflops);
  res_.checkpoint = final_path_;
  comm_->barrier();  // no rank leaves while rank 0 still writes
  return res_;
}

std::string Trainer::world_text() const {
  return fmt::format("world {}, global batch {}", comm_->size(), o_.batch);
}

Trainer::~Trainer() {
  if (jsonl_fd_ >= 0) ::close(jsonl_fd_);
}

// log.jsonl is opened O_APPEND and every record is one write() of a whole line, so a kill loses
// at most the record being written and never glues two. On resume a torn last line (a kill in
// the middle of a write) is cut off first, so the next record starts on a line of its own.
void Trainer::open_log(bool append) {
  const std::string path = (std::filesystem::path(o_.out_dir) / "log.jsonl").string();
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC);
  jsonl_fd_ = ::open(path.c_str(), flags, 0644);
  KILN_CHECK(jsonl_fd_ >= 0, "[train] cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (append && ::fstat(jsonl_fd_, &st) == 0 && st.st_size > 0) {
    std::string text = io::read_regular_file(path, "train");
    const std::size_t keep = text.ends_with('\n') ? text.size() : text.rfind('\n') + 1;
    if (keep != text.size() && ::ftruncate(jsonl_fd_, static_cast<off_t>(keep)) != 0)
      fail("[train] cannot cut the torn last line of {}: {}", path, std::strerror(errno));
  }
}

void Trainer::write_log_record(const nlohmann::json& record) {
  if (jsonl_fd_ < 0) return;  // ranks other than 0
  const std::string line = record.dump() + "\n";
  std::size_t done = 0;
  while (done < line.size()) {
    ssize_t w = ::write(jsonl_fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    KILN_CHECK(w > 0, "[train] cannot write log.jsonl in {}: {}", o_.out_dir, std::strerror(errno));
    done += static_cast<std::size_t>(w);
  }
}

// Erases the progress bar before a log line, so that the two do not share a terminal row.
void Trainer::clear_progress() {
  if (progress_ && comm_->rank() == 0) fmt::print(stderr, "\r{}\r", std::string(80, ' '));
}

TrainResult train(const TrainOptions& o, Device device, DType dtype, std::ostream& log,
                  dist::Communicator* comm) {
  return Trainer(o, device, dtype, log, comm).run();
}

}  // namespace kiln::models
