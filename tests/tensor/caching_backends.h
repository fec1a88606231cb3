// Test backends for the caching allocator (tensor/caching_allocator.h) on host memory, and the
// allocator's rules written out independently of its code: shared by test_caching_allocator.cpp
// and test_caching_allocator_guards.cpp.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/runtime.h"
#include "tensor/caching_allocator.h"

namespace kiln::test_caching {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;
using caching::round_size;

// Reference rules, written independently of the allocator's code.
inline std::size_t ref_round(std::size_t n) { return n % 512 == 0 ? n : n - n % 512 + 512; }
inline std::size_t ref_segment(std::size_t rounded) {
  if (rounded <= MiB) return 2 * MiB;
  if (rounded < 10 * MiB) return 20 * MiB;
  return rounded % (2 * MiB) == 0 ? rounded : rounded - rounded % (2 * MiB) + 2 * MiB;
}

// Real host memory, optionally limited: reserve() gives nullptr (or throws) once the total held
// would exceed the limit.
class MallocBackend final : public PoolBackend {
 public:
  explicit MallocBackend(std::size_t limit = SIZE_MAX, bool throw_on_fail = false)
      : limit_(limit), throw_(throw_on_fail) {}
  ~MallocBackend() override { EXPECT_EQ(held_, 0u) << "segments not released"; }
  void* reserve(std::size_t bytes) override {
    if (bytes > limit_ || held_ > limit_ - bytes) {
      refusals++;
      // A full device throws DeviceOutOfMemory (what cuda::device_malloc throws), not Error.
      if (throw_)
        throw cuda::DeviceOutOfMemory(fmt::format("[test] backend refused {} bytes", bytes));
      return nullptr;
    }
    // aligned_alloc wants a size that is a multiple of the alignment (the no-caching pool asks
    // for 512-byte blocks; ASan refuses anything else).
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p) held_ += bytes, reserves++;
    return p;
  }
  void release(void* p, std::size_t bytes) override {
    std::free(p);
    held_ -= bytes;
    releases++;
  }
  bool mem_info(std::size_t& free_bytes, std::size_t& total_bytes) override {
    if (limit_ == SIZE_MAX) return false;
    total_bytes = limit_;
    free_bytes = limit_ - held_;
    return true;
  }
  std::size_t held() const { return held_; }
  int reserves = 0, releases = 0, refusals = 0;

 private:
  std::size_t limit_;
  bool throw_;
  std::size_t held_ = 0;
};

// Host memory that supports guard bytes, as the CUDA backend does on the device.
class GuardedMallocBackend final : public PoolBackend {
 public:
  void* reserve(std::size_t bytes) override { return inner.reserve(bytes); }
  void release(void* p, std::size_t bytes) override { inner.release(p, bytes); }
  bool can_guard() const override { return true; }
  void fill(void* p, std::uint8_t value, std::size_t n) override {
    std::memset(p, value, n);
    fills++;
  }
  void read(void* host_dst, const void* p, std::size_t n) override {
    std::memcpy(host_dst, p, n);
    reads++;
  }
  MallocBackend inner;
  int fills = 0, reads = 0;
};

// Sets the guard size for one test and restores "off" after it, whatever happens.
struct GuardBytesScope {
  explicit GuardBytesScope(std::size_t n) { caching::set_guard_bytes(n); }
  ~GuardBytesScope() { caching::set_guard_bytes(0); }
};

inline std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
inline std::int64_t i64(std::size_t n) { return static_cast<std::int64_t>(n); }

}  // namespace kiln::test_caching
