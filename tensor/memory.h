// Memory accounting: every byte comes from an allocator, and the allocator
// charges it to the MemCategory of the innermost thread-local MemoryScope.
//
//   { MemoryScope scope(MemCategory::OptimizerState); m = zeros_like(p); }
//
// The tracker keeps, per device kind, current and peak bytes per category, the
// breakdown at the moment of the global peak (with the phase and the label of
// the op or layer that was running), and optionally a timeline of events.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/device.h"

namespace kiln {

enum class MemCategory : std::uint8_t {
  Weights,
  MasterWeights,   // fp32 master copies of bf16 weights
  Gradients,       // parameter gradients
  OptimizerState,  // AdamW m and v, SGD momentum
  Activations,     // alive after an op returns during forward (what autograd saves)
  KVCache,
  Logits,       // LM-head logits, per-row loss/lse and the logits' gradient: often
                // the largest buffers at large vocab, so shown apart
  Temporaries,  // scratch inside an op; activation gradients in backward
  Inputs,       // token batches
  Runtime,      // library workspaces
  Count
};
inline constexpr std::size_t kNumMemCategories = static_cast<std::size_t>(MemCategory::Count);
std::string_view mem_category_name(MemCategory c);

enum class Phase : std::uint8_t { Idle, Forward, Backward, Optimizer, Prefill, Decode, Count };
std::string_view phase_name(Phase p);

// Thread-local current category / phase / label. Scopes nest and restore.
MemCategory current_mem_category();
Phase current_phase();
const char* current_mem_label();

class MemoryScope {
 public:
  explicit MemoryScope(MemCategory c);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  MemCategory prev_;
};

class PhaseScope {
 public:
  explicit PhaseScope(Phase p);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase prev_;
};

// Names the op or layer running (for the breakdown at the peak). The string
// must outlive the scope (string literals, or a module's own name).
class MemLabelScope {
 public:
  explicit MemLabelScope(const char* label);
  ~MemLabelScope();
  MemLabelScope(const MemLabelScope&) = delete;
  MemLabelScope& operator=(const MemLabelScope&) = delete;

 private:
  const char* prev_;
};

// What asked for the allocations in this scope, in the user's words: the config field or flag
// ("max_position_embeddings 100000000000 x head_dim 128 (RoPE table)"). Only out-of-memory
// errors show it. Scopes nest and restore.
class MemCauseScope {
 public:
  explicit MemCauseScope(std::string cause);
  ~MemCauseScope();
  MemCauseScope(const MemCauseScope&) = delete;
  MemCauseScope& operator=(const MemCauseScope&) = delete;

 private:
  std::string prev_;
};
const std::string& current_mem_cause();

using CategoryBytes = std::array<std::int64_t, kNumMemCategories>;

struct MemEvent {
  std::int64_t seq;  // event number
  MemCategory category;
  Phase phase;
  std::int64_t delta;  // + allocation, - free (allocated bytes)
  std::int64_t total;  // allocated bytes after the event, all categories
  std::string label;
};

struct MemStats {
  CategoryBytes current{};  // allocated bytes alive now
  CategoryBytes peak{};     // per-category peak (each at its own moment)
  std::int64_t total = 0;
  std::int64_t total_peak = 0;
  CategoryBytes at_peak{};  // breakdown at the moment of total_peak
  Phase peak_phase = Phase::Idle;
  std::string peak_label;
  std::int64_t reserved = 0;  // bytes the allocator holds (>= total)
  std::int64_t reserved_peak = 0;
  std::int64_t num_allocs = 0;
  std::int64_t num_frees = 0;
  // File pages used in place (a weight tensor inside a read-only safetensors mapping): no
  // allocator holds them, so they are in none of the figures above. The kernel shares them with
  // the page cache; they count in the process's RSS once touched.
  CategoryBytes mapped{};
  std::int64_t mapped_total = 0, mapped_total_peak = 0;
};

// One tracker per device type (cpu, cuda, meta). Thread-safe.
class MemoryTracker {
 public:
  static MemoryTracker& get(DeviceType d);

  void on_alloc(MemCategory c, std::int64_t bytes);
  void on_free(MemCategory c, std::int64_t bytes);
  void on_reserve(std::int64_t delta);  // allocator-level reserve changes
  // Bytes used in place from a file mapping: + when a tensor starts using them, - when freed.
  void on_map(MemCategory c, std::int64_t bytes);

  MemStats stats() const;
  // Resets peaks to the current values (and clears the timeline); current
  // bytes stay, since the memory they describe is still alive.
  void reset_peaks();
  void set_timeline(bool on);
  std::vector<MemEvent> timeline() const;
  // JSON lines, one event per line.
  void dump_timeline(const std::string& path) const;

 private:
  mutable std::mutex mu_;
  MemStats s_;
  bool timeline_on_ = false;
  std::int64_t seq_ = 0;
  std::vector<MemEvent> events_;
};

// A CUDA device as the driver sees it, beside what kiln accounts for: the memory report's rows
// that no allocator can charge. Read at one moment (tensor/caching_allocator.h:
// cuda_device_memory). Bytes.
struct DeviceMemoryRows {
  std::int64_t total = 0;         // device memory (cudaMemGetInfo's total)
  std::int64_t used = 0;          // total - free: every process on the device
  std::int64_t other = 0;         // in use before kiln's context existed (other processes; NVML)
  std::int64_t reserved = 0;      // kiln's caching-allocator segments (allocated + slack)
  std::int64_t allocated = 0;     // of which in blocks in use
  std::int64_t context = 0;       // the CUDA context
  std::int64_t libraries = 0;     // cuBLASLt and cuDNN handles and workspaces
  bool context_measured = false;  // false: `context` also holds other processes' memory
  // Runtime row: the context and the libraries.
  std::int64_t runtime() const { return context + libraries; }
  // Unattributed row: the driver's used memory that kiln cannot name (lazily loaded kernels,
  // library allocations outside our allocator, ...). The goal is 0.
  std::int64_t unattributed() const { return used - other - reserved - runtime(); }
};

// A readable table: category, current, peak, at-peak; with `device`, also the Runtime and
// Unattributed rows and the driver's figure.
std::string format_memory_summary(const MemStats& s, std::string_view title,
                                  const DeviceMemoryRows* device = nullptr);
// The device rows alone, a few indented lines.
std::string format_device_memory(const DeviceMemoryRows& d);
std::string format_bytes(std::int64_t bytes);

// Throws OutOfMemory: "[allocator] <device>: out of memory: <bytes> for <category> ...", with the
// label and cause in scope and the tracker's figures so far. `detail` adds the allocator's view.
[[noreturn]] void throw_out_of_memory(DeviceType d, std::size_t bytes, MemCategory c,
                                      std::string_view detail);

}  // namespace kiln
