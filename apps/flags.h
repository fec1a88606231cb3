// Command-line strings to the library's types, shared by the subcommands and the bench/
// programs: --device, the training --dtype and --attention. The library below takes the
// resolved Device, DType and attention kernel; only the command line speaks in strings.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"

namespace kiln::apps {

// "auto" (cuda:0 when a GPU is visible, else cpu), "cpu", "cuda", "cuda:N". Asking for CUDA
// where there is none fails with a clear "[who] --device ...: ..." message (built without
// CUDA, or no device found); a CUDA device is made current.
Device resolve_device(const std::string& spec, std::string_view who);
// A resolved --dtype, and for "auto" the reason for the pick (empty for an explicit dtype), which
// the commands print so that a user sees which mode runs and why.
struct DTypeChoice {
  DType dtype = DType::F32;
  std::string why;
};
// Training: "auto", "f32"/"fp32", "bf16". auto is bf16 where bf16 arithmetic is native and fast:
// on CUDA, and on a CPU with AVX512-BF16 or AMX (kernels/cpu/isa.h, so KILN_CPU_ISA=avx512 makes
// it f32); f32 elsewhere, where every bf16 product is widened first (measured on an AVX2-only
// EPYC: a bf16 training step ran at 0.79x f32's speed). f32 is the checking mode.
DTypeChoice choose_train_dtype(const std::string& spec, Device device,
                               std::string_view who = "train");
// Inference (generate, chat, serve): the same names, but auto is bf16 on every device and CPU
// level with vector units (AVX2 and up): decode reads every weight once per token, so it runs at
// the weights' bytes, and bf16 halves them whether or not the CPU multiplies in bf16 (measured
// on an AVX2-only EPYC, 2 threads, Qwen3-0.6B: bf16 decode 1.31x f32, prefill 1.04x, peak RSS
// 2.4 GB against 4.0 GB; bench/results/cpu_decode_20261127_220522.json). Below AVX2 (the scalar
// level) auto is f32: bf16 is widened one value at a time there, while f32 runs on the BLAS (the
// same EPYC with KILN_CPU_ISA=scalar: f32 decoded 2.7x as fast as bf16).
DTypeChoice choose_inference_dtype(const std::string& spec, Device device, std::string_view who);
// choose_train_dtype's dtype alone.
inline DType resolve_train_dtype(const std::string& spec, Device device,
                                 std::string_view who = "train") {
  return choose_train_dtype(spec, device, who).dtype;
}
// "auto" | "kiln" | "cudnn" -> ops::set_attention_impl; fails on anything else.
void set_attention_from_flag(const std::string& impl, std::string_view who);

// Checked ranges for numeric flags, as CLI11 validators run on the text before conversion: the
// value must parse whole, be finite and lie in the range, else the flag is refused with
// "--flag: value 'x' ...". Values beyond int64 (or uint64), "1e9" for an integer, "-1" for a
// seed, "nan" and "inf" never reach the program.
CLI::Validator real_in(double lo, double hi, bool lo_open = false);
CLI::Validator int_in(std::int64_t lo, std::int64_t hi);
CLI::Validator uint64_flag();

// --threads: a count above kThreadsPerCore x the cores is capped there with a message on `log`
// (OpenMP runtimes crash or thrash with 100,000 threads); 0 keeps the OpenMP default.
inline constexpr int kThreadsPerCore = 4;
int cap_threads(std::int64_t requested, std::string_view who);

// Bytes the device can still give: MemAvailable on the CPU (0, no check, when unreadable), the
// free memory on a GPU.
std::int64_t available_memory(Device d);

// "1,2, 3" or "1 2 3" -> token ids (commas and whitespace separate them); an entry that is not an
// int32 is refused as "<flag>: '<entry>' is not a token id", with flag e.g. "[generate]
// --prompt-ids".
std::vector<std::int32_t> parse_token_ids(const std::string& s, std::string_view flag);

}  // namespace kiln::apps
