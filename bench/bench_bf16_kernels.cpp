// CPU bf16 kernels (issue 10, item 3): each op timed in f32, in bf16 through its native kernel,
// and in bf16 through the f32 kernel with the dispatcher's conversion copies (the native bf16
// entry taken out of the table for that run), all in one process, so the ratios compare like
// with like on a loaded machine. Casts are timed at every ISA level this CPU has.
//   kiln_bench_bf16_kernels [--rows 4096] [--cols 768] [--reps 15]
// Prints one line per op: median milliseconds per call and the ratios.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "kernels/cpu/isa.h"
#include "tensor/op_args.h"
#include "tensor/ops.h"

using namespace kiln;
using namespace kiln::ops;

namespace {

double median_ms(int reps, const std::function<void()>& f) {
  f();  // warm the allocator's cache and the pages
  return kiln::bench::median_ms(reps, f);
}

struct OpBench {
  std::string name;
  // Runs the op once on inputs of dtype dt; `converting` takes the native bf16 kernel out.
  std::function<void(DType dt, bool converting)> run;
};

template <class A, class F>
void maybe_converting(bool converting, F&& f) {
  if (!converting) return f();
  ScopedKernel<A> none(DeviceType::CPU, DType::BF16, {});
  f();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU bf16 kernels: native vs f32 vs converting"};
  std::int64_t rows = 4096, cols = 768;
  int reps = 15;
  app.add_option("--rows", rows)->check(CLI::Range(1, 1 << 20));
  app.add_option("--cols", cols)->check(CLI::Range(2, 1 << 20));
  app.add_option("--reps", reps)->check(CLI::Range(1, 10000));
  CLI11_PARSE(app, argc, argv);

  Generator g(1);
  const Tensor x32 = ops::randn({rows, cols}, g), y32 = ops::randn({rows, cols}, g);
  const Tensor w32 = ops::randn({cols}, g);
  // Inputs per dtype, made once, outside the timed calls.
  struct Inputs {
    Tensor x, y, w;
  };
  const Inputs f32_in{x32, y32, w32};
  const Inputs bf16_in{x32.to(DType::BF16), y32.to(DType::BF16), w32.to(DType::BF16)};
  auto pick = [&](DType dt) -> const Inputs& { return dt == DType::BF16 ? bf16_in : f32_in; };
  std::vector<OpBench> benches = {
      {"add",
       [&](DType dt, bool c) {
         const Inputs& i = pick(dt);
         maybe_converting<BinaryArgs>(c, [&] { (void)ops::add(i.x, i.y); });
       }},
      {"silu",
       [&](DType dt, bool c) {
         const Inputs& i = pick(dt);
         maybe_converting<ActivationArgs<Op::Silu>>(c, [&] { (void)ops::silu(i.x); });
       }},
      {"swiglu",
       [&](DType dt, bool c) {
         const Inputs& i = pick(dt);
         maybe_converting<SwiGluArgs>(c, [&] { (void)ops::swiglu(i.x, i.y); });
       }},
      {"rmsnorm",
       [&](DType dt, bool c) {
         const Inputs& i = pick(dt);
         maybe_converting<RmsNormArgs>(c, [&] { (void)ops::rmsnorm(i.x, i.w, 1e-5); });
       }},
      {"softmax",
       [&](DType dt, bool c) {
         const Inputs& i = pick(dt);
         maybe_converting<SoftmaxArgs>(c, [&] { (void)ops::softmax(i.x); });
       }},
      {"sum_rows",
       [&](DType dt, bool c) {
         const Inputs& i = pick(dt);
         maybe_converting<ReduceArgs>(c, [&] { (void)ops::sum(i.x, 1); });
       }},
  };
  std::printf("kiln_bench_bf16_kernels: (%lld, %lld), %d reps, median ms per call, ISA %s\n",
              static_cast<long long>(rows), static_cast<long long>(cols), reps,
              std::string(cpu::cpu_isa_summary()).c_str());
  std::printf("%-10s %10s %12s %14s %12s %14s\n", "op", "f32", "bf16 native", "bf16 convert",
              "native/f32", "convert/native");
  for (const OpBench& b : benches) {
    const double f = median_ms(reps, [&] { b.run(DType::F32, false); });
    const double n = median_ms(reps, [&] { b.run(DType::BF16, false); });
    const double c = median_ms(reps, [&] { b.run(DType::BF16, true); });
    std::printf("%-10s %10.3f %12.3f %14.3f %12.2f %14.2f\n", b.name.c_str(), f, n, c, n / f,
                c / n);
  }
  std::printf("\ncasts of (%lld, %lld) per ISA level, median ms\n%-12s %10s %10s\n",
              static_cast<long long>(rows), static_cast<long long>(cols), "level", "f32->bf16",
              "bf16->f32");
  const Tensor x16 = x32.to(DType::BF16);
  for (int l = 0; l <= static_cast<int>(cpu::cpu_isa_detected()); ++l) {
    cpu::ScopedCpuIsa cap(static_cast<cpu::CpuIsa>(l));
    const double down = median_ms(reps, [&] { (void)x32.to(DType::BF16); });
    const double up = median_ms(reps, [&] { (void)x16.to(DType::F32); });
    std::printf("%-12s %10.3f %10.3f\n",
                std::string(cpu::cpu_isa_name(static_cast<cpu::CpuIsa>(l))).c_str(), down, up);
  }
  return 0;
}
