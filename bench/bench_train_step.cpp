// CPU training-step benchmark: full train steps of a preset decoder in fp32, the kiln side of
// bench/torch_train_step.py (same model, optimizer settings and step).
//
// One step = forward + cross-entropy (Activations, Phase::Forward), backward, AdamW step,
// zero_grad, on a fixed batch of random token ids. Prints one JSON line:
//   {"peer":"kiln","threads":N,"tok_per_s":...,"ms_per_step":...,"peak_bytes":...}
// Example: kiln_bench_train_step --preset stories15M --batch 8 --seq 256 --threads 2
#include <omp.h>

#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <cblas.h>
#include <nlohmann/json.hpp>

#include "autograd/engine.h"
#include "models/decoder.h"
#include "nn/optim.h"
#include "tensor/memory.h"

using namespace kiln;

namespace {

Tensor random_ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> v(static_cast<std::size_t>(b * t));
  for (auto& x : v) x = d(rng);
  return ops::from_vector(v, {b, t});
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln CPU train-step benchmark (peer: bench/torch_train_step.py)"};
  std::string preset = "stories15M";
  std::int64_t batch = 8, seq = 0;
  int threads = 2, warmup = 2, steps = 5;
  bool recompute = false;
  app.add_option("--preset", preset, "model preset (models/config.h)");
  app.add_option("--batch", batch)->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "sequence length (default: the preset's context)");
  app.add_option("--threads", threads)->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps)->check(CLI::PositiveNumber);
  app.add_flag("--recompute", recompute, "per-layer activation checkpointing");
  CLI11_PARSE(app, argc, argv);

  try {
    // OpenBLAS is the OpenMP build: it follows omp_set_num_threads, but set both so a pthread
    // build would not oversubscribe the cores either.
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);

    models::ModelConfig cfg = models::preset(preset);
    if (seq == 0) seq = cfg.max_seq_len;
    KILN_CHECK(seq > 0 && seq <= cfg.max_seq_len, "[bench] --seq {} must be in [1, {}]", seq,
               cfg.max_seq_len);

    models::DecoderModel model(cfg, /*seed=*/0, DType::F32, Device::cpu());
    model.recompute = recompute;
    nn::AdamWOptions o;
    o.lr = 5e-4;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.eps = 1e-8;
    o.weight_decay = 0.1;  // the torch peer's settings
    nn::AdamW opt(model.named_parameters(), o);

    std::mt19937 rng(1);
    Tensor ids, targets;
    {
      MemoryScope scope(MemCategory::Inputs);
      ids = random_ids(batch, seq, cfg.vocab_size, rng);
      targets = random_ids(batch, seq, cfg.vocab_size, rng);
    }

    using Clock = std::chrono::steady_clock;
    auto secs = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    double t_fwd = 0.0, t_bwd = 0.0, t_opt = 0.0;  // summed over timed steps
    auto step = [&]() {
      Tensor loss;
      auto a = Clock::now();
      {
        MemoryScope scope(MemCategory::Activations);
        PhaseScope phase(Phase::Forward);
        loss = model.loss(ids, targets);
      }
      double value = loss.item();
      auto b = Clock::now();
      kiln::backward(loss);  // sets Phase::Backward and Temporaries itself
      auto c = Clock::now();
      opt.step();
      opt.zero_grad();
      auto d = Clock::now();
      t_fwd += secs(a, b);
      t_bwd += secs(b, c);
      t_opt += secs(c, d);
      return value;
    };

    double load_before = load_1m();
    for (int i = 0; i < warmup; ++i) step();
    MemoryTracker::get(DeviceType::CPU).reset_peaks();
    t_fwd = t_bwd = t_opt = 0.0;
    double last = 0.0;
    auto t0 = Clock::now();
    double c0 = process_cpu_s();
    for (int i = 0; i < steps; ++i) last = step();
    double dt = secs(t0, Clock::now());
    double cpu = process_cpu_s() - c0;
    MemStats ms = MemoryTracker::get(DeviceType::CPU).stats();

    const char* wait = std::getenv("OMP_WAIT_POLICY");
    auto round_to = [](double x, double s) { return std::round(x * s) / s; };
    nlohmann::json j = {
        {"peer", "kiln"},
        {"threads", threads},
        {"tok_per_s", round_to(static_cast<double>(batch * seq * steps) / dt, 10.0)},
        {"ms_per_step", round_to(1000.0 * dt / steps, 100.0)},
        {"config", preset},
        {"batch", batch},
        {"seq", seq},
        {"params", model.num_parameters()},
        {"loss", round_to(last, 1e4)},
        {"cpu_ms_per_step", round_to(1000.0 * cpu / steps, 100.0)},
        {"forward_ms", round_to(1000.0 * t_fwd / steps, 10.0)},
        {"backward_ms", round_to(1000.0 * t_bwd / steps, 10.0)},
        {"optimizer_ms", round_to(1000.0 * t_opt / steps, 10.0)},
        {"peak_bytes", ms.total_peak},
        {"reserved_peak_bytes", ms.reserved_peak},
        {"recompute", recompute},
        {"omp_wait_policy", wait ? wait : "default"},
        {"loadavg_1m", round_to(load_before, 100.0)},
    };
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
