#include "tensor/storage.h"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "kernels/common/error.h"
#include "kernels/cuda/runtime.h"
#include "tensor/caching_allocator.h"

namespace kiln {

namespace {

constexpr std::size_t kCpuAlign = 64;
std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Blocks of at least this size are cached on free and reused for requests of
// the same rounded size: training allocates the same shapes every step, and
// fresh large blocks from the OS cost page faults on first touch.
constexpr std::size_t kCacheMinBytes = 64 * 1024;
constexpr std::size_t kCacheMaxBytes = std::size_t{1} << 30;

std::size_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                               : 0;
}

class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t nbytes, MemCategory c) override {
    std::size_t sz = charged_size(nbytes);
    void* p = nullptr;
    if (sz >= kCacheMinBytes) {
      std::lock_guard lock(mu_);
      auto it = cache_.find(sz);
      if (it != cache_.end()) {
        p = it->second;
        cache_.erase(it);
        cached_bytes_ -= sz;
      }
    }
    if (!p) {
      // A request beyond the machine's RAM is refused before malloc: with overcommit it might
      // "succeed" and be killed later, far from the cause.
      static const std::size_t ram = physical_memory();
      if (ram > 0 && sz > ram)
        throw_out_of_memory(
            DeviceType::CPU, sz, c,
            fmt::format("the machine has {} of RAM", format_bytes(static_cast<std::int64_t>(ram))));
      p = std::aligned_alloc(kCpuAlign, sz == 0 ? kCpuAlign : sz);
      if (!p) {
        empty();
        p = std::aligned_alloc(kCpuAlign, sz == 0 ? kCpuAlign : sz);
      }
      if (!p) throw_out_of_memory(DeviceType::CPU, sz, c, "malloc failed");
      MemoryTracker::get(DeviceType::CPU).on_reserve(static_cast<std::int64_t>(sz));
    }
    MemoryTracker::get(DeviceType::CPU).on_alloc(c, static_cast<std::int64_t>(sz));
    return p;
  }
  void deallocate(void* p, std::size_t nbytes, MemCategory c) override {
    std::size_t sz = charged_size(nbytes);
    MemoryTracker::get(DeviceType::CPU).on_free(c, static_cast<std::int64_t>(sz));
    if (sz >= kCacheMinBytes) {
      std::lock_guard lock(mu_);
      if (cached_bytes_ + sz <= kCacheMaxBytes) {
        cache_.emplace(sz, p);
        cached_bytes_ += sz;
        return;
      }
    }
    std::free(p);
    MemoryTracker::get(DeviceType::CPU).on_reserve(-static_cast<std::int64_t>(sz));
  }
  std::size_t charged_size(std::size_t nbytes) const override {
    return round_up(nbytes, kCpuAlign);
  }
  void empty() {
    std::lock_guard lock(mu_);
    for (auto& [sz, p] : cache_) {
      std::free(p);
      MemoryTracker::get(DeviceType::CPU).on_reserve(-static_cast<std::int64_t>(sz));
    }
    cache_.clear();
    cached_bytes_ = 0;
  }

 private:
  std::mutex mu_;
  std::multimap<std::size_t, void*> cache_;
  std::size_t cached_bytes_ = 0;
};

DeviceType g_meta_simulates = DeviceType::CPU;

// Simulating CPU: one reserve per allocation, as the CPU allocator without its
// cache. Simulating CUDA: the caching allocator's own BlockPool on fake
// addresses (tensor/caching_allocator.h), so reserved and slack match the GPU.
class MetaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t nbytes, MemCategory c) override {
    if (g_meta_simulates == DeviceType::CUDA) return meta_cuda_pool().allocate(nbytes, c);
    auto sz = static_cast<std::int64_t>(charged_size(nbytes));
    auto& t = MemoryTracker::get(DeviceType::Meta);
    t.on_reserve(sz);
    t.on_alloc(c, sz);
    return nullptr;
  }
  // Only simulated CUDA blocks have (fake) addresses: the pointer, not the
  // current mode, says which way a block was charged, since the mode may
  // change while tensors are alive.
  void deallocate(void* p, std::size_t nbytes, MemCategory c) override {
    if (p) return meta_cuda_pool().deallocate(p, c);
    auto sz = static_cast<std::int64_t>(round_up(nbytes, kCpuAlign));
    auto& t = MemoryTracker::get(DeviceType::Meta);
    t.on_free(c, sz);
    t.on_reserve(-sz);
  }
  std::size_t charged_size(std::size_t nbytes) const override {
    return g_meta_simulates == DeviceType::CUDA ? caching::round_size(nbytes)
                                                : round_up(nbytes, kCpuAlign);
  }
};

CpuAllocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();  // never destroyed: tensors may outlive statics
  return *a;
}

}  // namespace

void set_meta_simulates(DeviceType d) { g_meta_simulates = d; }
DeviceType meta_simulates() { return g_meta_simulates; }
void empty_cpu_cache() { cpu_allocator().empty(); }

Allocator& allocator_for(Device d) {
  static MetaAllocator meta;
  switch (d.type) {
    case DeviceType::CPU:
      return cpu_allocator();
    case DeviceType::Meta:
      return meta;
    case DeviceType::CUDA: {
      static const int num_devices = cuda::device_count();  // 0 without CUDA or a GPU
      if (num_devices > 0) return cuda_caching_allocator(d.index);
      break;
    }
  }
  if (!cuda::compiled_with_cuda())
    fail("[allocator] {}: kiln was built without CUDA (-DKILN_CUDA=ON); use --device cpu", d.str());
  fail("[allocator] {}: no CUDA device found; use --device cpu", d.str());
}

Storage::Storage(std::size_t nbytes, Device device, MemCategory category)
    : nbytes_(nbytes), device_(device), category_(category) {
  data_ = allocator_for(device).allocate(nbytes, category);
}

Storage::Storage(const void* data, std::size_t nbytes, MemCategory category,
                 std::shared_ptr<const void> keep_alive)
    : data_(const_cast<void*>(data)),
      nbytes_(nbytes),
      device_(Device::cpu()),
      category_(category),
      keep_alive_(std::move(keep_alive)) {
  KILN_CHECK(keep_alive_ != nullptr, "[storage] mapped bytes need an owner that keeps them alive");
  MemoryTracker::get(DeviceType::CPU).on_map(category, static_cast<std::int64_t>(nbytes));
}

Storage::~Storage() {
  if (keep_alive_)
    MemoryTracker::get(DeviceType::CPU).on_map(category_, -static_cast<std::int64_t>(nbytes_));
  else
    allocator_for(device_).deallocate(data_, nbytes_, category_);
}

}  // namespace kiln
