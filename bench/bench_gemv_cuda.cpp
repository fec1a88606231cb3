// Decode's matrix-vector products alone on the GPU: every Linear weight of one decode step of a
// model (bench/decode_shapes.h), each in its own buffer, multiplied in order by --rows rows of
// bf16 activations through kiln's launchers (no tensors, no dispatcher: launches only), for each
// weight format in --types. The peer in the same process is the device-to-device copy rate
// (read + write bytes over time, as hf_decode_peer.py measures it), the roofline of a kernel that
// streams its weights once. Weight bytes are a constant pattern (0x11: every f16 scale a small
// normal number), which no kernel's speed depends on.
//
//   q4_k: R rows per warp (the default kernel); q4_k_warp: one row per warp
//   (KILN_CUDA_QGEMV_ROWS=0), timed in the same process for the A/B.
//
// One JSON line per format, then a summary:
//   {"bench":"gemv_cuda","kernel":"q4_k","rows":1,"weight_bytes":...,"ms":...,"gbs":...,
//    "fraction_of_copy":...}
// Usage: kiln_bench_gemv_cuda --config config.json [--rows 1] [--reps 10] [--types LIST]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/decode_shapes.h"
#include "kernels/common/quant.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/runtime.h"
#include "models/config.h"

using namespace kiln;

namespace {

struct Format {
  std::string name;
  bool bf16 = false;
  quant::QuantType type = quant::QuantType::Q8_0;
  bool rows_per_warp = true;  // Q4_K's R-rows kernel
};

Format parse_format(const std::string& s) {
  if (s == "bf16") return {s, true};
  if (s == "q8_0") return {s, false, quant::QuantType::Q8_0};
  if (s == "q4_k") return {s, false, quant::QuantType::Q4_K, true};
  if (s == "q4_k_warp") return {s, false, quant::QuantType::Q4_K, false};
  if (s == "q6_k") return {s, false, quant::QuantType::Q6_K};
  throw std::runtime_error("[bench_gemv_cuda] unknown format '" + s +
                           "' (bf16, q8_0, q4_k, q4_k_warp, q6_k)");
}

std::int64_t weight_bytes(const Format& f, bench::Shape2 s) {
  if (f.bf16) return s.n * s.k * 2;
  const quant::QuantInfo& q = quant::quant_info(f.type);
  return s.n * (s.k / q.block_size) * q.block_bytes;
}

double seconds_synced(const auto& f) {
  cuda::device_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  cuda::device_synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kiln's CUDA GEMVs (bf16 and quantized) on a model's decode weights, against the "
      "device-to-device copy rate"};
  std::string config, types = "bf16,q8_0,q4_k,q4_k_warp,q6_k";
  int rows = 1, reps = 10, copies = 10;
  double copy_gib = 2;
  app.add_option("--config", config, "HF config.json of the model")->required();
  app.add_option("--rows", rows, "Rows of activations (decode batch)")->check(CLI::Range(1, 4));
  app.add_option("--reps", reps, "Passes per format (the best is kept)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--types", types, "Comma-separated formats");
  app.add_option("--copy-gib", copy_gib, "Buffer size of the copy roofline, GiB")
      ->check(CLI::Range(0.25, 16.0));
  app.add_option("--copies", copies, "Copies timed for the roofline")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  try {
    if (cuda::device_count() == 0) {
      std::fprintf(stderr, "[bench_gemv_cuda] no CUDA device\n");
      return 2;
    }
    const models::ModelConfig cfg = models::load_hf_config(config);
    const std::vector<bench::Shape2> shapes = bench::decode_weights(cfg);
    std::int64_t max_n = 0, max_k = 0;
    for (bench::Shape2 s : shapes) max_n = std::max(max_n, s.n), max_k = std::max(max_k, s.k);

    // The roofline: read + write bytes of device-to-device copies.
    const auto copy_bytes = static_cast<std::size_t>(copy_gib * (1 << 30));
    double copy_gbs = 0;
    {
      void* a = cuda::device_malloc(copy_bytes);
      void* b = cuda::device_malloc(copy_bytes);
      cuda::memset_async(a, 0, copy_bytes);
      cuda::memcpy_d2d(b, a, copy_bytes);  // warm-up
      const double s = seconds_synced([&] {
        for (int i = 0; i < copies; ++i) cuda::memcpy_d2d(i % 2 ? a : b, i % 2 ? b : a, copy_bytes);
      });
      copy_gbs = 2.0 * static_cast<double>(copy_bytes) * copies / s / 1e9;
      cuda::device_free(a);
      cuda::device_free(b);
    }

    auto* x = static_cast<bf16*>(cuda::device_malloc(rows * max_k * 2));
    auto* y = static_cast<bf16*>(cuda::device_malloc(rows * max_n * 2));
    cuda::memset_async(x, 0x3C, rows * max_k * 2);  // bf16 0x3C3C, about 0.0115

    std::stringstream list(types);
    for (std::string name; std::getline(list, name, ',');) {
      const Format f = parse_format(name);
      std::vector<std::int64_t> offsets;
      std::int64_t total = 0, bytes = 0;
      for (bench::Shape2 s : shapes) {
        offsets.push_back(total);
        bytes += weight_bytes(f, s);
        total += (weight_bytes(f, s) + 255) / 256 * 256;  // each weight on a 256-byte boundary
      }
      auto* w = static_cast<std::uint8_t*>(cuda::device_malloc(static_cast<std::size_t>(total)));
      cuda::memset_async(w, 0x11, static_cast<std::size_t>(total));
      cuda::set_gemv_quant_rows_enabled(f.rows_per_warp);
      auto pass = [&] {
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          const bench::Shape2 s = shapes[i];
          if (f.bf16)
            cuda::gemv_bf16(rows, s.n, s.k, reinterpret_cast<const bf16*>(w + offsets[i]), x, s.k,
                            y, s.n, nullptr);
          else
            cuda::gemv_quant<bf16>(f.type, rows, s.n, s.k, x, s.k, w + offsets[i], nullptr, y, s.n,
                                   nullptr);
        }
      };
      seconds_synced(pass);  // warm-up
      double best = 1e30;
      for (int r = 0; r < reps; ++r) best = std::min(best, seconds_synced(pass));
      cuda::device_free(w);
      const double gbs = static_cast<double>(bytes) / best / 1e9;
      nlohmann::json j = {{"bench", "gemv_cuda"},
                          {"kernel", name},
                          {"rows", rows},
                          {"launches", shapes.size()},
                          {"weight_bytes", bytes},
                          {"ms", best * 1e3},
                          {"gbs", gbs},
                          {"fraction_of_copy", gbs / copy_gbs}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
    cuda::set_gemv_quant_rows_enabled(true);
    cuda::device_free(x);
    cuda::device_free(y);
    const cuda::DeviceInfo info = cuda::device_info(cuda::current_device());
    nlohmann::json summary = {{"bench", "gemv_cuda_summary"},
                              {"config", config},
                              {"card", info.name},
                              {"copy_gbs", copy_gbs}};
    std::printf("%s\n", summary.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
