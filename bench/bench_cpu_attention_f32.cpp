// CPU attention in f32, forward and backward (kernels/cpu/attention.cpp), with the per-block
// products on kiln's block_sgemm (attention_sgemm.cpp, what the rule picks) against the same
// kernel with every block product on OpenBLAS (set_attention_gemm_openblas), interleaved in one
// process, median of --reps rounds each (measured numbers: bench/results/cpu_attention_f32_*).
//
// FLOP convention (causal, FlashAttention's): forward 4 B H T^2 D / 2, backward 2.5x that.
// Usage: kiln_bench_cpu_attention_f32 [--shape B,T,H,D ...] [--reps N] [--threads N]
#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/isa.h"

namespace {

struct Shape {
  int64_t B, T, H, D;
};

using kiln::bench::median;

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::cpu;
  CLI::App app{"CPU f32 attention: kiln's block products vs OpenBLAS's"};
  std::vector<std::string> shapes_text = {"16,128,4,48", "8,256,6,48", "4,512,8,64",
                                          "2,1024,16,128"};
  int reps = 15, threads = 0;
  app.add_option("--shape", shapes_text, "B,T,H,D (causal self-attention, Hkv = H)");
  app.add_option("--reps", reps, "Timed rounds per variant (median)")->check(CLI::Range(1, 10000));
  app.add_option("--threads", threads, "OpenMP threads (0: OMP_NUM_THREADS)");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);

  fmt::print("# {}, {} threads, isa {}\n", "kiln_bench_cpu_attention_f32", omp_get_max_threads(),
             cpu_isa_name(cpu_isa()));
  fmt::print("{:<16} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n", "B,T,H,D", "fwd_kiln", "fwd_blas",
             "bwd_kiln", "bwd_blas", "fwd_x", "bwd_x");
  for (const std::string& text : shapes_text) {
    Shape s{};
    if (std::sscanf(text.c_str(), "%ld,%ld,%ld,%ld", &s.B, &s.T, &s.H, &s.D) != 4 || s.B <= 0 ||
        s.T <= 0 || s.H <= 0 || s.D <= 0) {
      fmt::print(stderr, "[bench] --shape {}: expected four positive B,T,H,D\n", text);
      return 2;
    }
    const size_t n = static_cast<size_t>(s.B * s.T * s.H * s.D);
    std::vector<float> q(n), k(n), v(n), o(n), dout(n), dq(n), dk(n), dv(n),
        lse(static_cast<size_t>(s.B * s.H * s.T));
    std::mt19937 g(1);
    std::normal_distribution<float> nd;
    for (auto* p : {&q, &k, &v, &dout})
      for (auto& x : *p) x = nd(g);
    const double scale = 1.0 / std::sqrt(double(s.D));
    std::vector<double> t[2][2];  // [openblas][fwd, bwd]
    for (int rep = 0; rep < reps + 1; ++rep) {
      for (int blas = 0; blas < 2; ++blas) {
        const bool on = blas == 1;
        attn::set_attention_gemm_openblas(&on);
        const auto t0 = std::chrono::steady_clock::now();
        attention_forward<float>(s.B, s.T, s.T, s.H, s.H, s.D, 0, scale, q.data(), k.data(),
                                 v.data(), s.T * s.H * s.D, o.data(), lse.data());
        const auto t1 = std::chrono::steady_clock::now();
        attention_backward<float>(s.B, s.T, s.H, s.H, s.D, scale, q.data(), k.data(), v.data(),
                                  o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                                  dv.data());
        const auto t2 = std::chrono::steady_clock::now();
        if (rep == 0) continue;  // warm-up
        t[blas][0].push_back(std::chrono::duration<double>(t1 - t0).count());
        t[blas][1].push_back(std::chrono::duration<double>(t2 - t1).count());
      }
    }
    attn::set_attention_gemm_openblas(nullptr);
    const double fl = 4.0 * s.B * s.H * double(s.T) * s.T * s.D / 2;
    const double fk = fl / median(t[0][0]) / 1e9, fb = fl / median(t[1][0]) / 1e9;
    const double bk = 2.5 * fl / median(t[0][1]) / 1e9, bb = 2.5 * fl / median(t[1][1]) / 1e9;
    fmt::print("{:<16} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.2f} {:>8.2f}\n", text, fk, fb,
               bk, bb, fk / fb, bk / bb);
  }
  fmt::print("(GFLOP/s, causal convention; x = kiln / OpenBLAS)\n");
  return 0;
}
