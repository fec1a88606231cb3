#include "models/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <omp.h>

#include "models/data.h"
#include "models/io/tokenizer.h"

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

}  // namespace

nlohmann::json TrainOptions::to_json() const {
  return {{"data", data_path},       {"tokenizer", tokenizer},   {"preset", preset},
          {"device", device},        {"batch", batch},           {"seq", seq},
          {"steps", steps},          {"lr", lr},                 {"min_lr", min_lr},
          {"warmup", warmup},        {"weight_decay", weight_decay}, {"beta1", beta1},
          {"beta2", beta2},          {"clip", clip},             {"eval_interval", eval_interval},
          {"eval_batches", eval_batches}, {"seed", seed},        {"recompute", recompute}};
}

double evaluate(DecoderModel& model, std::span<const std::int32_t> tokens, std::int64_t batch,
                std::int64_t seq, std::int64_t n_batches, std::uint64_t seed) {
  NoGradGuard no_grad;
  bool was_training = model.is_training();
  model.eval();
  BatchSampler s(tokens, batch, seq, seed);
  double sum = 0;
  for (std::int64_t i = 0; i < n_batches; ++i) {
    auto [x, y] = s.next();
    MemoryScope scope(MemCategory::Activations);
    PhaseScope phase(Phase::Forward);
    sum += model.loss(x, y).item();
  }
  model.train(was_training);
  return sum / static_cast<double>(std::max<std::int64_t>(n_batches, 1));
}

TrainResult train(const TrainOptions& o, std::ostream& log) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  KILN_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
             "[train] unknown device '{}' (auto, cpu or cuda)", o.device);
  KILN_CHECK(o.device != "cuda",
             "[train] the CUDA backend is not built yet (it is a later issue); use --device cpu");
  KILN_CHECK(o.steps > 0 && o.batch > 0 && o.seq > 0, "[train] steps, batch and seq must be > 0");
  KILN_CHECK(o.lr > 0 && o.min_lr >= 0 && o.min_lr <= o.lr, "[train] need 0 <= min_lr <= lr, lr > 0");
  namespace fs = std::filesystem;
  fs::create_directories(o.out_dir);
  const std::string ckpt_path = (fs::path(o.out_dir) / "ckpt.h5").string();
  const std::string final_path = (fs::path(o.out_dir) / "final.h5").string();

  // Data and tokenizer. On resume the tokenizer comes from the checkpoint.
  std::string text = read_text_file(o.data_path);
  KILN_CHECK(!text.empty(), "[train] {} is empty", o.data_path);
  CheckpointMeta meta;
  if (o.resume) {
    KILN_CHECK(fs::exists(ckpt_path), "[train] --resume: no checkpoint at {}", ckpt_path);
    meta = read_checkpoint_meta(ckpt_path);
    KILN_CHECK(meta.has_optimizer, "[train] {} holds no optimizer state", ckpt_path);
  }
  auto tok = run_tokenizer(o.tokenizer, o.resume ? meta.state.tokenizer_data : "", text);
  std::vector<std::int32_t> tokens = tok->encode(text, false, false);
  TokenSplit split = split_tokens(tokens, 0.1);

  ModelConfig cfg = o.resume ? meta.config : preset(o.preset);
  if (!o.resume && (o.tokenizer == "char" || o.tokenizer == "byte")) cfg.vocab_size = tok->vocab_size();
  KILN_CHECK(tok->vocab_size() <= cfg.vocab_size,
             "[train] tokenizer has {} tokens but the model's vocab is {}", tok->vocab_size(),
             cfg.vocab_size);
  KILN_CHECK(o.seq <= cfg.max_seq_len, "[train] --seq {} exceeds the model's context of {}", o.seq,
             cfg.max_seq_len);

  TrainState st;
  st.model_seed = o.seed;
  st.data_seed = o.seed + 1;
  st.tokenizer_spec = o.tokenizer;
  if (auto* ct = dynamic_cast<io::CharTokenizer*>(tok.get())) st.tokenizer_data = ct->serialize();
  st.args = o.to_json();
  st.best_val_loss = INFINITY;

  DecoderModel model(cfg, o.seed);
  model.recompute = o.recompute;
  nn::AdamW opt(model.named_parameters(), {o.lr, o.beta1, o.beta2, 1e-8, o.weight_decay});
  if (o.resume) {
    load_checkpoint(ckpt_path, model, &opt);
    st.step = meta.state.step;
    st.data_position = meta.state.data_position;
    st.data_seed = meta.state.data_seed;
    st.best_val_loss = meta.state.best_val_loss;
  }
  BatchSampler sampler(split.train, o.batch, o.seq, st.data_seed, st.data_position);

  log << fmt::format("kiln train: {} | {} params | vocab {} | {} train / {} val tokens | batch {} x {} | {} threads\n",
                     cfg.name, with_commas(static_cast<double>(model.num_parameters())),
                     cfg.vocab_size, with_commas(static_cast<double>(split.train.size())),
                     with_commas(static_cast<double>(split.val.size())), o.batch, o.seq,
                     omp_get_max_threads());
  if (o.resume) log << fmt::format("resumed from {} at step {}\n", ckpt_path, st.step);

  std::ofstream jsonl((fs::path(o.out_dir) / "log.jsonl").string(), o.resume ? std::ios::app : std::ios::trunc);
  bool progress = o.progress < 0 ? isatty(STDERR_FILENO) != 0 : o.progress != 0;
  auto& tracker = MemoryTracker::get(DeviceType::CPU);

  TrainResult res;
  double train_secs = 0, last_loss = 0;
  std::int64_t tokens_done = 0;
  auto run_eval = [&](std::int64_t step) {
    double val = evaluate(model, split.val, o.batch, o.seq, o.eval_batches, o.seed + 2);
    st.best_val_loss = std::min(st.best_val_loss, val);
    res.final_val_loss = val;
    if (progress) fmt::print(stderr, "\r{}\r", std::string(80, ' '));
    log << fmt::format("step {}/{} | val loss {:.4f} | best {:.4f} | {:.1f} s\n", step, o.steps,
                       val, st.best_val_loss, train_secs);
    jsonl << nlohmann::json{{"step", step}, {"val_loss", val}, {"time_s", train_secs}}.dump() << '\n';
    jsonl.flush();
  };

  while (st.step < o.steps) {
    if (o.stop_at > 0 && st.step >= o.stop_at) break;
    if (o.time_limit_s > 0 && train_secs >= o.time_limit_s) {
      log << fmt::format("time limit of {:.0f} s reached at step {}\n", o.time_limit_s, st.step);
      break;
    }
    const bool record_timeline = !o.mem_timeline.empty() && st.step == meta.state.step;
    if (record_timeline) {
      tracker.reset_peaks();
      tracker.set_timeline(true);
    }
    auto t0 = Clock::now();
    double lr = nn::cosine_lr(st.step, o.warmup, o.steps, o.lr, o.min_lr);
    opt.lr = lr;
    auto [x, y] = sampler.next();
    Tensor loss;
    {
      MemoryScope scope(MemCategory::Activations);
      PhaseScope phase(Phase::Forward);
      loss = model.loss(x, y);
    }
    last_loss = loss.item();
    KILN_CHECK(std::isfinite(last_loss), "[train] loss became {} at step {}", last_loss, st.step);
    backward(loss);
    loss = Tensor();
    double norm = nn::clip_grad_norm(model.parameters(), o.clip);
    opt.step();
    opt.zero_grad();
    st.step++;
    st.data_position = sampler.position();
    if (record_timeline) {
      tracker.dump_timeline(o.mem_timeline);
      tracker.set_timeline(false);
      log << fmt::format("memory timeline of step {} written to {}\n", st.step, o.mem_timeline);
    }
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    train_secs += ms / 1000.0;
    tokens_done += o.batch * o.seq;
    double tps = static_cast<double>(o.batch * o.seq) / (ms / 1000.0);
    jsonl << nlohmann::json{{"step", st.step}, {"loss", last_loss}, {"lr", lr}, {"norm", norm},
                            {"ms", ms}, {"tok_per_s", tps}}.dump()
          << '\n';
    if (st.step % o.log_interval == 0 || st.step == 1) {
      if (progress) fmt::print(stderr, "\r{}\r", std::string(80, ' '));
      log << fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | norm {:.2f} | {:.1f} ms | {} tok/s\n",
                         st.step, o.steps, last_loss, lr, norm, ms, with_commas(tps));
      log.flush();
    }
    if (progress) draw_progress(st.step, o.steps, last_loss, train_secs);
    if (o.eval_interval > 0 && st.step % o.eval_interval == 0) run_eval(st.step);
    if (o.ckpt_interval > 0 && st.step % o.ckpt_interval == 0) save_checkpoint(ckpt_path, model, &opt, st);
  }
  if (o.eval_interval <= 0 || st.step % o.eval_interval != 0) run_eval(st.step);
  if (progress) fmt::print(stderr, "\r{}\r", std::string(80, ' '));
  save_checkpoint(ckpt_path, model, &opt, st);
  save_checkpoint(final_path, model, nullptr, st);

  res.steps_done = st.step;
  res.final_train_loss = last_loss;
  res.best_val_loss = st.best_val_loss;
  res.train_seconds = train_secs;
  res.tokens_per_second = train_secs > 0 ? static_cast<double>(tokens_done) / train_secs : 0;
  res.memory = tracker.stats();
  res.checkpoint = final_path;
  return res;
}

}  // namespace kiln::models
