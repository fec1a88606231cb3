// CPU attention in bf16 against f32, in one run, interleaved, caches flushed before each run
// (measured numbers: bench/results/cpu_attention_bf16_*.txt):
//   bf16@<top>   attention_forward<bf16> at the machine's level: decode reads the bf16 cache
//                directly, its scores by vdpbf16ps where AVX512-BF16 is there (D % 32 == 0);
//                other blocks run on AMX tiles at amx (D % 32 == 0), else widen their tiles
//                to f32 and call sgemm (as at every level below amx)
//   bf16@avx512  capped at avx512: decode scores by FMAs on cache rows widened in registers
//   bf16@avx2    capped at avx2: decode widens its tiles too (the "convert tiles" way)
//   f32          attention_forward<float> on f32 inputs (the peer: what f32 models run)
//   f32_convert  what the dispatcher did before the bf16 kernel: whole q, k, v widened to f32,
//                the f32 kernel, out rounded back to bf16
// OpenBLAS picks its own kernels whatever the cap; only kiln's code is capped. The backward:
// the bf16 kernel vs the f32 kernel vs convert. Median of --reps interleaved rounds each.
// Usage: kiln_bench_cpu_attention_bf16 [--reps N] [--cpu-time] [--json PATH]
#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "kernels/common/half.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/isa.h"

using namespace kiln;

namespace {

struct Case {
  std::string name;
  int64_t B, Tq, Tk, Hq, Hkv, D;
  bool backward;
};

// Wall-clock ms, or with --cpu-time this process's CPU time (all threads): on a machine shared
// with other jobs, time spent descheduled does not count (use with OMP_NUM_THREADS=1, where
// OpenMP's spin-waiting cannot inflate it).
bool g_cpu_time = false;
double now_ms() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Variant {
  std::string name;
  cpu::CpuIsa isa;  // the level it runs capped at
  std::function<void()> run;
};

// Evicts the caches (writes and reads a buffer larger than the last-level cache), so no variant
// finds the inputs the previous one left in L2/L3: each starts from memory, as a decode step
// that streams the weights between two attention calls does.
void flush_caches() {
  static std::vector<char> junk(256 << 20);
  static char sink = 0;
  for (size_t i = 0; i < junk.size(); i += 64) junk[i] = char(junk[i] + 1);
  for (size_t i = 0; i < junk.size(); i += 64) sink = char(sink ^ junk[i]);
  asm volatile("" : : "r"(sink));
}

// Median ms of each variant over reps rounds; each round runs every variant once, in turn, so
// load from other processes on a shared machine falls on all of them alike; caches are flushed
// before each run.
std::vector<double> interleaved_median_ms(int reps, const std::vector<Variant>& vs) {
  std::vector<std::vector<double>> ms(vs.size());
  for (int r = -1; r < reps; ++r)  // round -1 warms up (allocations, page faults)
    for (size_t i = 0; i < vs.size(); ++i) {
      cpu::ScopedCpuIsa cap(vs[i].isa);
      flush_caches();
      const double t0 = now_ms();
      vs[i].run();
      const double t = now_ms() - t0;
      if (r >= 0) ms[i].push_back(t);
    }
  std::vector<double> med;
  for (auto& m : ms) med.push_back(kiln::bench::median(m));
  return med;
}

std::vector<float> normal(int64_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = bf16_to_float(float_to_bf16(d(g)));  // bf16 values, so both dtypes agree
  return v;
}
std::vector<bf16> rounded(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  cpu::f32_to_bf16(int64_t(v.size()), v.data(), out.data());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("CPU bf16 attention: vdpbf16ps scores vs widened tiles vs f32");
  int reps = 15;
  std::string json_path;
  app.add_option("--reps", reps, "Timed runs per variant (median)")->check(CLI::Range(1, 10000));
  app.add_option("--json", json_path, "Also write the results here");
  app.add_flag("--cpu-time", g_cpu_time,
               "Time by process CPU time instead of wall clock (a loaded machine; 1 thread)");
  CLI11_PARSE(app, argc, argv);

  const std::vector<Case> cases = {
      {"stories15M train fwd B8 T256 H6 D48", 8, 256, 256, 6, 6, 48, false},
      {"qwen3-0.6B prefill B1 T512 Hq16 Hkv8 D128", 1, 512, 512, 16, 8, 128, false},
      {"qwen3-0.6B decode B1 Tk1024 Hq16 Hkv8 D128", 1, 1, 1024, 16, 8, 128, false},
      {"qwen3-0.6B decode B1 Tk4096 Hq16 Hkv8 D128", 1, 1, 4096, 16, 8, 128, false},
      {"stories15M decode B1 Tk256 H6 D48 (MHA)", 1, 1, 256, 6, 6, 48, false},
      {"stories15M train bwd B8 T256 H6 D48", 8, 256, 256, 6, 6, 48, true},
  };
  nlohmann::json out = nlohmann::json::array();
  fmt::print("threads {}, isa detected {}, reps {}, {}\n", omp_get_max_threads(),
             cpu::cpu_isa_name(cpu::cpu_isa_detected()), reps,
             g_cpu_time ? "process CPU time" : "wall clock");
  for (const Case& c : cases) {
    const int64_t qn = c.B * c.Tq * c.Hq * c.D, kvn = c.B * c.Tk * c.Hkv * c.D;
    const int64_t kvs = c.Tk * c.Hkv * c.D, q_offset = c.Tk - c.Tq;
    const double scale = 1.0 / std::sqrt(double(c.D));
    const auto qf = normal(qn, 1), kf = normal(kvn, 2), vf = normal(kvn, 3), df = normal(qn, 4);
    const auto qb = rounded(qf), kb = rounded(kf), vb = rounded(vf), db = rounded(df);
    std::vector<bf16> ob(qn), dqb(qn), dkb(kvn), dvb(kvn);
    std::vector<float> of(qn), lse(c.B * c.Hq * c.Tq), dqf(qn), dkf(kvn), dvf(kvn);
    std::vector<float> q32(qn), k32(kvn), v32(kvn), o32(qn), d32(qn);

    auto fwd_bf16 = [&] {
      cpu::attention_forward<bf16>(c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, q_offset, scale, qb.data(),
                                   kb.data(), vb.data(), kvs, ob.data(), lse.data());
    };
    auto fwd_f32 = [&] {
      cpu::attention_forward<float>(c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, q_offset, scale, qf.data(),
                                    kf.data(), vf.data(), kvs, of.data(), lse.data());
    };
    auto fwd_convert = [&] {
      cpu::bf16_to_f32(qn, qb.data(), q32.data());
      cpu::bf16_to_f32(kvn, kb.data(), k32.data());
      cpu::bf16_to_f32(kvn, vb.data(), v32.data());
      cpu::attention_forward<float>(c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, q_offset, scale, q32.data(),
                                    k32.data(), v32.data(), kvs, o32.data(), lse.data());
      cpu::f32_to_bf16(qn, o32.data(), ob.data());
    };
    auto bwd_bf16 = [&] {
      cpu::attention_backward<bf16>(c.B, c.Tq, c.Hq, c.Hkv, c.D, scale, qb.data(), kb.data(),
                                    vb.data(), ob.data(), lse.data(), db.data(), dqb.data(),
                                    dkb.data(), dvb.data());
    };
    auto bwd_f32 = [&] {
      cpu::attention_backward<float>(c.B, c.Tq, c.Hq, c.Hkv, c.D, scale, qf.data(), kf.data(),
                                     vf.data(), of.data(), lse.data(), df.data(), dqf.data(),
                                     dkf.data(), dvf.data());
    };
    auto bwd_convert = [&] {
      for (auto [src, dst, n] : {std::tuple{&qb, &q32, qn},
                                 {&kb, &k32, kvn},
                                 {&vb, &v32, kvn},
                                 {&ob, &o32, qn},
                                 {&db, &d32, qn}})
        cpu::bf16_to_f32(n, src->data(), dst->data());
      cpu::attention_backward<float>(c.B, c.Tq, c.Hq, c.Hkv, c.D, scale, q32.data(), k32.data(),
                                     v32.data(), o32.data(), lse.data(), d32.data(), dqf.data(),
                                     dkf.data(), dvf.data());
      cpu::f32_to_bf16(qn, dqf.data(), dqb.data());
      cpu::f32_to_bf16(kvn, dkf.data(), dkb.data());
      cpu::f32_to_bf16(kvn, dvf.data(), dvb.data());
    };

    const cpu::CpuIsa top = cpu::cpu_isa_detected();
    std::vector<Variant> vs;
    if (!c.backward) {
      vs.push_back({fmt::format("bf16@{}", cpu::cpu_isa_name(top)), top, fwd_bf16});
      if (top > cpu::CpuIsa::Avx512) vs.push_back({"bf16@avx512", cpu::CpuIsa::Avx512, fwd_bf16});
      if (top > cpu::CpuIsa::Avx2) vs.push_back({"bf16@avx2", cpu::CpuIsa::Avx2, fwd_bf16});
      vs.push_back({"f32", top, fwd_f32});
      vs.push_back({"f32_convert", top, fwd_convert});
    } else {
      fwd_bf16();
      vs.push_back({"bf16", top, bwd_bf16});
      vs.push_back({"f32", top, bwd_f32});
      vs.push_back({"f32_convert", top, bwd_convert});
    }
    const std::vector<double> med = interleaved_median_ms(reps, vs);
    nlohmann::json row = {{"case", c.name}, {"threads", omp_get_max_threads()}};
    std::string line = fmt::format("{:<44}", c.name);
    for (size_t i = 0; i < vs.size(); ++i) {
      row[vs[i].name + "_ms"] = med[i];
      line += fmt::format(" | {} {:.3f} ms", vs[i].name, med[i]);
    }
    fmt::print("{}\n", line);
    out.push_back(row);
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
