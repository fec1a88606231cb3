// Storage: one allocation on one device, charged to one MemCategory for its
// whole life. Allocators decide the bytes charged (rounding), so the meta
// device can charge exactly what a real device would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/device.h"
#include "tensor/memory.h"

namespace kiln {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns the pointer (nullptr for meta) and charges the tracker.
  virtual void* allocate(std::size_t nbytes, MemCategory c) = 0;
  virtual void deallocate(void* p, std::size_t nbytes, MemCategory c) = 0;
  // Bytes charged to the tracker for a request of nbytes.
  virtual std::size_t charged_size(std::size_t nbytes) const = 0;
};

// The allocator that serves a device. CPU: 64-byte aligned heap memory with a
// small size-bucketed cache for large blocks. Meta: no memory, same charges
// as the CPU allocator (or the CUDA one, see set_meta_simulates()).
Allocator& allocator_for(Device d);
void set_meta_simulates(DeviceType d);
DeviceType meta_simulates();

// RAII: the meta device simulates `d` inside one scope and what it simulated before after it
// (the budget's dry runs, the SimulatedCuda tests).
class MetaSimulatesScope {
 public:
  explicit MetaSimulatesScope(DeviceType d) : prev_(meta_simulates()) { set_meta_simulates(d); }
  ~MetaSimulatesScope() { set_meta_simulates(prev_); }
  MetaSimulatesScope(const MetaSimulatesScope&) = delete;
  MetaSimulatesScope& operator=(const MetaSimulatesScope&) = delete;

 private:
  DeviceType prev_;
};
// Drops cached CPU blocks (they are not charged to any category, but count as
// reserved/slack).
void empty_cpu_cache();

class Storage {
 public:
  Storage(std::size_t nbytes, Device device, MemCategory category);
  // Bytes kiln did not allocate, used in place (CPU only): a weight inside a read-only file
  // mapping. Nothing is allocated or freed; `keep_alive` (the mapping) lives as long as this
  // Storage. The tracker counts the bytes as mapped in `category`, apart from allocations.
  Storage(const void* data, std::size_t nbytes, MemCategory category,
          std::shared_ptr<const void> keep_alive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  MemCategory category() const { return category_; }
  // True for bytes used in place from a mapping (read-only: writing them faults).
  bool mapped() const { return keep_alive_ != nullptr; }

 private:
  void* data_ = nullptr;
  std::size_t nbytes_;
  Device device_;
  MemCategory category_;
  std::shared_ptr<const void> keep_alive_;
};

}  // namespace kiln
