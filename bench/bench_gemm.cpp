// CPU GEMM rates on given shapes: oneDNN bf16 (kiln's bf16 path, kernels/cpu/matmul_dnnl.h),
// oneDNN f32 and OpenBLAS sgemm (kiln's two f32 libraries: kernels/cpu/matmul.h's rule picks one
// per product, and these two columns are what it was set from), in TFLOP/s, measured
// side by side in one run (interleaved repetitions, best of each) so a loaded machine shifts
// them alike.
//
//   kiln_bench_gemm                                   the training shapes (docs/cpu_gemm.md)
//   kiln_bench_gemm --shape 512x1024x3072 --only bf16 the oneDNN bf16 rate for M x N x K
//   KILN_CPU_ISA=avx512 kiln_bench_gemm --path onednn  oneDNN's bf16 emulation on plain AVX-512
//   kiln_bench_gemm --no-trans-b --beta 1 --shape t:192x192x2048   a weight gradient, dW += X^T dY
//
// C (M, N) = A (M, K) @ B (K, N), row-major, B stored transposed (N, K) as a Linear's weight
// unless --no-trans-b. Threads: OMP_NUM_THREADS / --threads.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/half.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_dnnl.h"

namespace {

using kiln::bf16;
using kiln::cpu::Bf16Gemm;

struct Shape {
  std::int64_t M, N, K;
  bool trans_a = false;  // "t:" prefix: A stored (K, M), as a weight gradient's X^T dY
};

Shape parse_shape(const std::string& text) {
  Shape sh{};
  std::string s = text;
  if (s.rfind("t:", 0) == 0) {
    sh.trans_a = true;
    s = s.substr(2);
  }
  char x1 = 0, x2 = 0;
  long long m = 0, n = 0, k = 0;
  const int got = std::sscanf(s.c_str(), "%lld%c%lld%c%lld", &m, &x1, &n, &x2, &k);
  KILN_CHECK(got == 5 && x1 == 'x' && x2 == 'x' && m > 0 && n > 0 && k > 0,
             "[bench_gemm] shape '{}' is not [t:]MxNxK with positive sizes", text);
  sh.M = m;
  sh.N = n;
  sh.K = k;
  return sh;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Repeats f until at least min_s seconds have passed (and at least 3 times); seconds per call.
template <class F>
double time_once(F&& f, double min_s) {
  f();  // warm: primitive creation, page faults, thread start
  int reps = 0;
  const double t0 = now_s();
  double t = t0;
  while (reps < 3 || t - t0 < min_s) {
    f();
    ++reps;
    t = now_s();
  }
  return (t - t0) / reps;
}

std::string machine_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU GEMM rates: oneDNN bf16, oneDNN f32, OpenBLAS f32 (TFLOP/s)"};
  std::vector<std::string> shapes = {"2048x288x768", "2048x768x288", "2048x288x288",
                                     "2048x32000x288", "512x1024x3072"};
  std::string only = "all";
  int threads = 0, rounds = 3;
  double min_s = 0.3;
  bool no_trans_b = false;
  std::string path = "auto";
  float beta = 0.0f;
  app.add_option("--shape", shapes,
                 "[t:]MxNxK (repeatable; t: A stored transposed, (K, M)); default: stories15M "
                 "training shapes");
  app.add_option("--beta", beta, "C = A B + beta C (f32 columns only; 1: a gradient accumulated)");
  app.add_option("--only", only, "all | bf16 (only the oneDNN bf16 rate)")
      ->check(CLI::IsMember({"all", "bf16"}));
  app.add_option("--threads", threads, "OpenMP threads (default: OMP_NUM_THREADS)");
  app.add_option("--rounds", rounds, "interleaved rounds; the best of each is reported");
  app.add_option("--min-seconds", min_s, "time per measurement");
  app.add_flag("--no-trans-b", no_trans_b, "B stored (K, N) instead of (N, K)");
  app.add_option("--path", path,
                 "bf16 path: auto (by the ISA level) | onednn (also below AVX512-BF16, where "
                 "oneDNN emulates) | widen (kiln's widening sgemm fallback)")
      ->check(CLI::IsMember({"auto", "onednn", "widen"}));
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);
  const kiln::cpu::Bf16GemmPath forced =
      path == "widen" ? kiln::cpu::Bf16GemmPath::WidenSgemm : kiln::cpu::Bf16GemmPath::Onednn;
  kiln::cpu::set_bf16_gemm_path_override(path == "auto" ? nullptr : &forced);
  try {
    std::printf("# %s, %d threads, isa %s, B %s\n", machine_model().c_str(), omp_get_max_threads(),
                kiln::cpu::cpu_isa_summary().c_str(), no_trans_b ? "(K, N)" : "(N, K)");
    std::printf("%-16s %10s %10s %10s  %s\n", "MxNxK", "dnnl_bf16", "dnnl_f32", "blas_f32",
                "bf16 impl");
    for (const std::string& s : shapes) {
      const Shape sh = parse_shape(s);
      const bool tb = !no_trans_b, ta = sh.trans_a;
      const std::int64_t lda = ta ? sh.M : sh.K, ldb = tb ? sh.K : sh.N, ldc = sh.N;
      std::vector<float> a(sh.M * sh.K), b(sh.K * sh.N), c(sh.M * sh.N);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = float((i * 7919) % 1000) / 1000.0f - 0.5f;
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = float((i * 104729) % 997) / 997.0f - 0.5f;
      std::vector<bf16> ab(a.size()), bb(b.size()), cb(c.size());
      for (std::size_t i = 0; i < a.size(); ++i) ab[i] = kiln::float_to_bf16(a[i]);
      for (std::size_t i = 0; i < b.size(); ++i) bb[i] = kiln::float_to_bf16(b[i]);
      const Bf16Gemm g{.trans_a = ta,
                       .trans_b = tb,
                       .M = sh.M,
                       .N = sh.N,
                       .K = sh.K,
                       .lda = lda,
                       .ldb = ldb,
                       .ldc = ldc};
      const std::int64_t scratch_bytes = kiln::cpu::bf16_gemm_scratch_bytes(g);
      std::vector<std::byte> scratch(static_cast<std::size_t>(scratch_bytes) + 64);
      void* sp = scratch.data() + (64 - reinterpret_cast<std::uintptr_t>(scratch.data()) % 64) % 64;
      const double flop = 2.0 * double(sh.M) * double(sh.N) * double(sh.K);
      double best_bf16 = 1e30, best_dnnl = 1e30, best_blas = 1e30;
      for (int r = 0; r < rounds; ++r) {
        best_bf16 =
            std::min(best_bf16, time_once(
                                    [&] {
                                      kiln::cpu::bf16_gemm(g, ab.data(), bb.data(), cb.data(),
                                                           nullptr, sp, scratch_bytes);
                                    },
                                    min_s));
        if (only == "bf16") continue;
        best_dnnl = std::min(best_dnnl, time_once(
                                            [&] {
                                              kiln::cpu::onednn_sgemm(ta, tb, sh.M, sh.N, sh.K,
                                                                      1.0f, a.data(), lda, b.data(),
                                                                      ldb, beta, c.data(), ldc);
                                            },
                                            min_s));
        best_blas = std::min(best_blas, time_once(
                                            [&] {
                                              kiln::cpu::sgemm_openblas(
                                                  ta, tb, sh.M, sh.N, sh.K, 1.0f, a.data(), lda,
                                                  b.data(), ldb, beta, c.data(), ldc);
                                            },
                                            min_s));
      }
      auto rate = [&](double t) {
        return t < 1e29 ? fmt::format("{:10.3f}", flop / t / 1e12) : fmt::format("{:>10}", "-");
      };
      std::printf("%-16s %s %s %s  %s\n", s.c_str(), rate(best_bf16).c_str(),
                  rate(best_dnnl).c_str(), rate(best_blas).c_str(),
                  kiln::cpu::bf16_gemm_impl(g).c_str());
    }
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
