#include "tensor/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "kernels/common/error.h"

namespace kiln {

namespace {
thread_local MemCategory t_category = MemCategory::Temporaries;
thread_local Phase t_phase = Phase::Idle;
thread_local const char* t_label = "";
}  // namespace

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Weights:
      return "weights";
    case MemCategory::MasterWeights:
      return "master weights";
    case MemCategory::Gradients:
      return "gradients";
    case MemCategory::OptimizerState:
      return "optimizer state";
    case MemCategory::Activations:
      return "activations";
    case MemCategory::KVCache:
      return "kv cache";
    case MemCategory::Logits:
      return "logits+loss";
    case MemCategory::Temporaries:
      return "temporaries";
    case MemCategory::Inputs:
      return "inputs";
    case MemCategory::Runtime:
      return "runtime";
    case MemCategory::Count:
      break;
  }
  return "?";
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::Idle:
      return "idle";
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Optimizer:
      return "optimizer";
    case Phase::Prefill:
      return "prefill";
    case Phase::Decode:
      return "decode";
    case Phase::Count:
      break;
  }
  return "?";
}

MemCategory current_mem_category() { return t_category; }
Phase current_phase() { return t_phase; }
const char* current_mem_label() { return t_label; }

namespace {
thread_local std::string t_cause;
}  // namespace
const std::string& current_mem_cause() { return t_cause; }
MemCauseScope::MemCauseScope(std::string cause) : prev_(std::move(t_cause)) {
  t_cause = std::move(cause);
}
MemCauseScope::~MemCauseScope() { t_cause = std::move(prev_); }

void throw_out_of_memory(DeviceType d, std::size_t bytes, MemCategory c, std::string_view detail) {
  const MemStats s = MemoryTracker::get(d).stats();
  std::string so_far;
  for (int i = 0; i < kNumMemCategories; ++i)
    if (s.current[i] > 0)
      so_far +=
          fmt::format("{}{} {}", so_far.empty() ? "" : ", ",
                      mem_category_name(static_cast<MemCategory>(i)), format_bytes(s.current[i]));
  const char* label = current_mem_label();
  const std::string& cause = current_mem_cause();
  throw OutOfMemory(fmt::format(
      "[allocator] {}: out of memory: {} ({} bytes) for {}{}{}; allocated so far {}{}{}{}",
      d == DeviceType::CPU    ? "cpu"
      : d == DeviceType::CUDA ? "cuda"
                              : "meta",
      format_bytes(static_cast<std::int64_t>(bytes)), bytes, mem_category_name(c),
      label && *label ? fmt::format(" in {}", label) : "",
      cause.empty() ? "" : fmt::format(", asked for by {}", cause), format_bytes(s.total),
      so_far.empty() ? "" : " (" + so_far + ")", detail.empty() ? "" : "; ", detail));
}

MemoryScope::MemoryScope(MemCategory c) : prev_(t_category) { t_category = c; }
MemoryScope::~MemoryScope() { t_category = prev_; }
PhaseScope::PhaseScope(Phase p) : prev_(t_phase) { t_phase = p; }
PhaseScope::~PhaseScope() { t_phase = prev_; }
MemLabelScope::MemLabelScope(const char* label) : prev_(t_label) { t_label = label; }
MemLabelScope::~MemLabelScope() { t_label = prev_; }

MemoryTracker& MemoryTracker::get(DeviceType d) {
  static MemoryTracker trackers[3];
  return trackers[static_cast<int>(d)];
}

void MemoryTracker::on_alloc(MemCategory c, std::int64_t bytes) {
  std::lock_guard lock(mu_);
  auto i = static_cast<std::size_t>(c);
  s_.current[i] += bytes;
  s_.total += bytes;
  s_.num_allocs++;
  if (s_.current[i] > s_.peak[i]) s_.peak[i] = s_.current[i];
  if (s_.total > s_.total_peak) {
    s_.total_peak = s_.total;
    s_.at_peak = s_.current;
    s_.peak_phase = t_phase;
    s_.peak_label = t_label;
  }
  if (timeline_on_) events_.push_back({seq_, c, t_phase, bytes, s_.total, t_label});
  seq_++;
}

void MemoryTracker::on_free(MemCategory c, std::int64_t bytes) {
  std::lock_guard lock(mu_);
  auto i = static_cast<std::size_t>(c);
  s_.current[i] -= bytes;
  s_.total -= bytes;
  s_.num_frees++;
  if (timeline_on_) events_.push_back({seq_, c, t_phase, -bytes, s_.total, t_label});
  seq_++;
}

void MemoryTracker::on_reserve(std::int64_t delta) {
  std::lock_guard lock(mu_);
  s_.reserved += delta;
  if (s_.reserved > s_.reserved_peak) s_.reserved_peak = s_.reserved;
}

void MemoryTracker::on_map(MemCategory c, std::int64_t bytes) {
  std::lock_guard lock(mu_);
  s_.mapped[static_cast<std::size_t>(c)] += bytes;
  s_.mapped_total += bytes;
  s_.mapped_total_peak = std::max(s_.mapped_total_peak, s_.mapped_total);
}

MemStats MemoryTracker::stats() const {
  std::lock_guard lock(mu_);
  return s_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard lock(mu_);
  s_.peak = s_.current;
  s_.total_peak = s_.total;
  s_.at_peak = s_.current;
  s_.peak_phase = t_phase;
  s_.peak_label = t_label;
  s_.reserved_peak = s_.reserved;
  s_.mapped_total_peak = s_.mapped_total;
  events_.clear();
}

void MemoryTracker::set_timeline(bool on) {
  std::lock_guard lock(mu_);
  timeline_on_ = on;
  if (!on) events_.clear();
}

std::vector<MemEvent> MemoryTracker::timeline() const {
  std::lock_guard lock(mu_);
  return events_;
}

void MemoryTracker::dump_timeline(const std::string& path) const {
  auto ev = timeline();
  std::ofstream f(path);
  KILN_CHECK(f.good(), "[memory] cannot open {} for writing", path);
  for (const auto& e : ev) {
    f << fmt::format(
             R"({{"seq":{},"category":"{}","phase":"{}","delta":{},"total":{},"label":"{}"}})",
             e.seq, mem_category_name(e.category), phase_name(e.phase), e.delta, e.total, e.label)
      << '\n';
  }
}

std::string format_bytes(std::int64_t b) {
  double v = static_cast<double>(b < 0 ? -b : b);
  const char* sign = b < 0 ? "-" : "";
  if (v < 1024) return fmt::format("{}{} B", sign, static_cast<std::int64_t>(v));
  if (v < 1024.0 * 1024) return fmt::format("{}{:.2f} KiB", sign, v / 1024);
  if (v < 1024.0 * 1024 * 1024) return fmt::format("{}{:.2f} MiB", sign, v / (1024.0 * 1024));
  return fmt::format("{}{:.2f} GiB", sign, v / (1024.0 * 1024 * 1024));
}

std::string format_device_memory(const DeviceMemoryRows& d) {
  std::string out;
  out += fmt::format("  {:<16} {:>12}   CUDA context {}{} + cuBLASLt/cuDNN {}\n", "runtime",
                     format_bytes(d.runtime()), format_bytes(d.context),
                     d.context_measured ? "" : " (with other processes: no NVML)",
                     format_bytes(d.libraries));
  out += fmt::format("  {:<16} {:>12}   driver used - kiln reserved - runtime{}\n", "unattributed",
                     format_bytes(d.unattributed()), d.other ? " - other processes" : "");
  out += fmt::format("  {:<16} {:>12}   of {} (kiln reserved {}, allocated {}{})\n", "driver used",
                     format_bytes(d.used), format_bytes(d.total), format_bytes(d.reserved),
                     format_bytes(d.allocated),
                     d.other ? fmt::format(", other processes {}", format_bytes(d.other)) : "");
  return out;
}

std::string format_memory_summary(const MemStats& s, std::string_view title,
                                  const DeviceMemoryRows* device) {
  std::string out = fmt::format("{}\n", title);
  out += fmt::format("  {:<16} {:>12} {:>12} {:>12}\n", "category", "current", "peak", "at peak");
  for (std::size_t i = 0; i < kNumMemCategories; ++i) {
    if (s.peak[i] == 0 && s.current[i] == 0) continue;
    out += fmt::format("  {:<16} {:>12} {:>12} {:>12}\n",
                       mem_category_name(static_cast<MemCategory>(i)), format_bytes(s.current[i]),
                       format_bytes(s.peak[i]), format_bytes(s.at_peak[i]));
  }
  out += fmt::format("  {:<16} {:>12} {:>12} {:>12}\n", "total", format_bytes(s.total),
                     format_bytes(s.total_peak), format_bytes(s.total_peak));
  if (s.reserved_peak > 0)
    out += fmt::format("  {:<16} {:>12} {:>12}\n", "allocator slack",
                       format_bytes(s.reserved - s.total),
                       format_bytes(s.reserved_peak - s.total_peak));
  if (s.mapped_total_peak > 0) {
    out += fmt::format("  mapped file pages, used in place (not allocated, not in the total):\n");
    for (std::size_t i = 0; i < kNumMemCategories; ++i)
      if (s.mapped[i] != 0)
        out +=
            fmt::format("  {:<16} {:>12}\n",
                        fmt::format("{} (mapped)", mem_category_name(static_cast<MemCategory>(i))),
                        format_bytes(s.mapped[i]));
    out += fmt::format("  {:<16} {:>12} {:>12}\n", "mapped total", format_bytes(s.mapped_total),
                       format_bytes(s.mapped_total_peak));
  }
  if (device) out += format_device_memory(*device);
  out += fmt::format("  global peak in phase '{}'{}\n", phase_name(s.peak_phase),
                     s.peak_label.empty() ? "" : fmt::format(", at {}", s.peak_label));
  return out;
}

}  // namespace kiln
