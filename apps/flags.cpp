#include "apps/flags.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "kernels/common/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"

namespace kiln::apps {

Device resolve_device(const std::string& spec, std::string_view who) {
  if (spec == "auto") {
    if (cuda::device_count() > 0) {
      cuda::set_device(0);
      return Device::cuda(0);
    }
    return Device::cpu();
  }
  Device d;
  try {
    d = Device::parse(spec);
  } catch (const Error&) {
    fail("[{}] unknown device '{}' (auto, cpu, cuda or cuda:N)", who, spec);
  }
  KILN_CHECK(!d.is_meta(), "[{}] --device meta runs nothing; use cpu or cuda", who);
  if (!d.is_cuda()) return d;
  KILN_CHECK(cuda::compiled_with_cuda(),
             "[{}] --device {}: this kiln was built without CUDA (configure with -DKILN_CUDA=ON); "
             "use --device cpu",
             who, spec);
  const int n = cuda::device_count();
  KILN_CHECK(n > 0,
             "[{}] --device {}: no CUDA device found (no NVIDIA driver, or no GPU visible); use "
             "--device cpu",
             who, spec);
  KILN_CHECK(d.index >= 0 && d.index < n, "[{}] --device {}: only {} CUDA device(s) visible", who,
             spec, n);
  cuda::set_device(d.index);
  return d;
}

namespace {

// An explicit --dtype, or nothing for "auto"; fails on anything else. f16 only for inference:
// training in f16 needs loss scaling, which kiln does not implement.
std::optional<DType> explicit_dtype(const std::string& spec, std::string_view who, bool inference) {
  if (spec == "auto") return std::nullopt;
  if (spec == "f32" || spec == "fp32") return DType::F32;
  if (spec == "bf16") return DType::BF16;
  if (spec == "f16" || spec == "fp16") {
    KILN_CHECK(inference,
               "[{}] --dtype {}: f16 training needs loss scaling, which kiln does not implement; "
               "train in bf16 or f32 (generate, chat and serve take f16)",
               who, spec);
    return DType::F16;
  }
  fail("[{}] unknown dtype '{}' (auto, f32, bf16{})", who, spec, inference ? " or f16" : "");
}

std::string isa_level() { return std::string(cpu::cpu_isa_name(cpu::cpu_isa())); }

}  // namespace

DTypeChoice choose_train_dtype(const std::string& spec, Device device, std::string_view who) {
  if (auto d = explicit_dtype(spec, who, /*inference=*/false)) return {*d, ""};
  if (device.is_cuda()) return {DType::BF16, "bf16 tensor cores on the GPU"};
  if (cpu::cpu_has(cpu::CpuIsa::Avx512Bf16))
    return {DType::BF16, fmt::format("isa {}: the CPU multiplies bf16 natively", isa_level())};
  return {DType::F32,
          fmt::format("isa {}: no bf16 arithmetic, every bf16 product is widened first, so f32 "
                      "trains faster; an AVX2 EPYC ran bf16 steps at 0.79x f32's speed",
                      isa_level())};
}

DTypeChoice choose_inference_dtype(const std::string& spec, Device device, std::string_view who) {
  if (auto d = explicit_dtype(spec, who, /*inference=*/true)) return {*d, ""};
  if (device.is_cuda()) return {DType::BF16, "bf16 tensor cores on the GPU"};
  if (cpu::cpu_has(cpu::CpuIsa::Avx2))
    return {DType::BF16,
            fmt::format("isa {}: decode runs at the weights' bytes and bf16 halves them; an AVX2 "
                        "EPYC decoded 1.31x as fast as in f32, in 0.6x the memory",
                        isa_level())};
  return {DType::F32,
          "isa scalar: bf16 is widened one value at a time while f32 runs on the BLAS; an AVX2 "
          "EPYC capped at scalar decoded 2.7x as fast in f32"};
}

void set_attention_from_flag(const std::string& impl, std::string_view who) {
  if (impl == "auto")
    ops::set_attention_impl(ops::AttentionImpl::Auto);
  else if (impl == "kiln")
    ops::set_attention_impl(ops::AttentionImpl::Kiln);
  else if (impl == "cudnn")
    ops::set_attention_impl(ops::AttentionImpl::Cudnn);
  else
    fail("[{}] unknown attention '{}' (auto, kiln or cudnn)", who, impl);
}

namespace {

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

CLI::Validator real_in(double lo, double hi, bool lo_open) {
  const std::string range = fmt::format("{}{:g}, {:g}]", lo_open ? "(" : "[", lo, hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        const std::string t = trimmed(s);
        double v = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (t.empty() || ec != std::errc() || p != t.data() + t.size())
          return fmt::format("value '{}' is not a number (expected one in {})", s, range);
        if (!std::isfinite(v)) return fmt::format("value '{}' is not finite", s);
        if (v < lo || v > hi || (lo_open && v == lo))
          return fmt::format("value {} is out of range {}", s, range);
        return "";
      },
      "REAL in " + range);
}

CLI::Validator int_in(std::int64_t lo, std::int64_t hi) {
  const std::string range = fmt::format("[{}, {}]", lo, hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        const std::string t = trimmed(s);
        std::int64_t v = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (ec == std::errc::result_out_of_range)
          return fmt::format("value {} does not fit a 64-bit integer (expected one in {})", s,
                             range);
        if (t.empty() || ec != std::errc() || p != t.data() + t.size())
          return fmt::format("value '{}' is not an integer (expected one in {})", s, range);
        if (v < lo || v > hi) return fmt::format("value {} is out of range {}", s, range);
        return "";
      },
      "INT in " + range);
}

CLI::Validator uint64_flag() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::string t = trimmed(s);
        std::uint64_t v = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (t.empty() || ec != std::errc() || p != t.data() + t.size())
          return fmt::format("value '{}' is not an integer in [0, 2^64)", s);
        return "";
      },
      "UINT64");
}

int cap_threads(std::int64_t requested, std::string_view who) {
  if (requested <= 0) return 0;
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  const std::int64_t cap = kThreadsPerCore * static_cast<std::int64_t>(cores);
  if (requested <= cap) return static_cast<int>(requested);
  fmt::print(stderr, "[{}] --threads {} capped at {} ({} x the {} cores)\n", who, requested, cap,
             kThreadsPerCore, cores);
  return static_cast<int>(cap);
}

std::int64_t available_memory(Device d) {
  if (d.is_cuda()) {
    cuda::set_device(d.index);
    return static_cast<std::int64_t>(cuda::mem_get_info().free_bytes);
  }
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

std::vector<std::int32_t> parse_token_ids(const std::string& s, std::string_view flag) {
  std::vector<std::int32_t> ids;
  const auto separator = [](char c) {
    return c == ',' || std::isspace(static_cast<unsigned char>(c));
  };
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && separator(s[i])) ++i;
    if (i == s.size()) break;
    std::size_t j = i;
    while (j < s.size() && !separator(s[j])) ++j;
    std::int32_t id = 0;
    auto [p, ec] = std::from_chars(s.data() + i, s.data() + j, id);
    KILN_CHECK(ec == std::errc() && p == s.data() + j,
               "{}: '{}' is not a token id (expected e.g. 1,2,3)", flag, s.substr(i, j - i));
    ids.push_back(id);
    i = j;
  }
  return ids;
}

}  // namespace kiln::apps
