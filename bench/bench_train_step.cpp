// Training-step benchmark: full train steps of a preset decoder, the kiln side of
// bench/torch_train_step.py (CPU, fp32) and bench/torch_train_step_gpu.py (CUDA, bf16).
//
// One step = forward + cross-entropy (Activations, Phase::Forward), backward, AdamW step,
// zero_grad, on a fixed batch of random token ids; AdamW lr 5e-4, betas (0.9, 0.95), eps 1e-8,
// weight decay 0.1 on matrices (the peers' settings). Prints one JSON line:
//   {"peer":"kiln","device":...,"tok_per_s":...,"ms_per_step":...,"mfu":...,"peak_bytes":...}
//
// CPU:  kiln_bench_train_step --preset stories15M --batch 8 --seq 256 --threads 2
//       (per-phase times; the loss is read every step, as the CPU peer does)
// CUDA: kiln_bench_train_step --device cuda --dtype bf16 --preset stories42M --seq 1024 --batch 0
//       Kernels queue asynchronously: the timed steps run back to back and the clock is read
//       after a device synchronize (no per-phase split, which would need a sync per phase).
//       --batch 0 searches the largest power of two that fits, from --max-batch down (an
//       out-of-memory error halves it). Memory: the tracker's allocated peak over the timed
//       steps (what torch.cuda.max_memory_allocated reports for the peer), the allocator's
//       reserved peak, and the driver's used memory with the runtime and unattributed rows.
//       MFU = tok/s x (6N + 12 L H Dh T) / the bf16 dense peak (models/mfu.h).
// Exit status 3: out of memory at the asked batch (JSON line with "oom": true).
#include <cblas.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "apps/flags.h"
#include "autograd/engine.h"
#include "kernels/cpu/isa.h"
#include "kernels/cuda/runtime.h"
#include "models/decoder.h"
#include "models/mfu.h"
#include "nn/optim.h"
#include "tensor/caching_allocator.h"
#include "tensor/memory.h"
#include "tensor/storage.h"

using namespace kiln;

namespace {

Tensor random_ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::mt19937& rng,
                  Device device) {
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> v(static_cast<std::size_t>(b * t));
  for (auto& x : v) x = d(rng);
  return ops::from_vector(v, {b, t}).to(device);
}

// CPU time of the whole process (all threads): under load, wall time measures the scheduler as
// much as the code; with OMP_WAIT_POLICY=passive this is close to the work done.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double load_1m() {
  double l[1] = {0.0};
  return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

bool is_oom(const std::exception& e) {
  return std::string(e.what()).find("out of memory") != std::string::npos;
}

double round_to(double x, double s) { return std::round(x * s) / s; }

struct Settings {
  std::string preset = "stories15M";
  Device device = Device::cpu();
  DType dtype = DType::F32;
  std::int64_t seq = 0;
  int threads = 2, warmup = 2, steps = 5;
  bool recompute = false;
  double peak_tflops = 0;
  std::int64_t loss_chunk_rows = models::DecoderModel::kDefaultLossChunkRows;
};

// Builds the model and runs warmup + timed steps at `batch`; the JSON line on success.
nlohmann::json run(const Settings& st, std::int64_t batch) {
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const bool cuda_dev = st.device.is_cuda();
  auto sync = [&] {
    if (cuda_dev) cuda::device_synchronize();
  };
  models::ModelConfig cfg = models::preset(st.preset);
  models::DecoderModel model(cfg, /*seed=*/0, st.dtype, st.device);
  model.recompute = st.recompute;
  model.loss_chunk_rows = st.loss_chunk_rows;
  nn::AdamWOptions o;
  o.lr = 5e-4;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;  // the torch peers' settings
  nn::AdamW opt(model.named_parameters(), o);

  std::mt19937 rng(1);
  Tensor ids, targets;
  {
    MemoryScope scope(MemCategory::Inputs);
    ids = random_ids(batch, st.seq, cfg.vocab_size, rng, st.device);
    targets = random_ids(batch, st.seq, cfg.vocab_size, rng, st.device);
  }

  double t_fwd = 0.0, t_bwd = 0.0, t_opt = 0.0;  // CPU only: summed over timed steps
  Tensor last_loss;
  auto step = [&]() {
    Tensor loss;
    auto a = Clock::now();
    {
      MemoryScope scope(MemCategory::Activations);
      PhaseScope phase(Phase::Forward);
      loss = model.loss(ids, targets);
    }
    if (!cuda_dev) (void)loss.item();
    auto b = Clock::now();
    kiln::backward(loss);  // sets Phase::Backward and Temporaries itself
    auto c = Clock::now();
    opt.step();
    opt.zero_grad();
    auto d = Clock::now();
    t_fwd += secs(a, b);
    t_bwd += secs(b, c);
    t_opt += secs(c, d);
    last_loss = loss.detach();
  };

  const double load_before = load_1m();
  for (int i = 0; i < st.warmup; ++i) step();
  sync();
  MemoryTracker& tracker = MemoryTracker::get(st.device.type);
  tracker.reset_peaks();
  t_fwd = t_bwd = t_opt = 0.0;
  auto t0 = Clock::now();
  const double c0 = process_cpu_s();
  for (int i = 0; i < st.steps; ++i) step();
  sync();
  const double dt = secs(t0, Clock::now());
  const double cpu = process_cpu_s() - c0;
  const double loss = last_loss.item();
  const MemStats ms = tracker.stats();

  const double tps = static_cast<double>(batch * st.seq * st.steps) / dt;
  const double flops_per_token = models::train_flops_per_token(cfg, st.seq);
  std::string card;
  if (cuda_dev) card = cuda::device_info(st.device.index).name;
  const double peak = st.peak_tflops > 0 ? st.peak_tflops : models::bf16_peak_tflops(card);
  nlohmann::json j = {
      {"peer", "kiln"},
      {"device", st.device.str()},
      {"dtype", std::string(dtype_name(st.dtype))},
      {"cpu_isa", cuda_dev ? std::string("-") : kiln::cpu::cpu_isa_summary()},
      {"tok_per_s", round_to(tps, 10.0)},
      {"ms_per_step", round_to(1000.0 * dt / st.steps, 100.0)},
      {"config", st.preset},
      {"batch", batch},
      {"seq", st.seq},
      {"params", model.num_parameters()},
      {"matmul_params", models::matmul_params(cfg)},
      {"flops_per_token", flops_per_token},
      {"peak_tflops", peak},
      {"mfu", round_to(models::model_flops_utilization(tps, flops_per_token, peak), 1e4)},
      {"loss", round_to(loss, 1e4)},
      {"steps", st.steps},
      {"warmup", st.warmup},
      {"peak_bytes", ms.total_peak},
      {"reserved_peak_bytes", ms.reserved_peak},
      {"recompute", st.recompute},
      {"loss_chunk_rows", st.loss_chunk_rows},
  };
  if (cuda_dev) {
    const DeviceMemoryRows d = cuda_device_memory(st.device.index);
    j["card"] = card;
    constexpr const char* kImpl[] = {"auto", "kiln", "cudnn"};  // ops::AttentionImpl's order
    j["attention"] = kImpl[static_cast<int>(ops::attention_impl())];
    j["driver_used_bytes"] = d.used;
    j["driver_total_bytes"] = d.total;
    j["runtime_bytes"] = d.runtime();
    j["cuda_context_bytes"] = d.context;
    j["unattributed_bytes"] = d.unattributed();
    j["other_processes_bytes"] = d.other;
  } else {
    const char* wait = std::getenv("OMP_WAIT_POLICY");
    j["threads"] = st.threads;
    j["cpu_ms_per_step"] = round_to(1000.0 * cpu / st.steps, 100.0);
    j["forward_ms"] = round_to(1000.0 * t_fwd / st.steps, 10.0);
    j["backward_ms"] = round_to(1000.0 * t_bwd / st.steps, 10.0);
    j["optimizer_ms"] = round_to(1000.0 * t_opt / st.steps, 10.0);
    j["omp_wait_policy"] = wait ? wait : "default";
    j["loadavg_1m"] = round_to(load_before, 100.0);
  }
  return j;
}

// Releases what an out-of-memory attempt left cached, so the next one starts clean.
void release_cache(Device d) {
  if (d.is_cuda()) {
    cuda::device_synchronize();
    cuda_caching_allocator(d.index).empty_cache();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln train-step benchmark (peers: bench/torch_train_step.py, _gpu.py)"};
  Settings st;
  std::string device = "cpu", dtype = "auto", attention = "auto";
  std::int64_t batch = 8, max_batch = 512;
  app.add_option("--preset", st.preset, "model preset (models/config.h)");
  app.add_option("--device", device, "cpu | cuda[:N]");
  app.add_option("--dtype", dtype, "auto (bf16 on cuda, f32 on cpu) | f32 | bf16");
  app.add_option("--attention", attention, "CUDA attention: auto | kiln | cudnn");
  app.add_option("--batch", batch, "rows per step; 0: the largest power of two that fits (cuda)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-batch", max_batch, "where --batch 0 starts")->check(CLI::PositiveNumber);
  app.add_option("--seq", st.seq, "sequence length (default: the preset's context)");
  app.add_option("--threads", st.threads)->check(CLI::PositiveNumber);
  app.add_option("--warmup", st.warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--steps", st.steps)->check(CLI::PositiveNumber);
  app.add_option("--peak-tflops", st.peak_tflops, "bf16 peak for MFU (default: by GPU name)");
  app.add_flag("--recompute", st.recompute, "per-layer activation checkpointing");
  app.add_option("--loss-chunk-rows", st.loss_chunk_rows,
                 "LM head + loss in chunks of at most this many rows, gradients in forward, where "
                 "that holds less than the whole logits; 0: the logits whole, then the loss")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    // OpenBLAS is the OpenMP build: it follows omp_set_num_threads, but set both so a pthread
    // build would not oversubscribe the cores either.
    omp_set_num_threads(st.threads);
    openblas_set_num_threads(st.threads);
    st.device = apps::resolve_device(device, "bench");
    st.dtype = apps::resolve_train_dtype(dtype, st.device);
    apps::set_attention_from_flag(attention, "bench");
    const models::ModelConfig cfg = models::preset(st.preset);
    if (st.seq == 0) st.seq = cfg.max_seq_len;
    KILN_CHECK(st.seq > 0 && st.seq <= cfg.max_seq_len, "[bench] --seq {} must be in [1, {}]",
               st.seq, cfg.max_seq_len);
    KILN_CHECK(batch > 0 || st.device.is_cuda(), "[bench] --batch 0 (search) needs --device cuda");

    if (batch > 0) {
      try {
        std::printf("%s\n", run(st, batch).dump().c_str());
        return 0;
      } catch (const std::exception& e) {
        if (!is_oom(e)) throw;
        std::printf(
            "%s\n",
            nlohmann::json{{"peer", "kiln"}, {"oom", true}, {"batch", batch}, {"error", e.what()}}
                .dump()
                .c_str());
        return 3;
      }
    }
    // Search: the largest power of two <= max_batch whose steps run; each try is a fresh model.
    std::int64_t b = 1;
    while (b * 2 <= max_batch) b *= 2;
    std::vector<std::int64_t> refused;
    for (; b >= 1; b /= 2) {
      try {
        nlohmann::json j = run(st, b);
        j["batch_search"] = {{"max_batch", max_batch}, {"refused", refused}};
        std::printf("%s\n", j.dump().c_str());
        return 0;
      } catch (const std::exception& e) {
        if (!is_oom(e)) throw;
        refused.push_back(b);
        std::fprintf(stderr, "batch %lld: out of memory, halving\n", static_cast<long long>(b));
        release_cache(st.device);
      }
    }
    std::printf("%s\n",
                nlohmann::json{{"peer", "kiln"}, {"oom", true}, {"batch", 1}}.dump().c_str());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
