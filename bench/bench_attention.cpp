// Attention benchmark on CUDA: kiln's flash attention against cuDNN's fused SDPA, both through
// the op front end (ops::attention / ops::attention_backward, switched with
// ops::set_attention_impl), causal, bf16, head dim 128.
//
// FLOP convention (FlashAttention's, causal): forward = 4·B·H·T²·D / 2 (QK^T and PV, 2 FLOPs
// per multiply-add, half the score matrix); backward = 2.5 x forward (five products instead of
// two); fwd+bwd TFLOP/s = 3.5 x forward FLOPs / (forward time + backward time).
//
// Shapes: H = 16 heads (Hkv = 16: no GQA), D = 128, B·T = --tokens (default 32768), so that
// every T moves the same bytes per pass: T = 1024 (B 32), 4096 (B 8), 8192 (B 4).
// Each timed figure is the median over --reps runs of --iters back-to-back calls, timed on the
// host after a device synchronize. One JSON line per (impl, T), then one summary line:
//   {"bench":"attention","impl":"kiln","T":4096,"fwd_tflops":...,"bwd_tflops":...,...}
// An impl that fails (not built yet, unsupported shape) gets {"error": ...} and the run goes on.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/flags.h"
#include "bench/bench_timing.h"
#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"

using namespace kiln;

namespace {

using kiln::bench::median;

struct Timing {
  double fwd_s = 0, bwd_s = 0;
};

Timing time_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                 double scale, int iters, int reps) {
  using Clock = std::chrono::steady_clock;
  auto [out, lse] = ops::attention(q, k, v, scale, 0);  // warm-up; also the backward's inputs
  (void)ops::attention_backward(q, k, v, out, lse, dout, scale);
  cuda::device_synchronize();
  std::vector<double> fwd, bwd;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) (void)ops::attention(q, k, v, scale, 0);
    cuda::device_synchronize();
    auto t1 = Clock::now();
    for (int i = 0; i < iters; ++i) (void)ops::attention_backward(q, k, v, out, lse, dout, scale);
    cuda::device_synchronize();
    auto t2 = Clock::now();
    fwd.push_back(std::chrono::duration<double>(t1 - t0).count() / iters);
    bwd.push_back(std::chrono::duration<double>(t2 - t1).count() / iters);
  }
  return {median(fwd), median(bwd)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln attention benchmark: kiln flash attention vs cuDNN SDPA (CUDA, bf16)"};
  std::vector<std::int64_t> seqs = {1024, 4096, 8192};
  std::int64_t tokens = 32768, heads = 16, head_dim = 128;
  int iters = 10, reps = 5;
  std::vector<std::string> impls = {"kiln", "cudnn"};
  std::string device = "cuda";
  app.add_option("--seq", seqs, "sequence lengths");
  app.add_option("--tokens", tokens, "B x T per shape")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads)->check(CLI::PositiveNumber);
  app.add_option("--head-dim", head_dim)->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "calls per timed run")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed runs (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--impl", impls, "kiln, cudnn");
  app.add_option("--device", device, "cuda[:N]");
  CLI11_PARSE(app, argc, argv);

  try {
    const Device dev = apps::resolve_device(device, "bench_attention");
    KILN_CHECK(dev.is_cuda(), "[bench_attention] needs a CUDA device, got {}", dev.str());
    const std::string card = cuda::device_info(dev.index).name;
    nlohmann::json summary = {{"bench", "attention_summary"}, {"card", card}, {"ratios", {}}};
    for (std::int64_t T : seqs) {
      const std::int64_t B = std::max<std::int64_t>(1, tokens / T);
      Generator gen(1234);
      const Shape shape = {B, T, heads, head_dim};
      Tensor q = ops::randn(shape, gen, 0.0, 1.0, DType::BF16, dev);
      Tensor k = ops::randn(shape, gen, 0.0, 1.0, DType::BF16, dev);
      Tensor v = ops::randn(shape, gen, 0.0, 1.0, DType::BF16, dev);
      Tensor dout = ops::randn(shape, gen, 0.0, 1.0, DType::BF16, dev);
      const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      const double fwd_flops = 4.0 * static_cast<double>(B * heads) * static_cast<double>(T) *
                               static_cast<double>(T) * static_cast<double>(head_dim) / 2.0;
      const double bwd_flops = 2.5 * fwd_flops;
      double tf[2] = {0, 0};
      for (std::size_t i = 0; i < impls.size(); ++i) {
        const std::string& impl = impls[i];
        nlohmann::json j = {{"bench", "attention"},
                            {"impl", impl},
                            {"card", card},
                            {"B", B},
                            {"T", T},
                            {"H", heads},
                            {"D", head_dim},
                            {"causal", true},
                            {"dtype", "bf16"},
                            {"fwd_flops", fwd_flops},
                            {"bwd_flops", bwd_flops}};
        try {
          apps::set_attention_from_flag(impl, "bench_attention");
          const Timing t = time_impl(q, k, v, dout, scale, iters, reps);
          const double fb = (fwd_flops + bwd_flops) / (t.fwd_s + t.bwd_s) / 1e12;
          j["fwd_ms"] = t.fwd_s * 1e3;
          j["bwd_ms"] = t.bwd_s * 1e3;
          j["fwd_tflops"] = fwd_flops / t.fwd_s / 1e12;
          j["bwd_tflops"] = bwd_flops / t.bwd_s / 1e12;
          j["fwd_bwd_tflops"] = fb;
          if (impl == "kiln") tf[0] = fb;
          if (impl == "cudnn") tf[1] = fb;
        } catch (const std::exception& e) {
          j["error"] = e.what();
        }
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
      if (tf[0] > 0 && tf[1] > 0)
        summary["ratios"][std::to_string(T)] = tf[0] / tf[1];  // kiln / cuDNN, fwd+bwd
    }
    apps::set_attention_from_flag("kiln", "bench_attention");
    std::printf("%s\n", summary.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
