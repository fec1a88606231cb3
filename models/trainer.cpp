#include "models/trainer.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "kernels/cuda/runtime.h"
#include "models/data.h"
#include "models/io/tokenizer.h"
#include "models/mfu.h"
#include "tensor/caching_allocator.h"

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

// Kernels run asynchronously on CUDA: a timer is read only after the device has finished.
void sync(Device d) {
  if (d.is_cuda()) cuda::device_synchronize();
}

std::string mfu_text(double mfu) { return mfu > 0 ? fmt::format("{:.1f}%", 100.0 * mfu) : "n/a"; }

// ---- checkpoints of a CUDA run, through a CPU copy ----------------------------------------
// save_checkpoint / load_checkpoint read and write CPU memory. A CUDA run copies its state into
// an f32 CPU model and AdamW (the masters become the weights, as save_checkpoint writes them
// for a CPU mixed-precision run), so the file is the same whatever the device.

struct HostCopy {
  std::unique_ptr<DecoderModel> model;
  std::unique_ptr<nn::AdamW> opt;
};

HostCopy make_host_copy(const DecoderModel& model, const nn::AdamW& opt) {
  HostCopy h;
  h.model = std::make_unique<DecoderModel>(model.cfg, 0, DType::F32, Device::cpu());
  h.opt = std::make_unique<nn::AdamW>(h.model->named_parameters(), opt.opt);
  return h;
}

std::map<std::string, nn::ParamState*> state_by_name(nn::Optimizer& opt) {
  std::map<std::string, nn::ParamState*> m;
  for (auto& s : opt.state()) m[s.name] = &s;
  return m;
}

void save_device_checkpoint(const std::string& path, const std::string& final_path,
                            DecoderModel& model, nn::AdamW& opt, const TrainState& st) {
  HostCopy h = make_host_copy(model, opt);
  auto dev_state = state_by_name(opt), host_state = state_by_name(*h.opt);
  auto host_params = h.model->named_parameters();
  std::map<std::string, Tensor> dev_params;
  for (auto& [name, p] : model.named_parameters()) dev_params[name] = p;
  for (auto& [name, hp] : host_params) {
    auto ds = dev_state.find(name);
    KILN_CHECK(ds != dev_state.end() && dev_params.count(name),
               "[train] checkpoint: parameter {} has no optimizer state", name);
    const Tensor& src = ds->second->master.defined() ? ds->second->master : dev_params[name];
    hp.copy_(src.to(Device::cpu(), DType::F32));
    nn::ParamState* hs = host_state.at(name);
    if (ds->second->m.defined()) hs->m.copy_(ds->second->m.to(Device::cpu(), DType::F32));
    if (ds->second->v.defined()) hs->v.copy_(ds->second->v.to(Device::cpu(), DType::F32));
  }
  h.opt->step_count = opt.step_count;
  h.opt->lr = opt.lr;
  save_checkpoint(path, *h.model, h.opt.get(), st);
  if (!final_path.empty()) save_checkpoint(final_path, *h.model, nullptr, st);
}

void load_device_checkpoint(const std::string& path, DecoderModel& model, nn::AdamW& opt) {
  HostCopy h = make_host_copy(model, opt);
  load_checkpoint(path, *h.model, h.opt.get());
  auto dev_state = state_by_name(opt), host_state = state_by_name(*h.opt);
  std::map<std::string, Tensor> host_params;
  for (auto& [name, hp] : h.model->named_parameters()) host_params[name] = hp;
  for (auto& [name, p] : model.named_parameters()) {
    const Tensor f32 = host_params.at(name).to(p.device());  // exact f32 values on the device
    nn::ParamState* ds = dev_state.at(name);
    if (ds->master.defined()) ds->master.copy_(f32);
    p.copy_(f32);  // rounded into a bf16 parameter, as the optimizer step does
    const nn::ParamState* hs = host_state.at(name);
    if (ds->m.defined()) ds->m.copy_(hs->m.to(p.device()));
    if (ds->v.defined()) ds->v.copy_(hs->v.to(p.device()));
  }
  opt.step_count = h.opt->step_count;
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
          {"clip", clip},
          {"eval_interval", eval_interval},
          {"eval_batches", eval_batches},
          {"seed", seed},
          {"recompute", recompute}};
}

double evaluate(DecoderModel& model, std::span<const std::int32_t> tokens, std::int64_t batch,
                std::int64_t seq, std::int64_t n_batches, std::uint64_t seed) {
  NoGradGuard no_grad;
  bool was_training = model.is_training();
  model.eval();
  const Device device = model.lm_head_weight().device();
  BatchSampler s(tokens, batch, seq, seed);
  double sum = 0;
  for (std::int64_t i = 0; i < n_batches; ++i) {
    auto [x, y] = s.next();
    if (!device.is_cpu()) {
      MemoryScope inputs(MemCategory::Inputs);
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

TrainResult train(const TrainOptions& o, Device device, DType dtype, std::ostream& log) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  KILN_CHECK(o.peak_tflops >= 0, "[train] --peak-tflops must be >= 0");
  KILN_CHECK(o.steps > 0 && o.batch > 0 && o.seq > 0, "[train] steps, batch and seq must be > 0");
  KILN_CHECK(o.lr > 0 && o.min_lr >= 0 && o.min_lr <= o.lr,
             "[train] need 0 <= min_lr <= lr, lr > 0");
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
  if (!o.resume && (o.tokenizer == "char" || o.tokenizer == "byte"))
    cfg.vocab_size = tok->vocab_size();
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

  DecoderModel model(cfg, o.seed, dtype, device);
  model.recompute = o.recompute;
  nn::AdamW opt(model.named_parameters(), {o.lr, o.beta1, o.beta2, 1e-8, o.weight_decay});
  if (o.resume) {
    if (device.is_cpu())
      load_checkpoint(ckpt_path, model, &opt);
    else
      load_device_checkpoint(ckpt_path, model, opt);
    st.step = meta.state.step;
    st.data_position = meta.state.data_position;
    st.data_seed = meta.state.data_seed;
    st.best_val_loss = meta.state.best_val_loss;
  }
  BatchSampler sampler(split.train, o.batch, o.seq, st.data_seed, st.data_position);

  TrainResult res;
  res.device = device.str();
  res.dtype = std::string(dtype_name(dtype));
  if (device.is_cuda()) res.device_name = cuda::device_info(device.index).name;
  res.flops_per_token = train_flops_per_token(cfg, o.seq);
  res.peak_tflops = o.peak_tflops > 0 ? o.peak_tflops : bf16_peak_tflops(res.device_name);
  auto mfu_of = [&](double tok_per_s) {
    return model_flops_utilization(tok_per_s, res.flops_per_token, res.peak_tflops);
  };

  log << fmt::format(
      "kiln train: {} | {} params | vocab {} | {} train / {} val tokens | batch {} x {} | {}\n",
      cfg.name, with_commas(static_cast<double>(model.num_parameters())), cfg.vocab_size,
      with_commas(static_cast<double>(split.train.size())),
      with_commas(static_cast<double>(split.val.size())), o.batch, o.seq,
      device.is_cuda()
          ? fmt::format("{} ({}), {}{}", device.str(), res.device_name, dtype_name(dtype),
                        dtype == DType::F32 ? "" : " (f32 masters and moments)")
          : fmt::format("cpu, {}, {} threads", dtype_name(dtype), omp_get_max_threads()));
  log << fmt::format(
      "MFU: {:.3g} GFLOP per token (6N + 12 L H Dh T, N = {} matmul params) over {}\n",
      res.flops_per_token / 1e9, with_commas(static_cast<double>(matmul_params(cfg))),
      res.peak_tflops > 0 ? fmt::format("a {:.1f} TFLOP/s bf16 peak", res.peak_tflops)
                          : std::string("an unknown peak (pass --peak-tflops)"));
  if (o.resume) log << fmt::format("resumed from {} at step {}\n", ckpt_path, st.step);

  std::ofstream jsonl((fs::path(o.out_dir) / "log.jsonl").string(),
                      o.resume ? std::ios::app : std::ios::trunc);
  bool progress = o.progress < 0 ? isatty(STDERR_FILENO) != 0 : o.progress != 0;
  auto& tracker = MemoryTracker::get(device.type);

  double train_secs = 0, last_loss = 0;
  std::int64_t tokens_done = 0;
  auto run_eval = [&](std::int64_t step) {
    double val = evaluate(model, split.val, o.batch, o.seq, o.eval_batches, o.seed + 2);
    st.best_val_loss = std::min(st.best_val_loss, val);
    res.final_val_loss = val;
    if (progress) fmt::print(stderr, "\r{}\r", std::string(80, ' '));
    log << fmt::format("step {}/{} | val loss {:.4f} | best {:.4f} | {:.1f} s\n", step, o.steps,
                       val, st.best_val_loss, train_secs);
    jsonl << nlohmann::json{{"step", step}, {"val_loss", val}, {"time_s", train_secs}}.dump()
          << '\n';
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
    sync(device);  // the timer starts when the device is idle
    auto t0 = Clock::now();
    double lr = nn::cosine_lr(st.step, o.warmup, o.steps, o.lr, o.min_lr);
    opt.lr = lr;
    auto [x, y] = sampler.next();
    if (!device.is_cpu()) {
      MemoryScope inputs(MemCategory::Inputs);
      x = x.to(device);
      y = y.to(device);
    }
    Tensor loss;
    {
      MemoryScope scope(MemCategory::Activations);
      PhaseScope phase(Phase::Forward);
      loss = model.loss(x, y);
    }
    backward(loss);
    // Read after backward, so that on a GPU the host queues the backward pass while the
    // forward still runs (item() waits for the device).
    last_loss = loss.item();
    loss = Tensor();
    KILN_CHECK(std::isfinite(last_loss), "[train] loss became {} at step {}", last_loss, st.step);
    double norm = nn::clip_grad_norm(model.parameters(), o.clip);
    opt.step();
    opt.zero_grad();
    sync(device);
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
    jsonl << nlohmann::json{{"step", st.step},   {"loss", last_loss}, {"lr", lr},
                            {"norm", norm},      {"ms", ms},          {"tok_per_s", tps},
                            {"mfu", mfu_of(tps)}}
                 .dump()
          << '\n';
    if (st.step % o.log_interval == 0 || st.step == 1) {
      if (progress) fmt::print(stderr, "\r{}\r", std::string(80, ' '));
      log << fmt::format(
          "step {}/{} | loss {:.4f} | lr {:.2e} | norm {:.2f} | {:.1f} ms | {} tok/s | MFU {}\n",
          st.step, o.steps, last_loss, lr, norm, ms, with_commas(tps), mfu_text(mfu_of(tps)));
      log.flush();
    }
    if (progress) draw_progress(st.step, o.steps, last_loss, train_secs);
    if (o.eval_interval > 0 && st.step % o.eval_interval == 0) run_eval(st.step);
    if (o.ckpt_interval > 0 && st.step % o.ckpt_interval == 0) {
      if (device.is_cpu())
        save_checkpoint(ckpt_path, model, &opt, st);
      else
        save_device_checkpoint(ckpt_path, "", model, opt, st);
    }
  }
  if (o.eval_interval <= 0 || st.step % o.eval_interval != 0) run_eval(st.step);
  if (progress) fmt::print(stderr, "\r{}\r", std::string(80, ' '));
  // The memory figures of the training itself, before the checkpoint's copies.
  sync(device);
  res.memory = tracker.stats();
  if (device.is_cuda()) res.device_memory = cuda_device_memory(device.index);
  if (device.is_cpu()) {
    save_checkpoint(ckpt_path, model, &opt, st);
    save_checkpoint(final_path, model, nullptr, st);
  } else {
    save_device_checkpoint(ckpt_path, final_path, model, opt, st);
  }

  res.steps_done = st.step;
  res.final_train_loss = last_loss;
  res.best_val_loss = st.best_val_loss;
  res.train_seconds = train_secs;
  res.tokens_per_second = train_secs > 0 ? static_cast<double>(tokens_done) / train_secs : 0;
  res.mfu = mfu_of(res.tokens_per_second);
  res.checkpoint = final_path;
  return res;
}

}  // namespace kiln::models
