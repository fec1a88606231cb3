// Decode's matrix-vector products alone: every Linear weight of one decode step of a model
// (q, k, v, o, gate, up, down per layer, and the LM head), multiplied in order by one row of
// activations, as decode does. Peers in the same run: the same products in f32 (OpenBLAS
// through kiln::cpu::gemm, the f32 decode path) and the read bandwidth (kernels/cpu/bandwidth.h).
// Each figure is the best of --reps passes; the three are measured round-robin, so a load
// spike from other processes hits all three alike. One JSON line per kernel, then a summary:
//   {"bench":"gemv","kernel":"bf16","rows":1,"weight_bytes":...,"ms":...,"gbs":...,
//    "fraction_of_read":...}
// Usage: kiln_bench_gemv --config config.json [--rows 1] [--reps 5] [--threads N] [--no-f32]
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/decode_shapes.h"
#include "kernels/common/half.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/gemv_bf16.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "models/config.h"

using namespace kiln;
using kiln::bench::decode_weights;
using kiln::bench::Shape2;

namespace {

template <typename T>
std::vector<T> filled(std::int64_t n, float scale) {
  std::vector<T> v(static_cast<std::size_t>(n));
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float f = scale * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - scale / 2;
    if constexpr (std::is_same_v<T, bf16>)
      v[i] = float_to_bf16(f);
    else
      v[i] = f;
  }
  return v;
}

template <typename T>
double seconds(T&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bf16 GEMV (decode) against f32 and the read bandwidth"};
  std::string config;
  std::int64_t rows = 1;
  int reps = 5, threads = 0;
  bool no_f32 = false;
  app.add_option("--config", config, "HF config.json of the model")->required();
  app.add_option("--rows", rows, "Rows of activations (decode batch)")->check(CLI::Range(1, 64));
  app.add_option("--reps", reps, "Passes per kernel (best is kept)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "OpenMP threads (0: default)");
  app.add_flag("--no-f32", no_f32, "Skip the f32 peer (it needs 2x the weight bytes)");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);

  const models::ModelConfig cfg = models::load_hf_config(config);
  const std::vector<Shape2> shapes = decode_weights(cfg);
  std::int64_t elems = 0, max_n = 0, max_k = 0;
  for (Shape2 s : shapes)
    elems += s.n * s.k, max_n = std::max(max_n, s.n), max_k = std::max(max_k, s.k);
  // One buffer per distinct weight, as in the model (no reuse through the caches).
  std::vector<std::int64_t> offsets;
  for (std::int64_t off = 0; Shape2 s : shapes) offsets.push_back(off), off += s.n * s.k;
  const std::vector<bf16> wb = filled<bf16>(elems, 0.05f);
  const std::vector<bf16> xb = filled<bf16>(rows * max_k, 1.0f);
  std::vector<bf16> yb(static_cast<std::size_t>(rows * max_n));
  std::vector<float> wf, xf = filled<float>(rows * max_k, 1.0f), yf(yb.size());
  if (!no_f32) wf = filled<float>(elems, 0.05f);

  auto run_bf16 = [&] {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      cpu::gemv_bf16<bf16, bf16>(rows, shapes[i].n, shapes[i].k, xb.data(), shapes[i].k,
                                 wb.data() + offsets[i], shapes[i].k, nullptr, yb.data(),
                                 shapes[i].n);
  };
  auto run_f32 = [&] {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      cpu::gemm<float>(false, true, rows, shapes[i].n, shapes[i].k, 1.0f, xf.data(), shapes[i].k,
                       wf.data() + offsets[i], shapes[i].k, 0.0f, yf.data(), shapes[i].n);
  };
  run_bf16();  // warm-up: page faults, thread pools
  if (!no_f32) run_f32();
  double best_bf16 = 1e30, best_f32 = 1e30, best_read = 0;
  for (int r = 0; r < reps; ++r) {
    best_bf16 = std::min(best_bf16, seconds(run_bf16));
    if (!no_f32) best_f32 = std::min(best_f32, seconds(run_f32));
    best_read = std::max(best_read, cpu::measure_bandwidth(std::size_t{512} << 20, 1).read_gbs);
  }
  const double bytes_bf16 = 2.0 * static_cast<double>(elems), bytes_f32 = 2 * bytes_bf16;
  auto line = [&](const char* kernel, double bytes, double s) {
    nlohmann::json j = {{"bench", "gemv"},
                        {"kernel", kernel},
                        {"rows", rows},
                        {"weight_bytes", bytes},
                        {"ms", s * 1e3},
                        {"gbs", bytes / s / 1e9},
                        {"fraction_of_read", bytes / s / 1e9 / best_read}};
    std::printf("%s\n", j.dump().c_str());
  };
  line("bf16", bytes_bf16, best_bf16);
  if (!no_f32) line("f32_openblas", bytes_f32, best_f32);
  nlohmann::json summary = {{"bench", "gemv_summary"},
                            {"config", config},
                            {"isa", std::string(cpu::cpu_isa_name(cpu::cpu_isa()))},
                            {"threads", omp_get_max_threads()},
                            {"read_gbs", best_read},
                            {"bf16_over_f32_time", no_f32 ? 0.0 : best_f32 / best_bf16}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}
