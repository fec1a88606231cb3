// The caching allocator's logic (BlockPool), its CUDA backend, and the meta simulation. The
// rules are stated in caching_allocator.h; this file keeps to them.
#include "tensor/caching_allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cuda/runtime.h"

namespace kiln {

namespace caching {

std::size_t round_size(std::size_t nbytes) {
  KILN_CHECK(nbytes <= kMaxRequest, "[allocator] request of {} bytes is too large", nbytes);
  return (nbytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes;
}

bool is_small(std::size_t rounded) { return rounded <= kSmallMax; }

std::size_t segment_size(std::size_t rounded) {
  if (is_small(rounded)) return kSmallSegment;
  if (rounded < kLargeMin) return kLargeSegment;
  return (rounded + kLargeRound - 1) / kLargeRound * kLargeRound;
}

namespace {

std::size_t guard_bytes_from_env() {
  const char* v = std::getenv("KILN_GUARD_BYTES");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || n > kMaxGuardBytes) {
    std::fprintf(stderr, "kiln: ignoring KILN_GUARD_BYTES=%s (want 0..%zu)\n", v, kMaxGuardBytes);
    return 0;
  }
  return static_cast<std::size_t>(n);
}

std::atomic<std::size_t>& guard_setting() {
  static std::atomic<std::size_t> g{guard_bytes_from_env()};
  return g;
}

}  // namespace

void set_guard_bytes(std::size_t n) {
  KILN_CHECK(n <= kMaxGuardBytes, "[allocator] guard bytes {} exceed the limit of {}", n,
             kMaxGuardBytes);
  guard_setting().store(n);
}

std::size_t guard_bytes() { return guard_setting().load(); }

GuardLayout guard_layout(std::size_t nbytes, std::size_t guard) {
  KILN_CHECK(guard <= kMaxGuardBytes, "[allocator] guard bytes {} exceed the limit of {}", guard,
             kMaxGuardBytes);
  GuardLayout g;
  g.charged = round_size(nbytes);
  if (nbytes == 0 || guard == 0) {
    g.block_bytes = g.charged;
    g.guard_offset = nbytes;
    return g;
  }
  KILN_CHECK(nbytes <= kMaxRequest - guard, "[allocator] request of {} bytes is too large", nbytes);
  g.block_bytes = round_size(nbytes + guard);
  g.guard_offset = nbytes;
  g.guard_len = guard;
  return g;
}

GuardCheck check_guard_bytes(const std::uint8_t* guard, std::size_t n, std::uint8_t pattern) {
  GuardCheck c;
  for (std::size_t i = 0; i < n; ++i) {
    if (guard[i] == pattern) continue;
    if (c.bad == 0) c.first = i;
    c.last = i;
    c.bad++;
  }
  return c;
}

}  // namespace caching

// ---- CountingBackend -----------------------------------------------------------------------

void* CountingBackend::reserve(std::size_t bytes) {
  if (bytes > capacity_ || reserved_ > capacity_ - bytes) return nullptr;
  // Fake addresses only ever grow; 2^44 + 2^63 bytes of reservations would be needed to wrap.
  const std::uintptr_t p = next_;
  const std::uintptr_t step =
      (bytes + caching::kLargeRound - 1) / caching::kLargeRound * caching::kLargeRound;
  KILN_CHECK(next_ <= UINTPTR_MAX - step, "[allocator] meta: fake address space exhausted");
  next_ += step;
  reserved_ += bytes;
  return reinterpret_cast<void*>(p);
}

void CountingBackend::release(void*, std::size_t bytes) { reserved_ -= bytes; }

bool CountingBackend::mem_info(std::size_t& free_bytes, std::size_t& total_bytes) {
  if (capacity_ == SIZE_MAX) return false;
  total_bytes = capacity_;
  free_bytes = reserved_ >= capacity_ ? 0 : capacity_ - reserved_;  // capacity may have shrunk
  return true;
}

// ---- BlockPool -----------------------------------------------------------------------------

BlockPool::BlockPool(PoolBackend& backend, MemoryTracker* tracker, std::string name, bool caching)
    : backend_(backend), tracker_(tracker), name_(std::move(name)), caching_(caching) {}

BlockPool::~BlockPool() {
  std::lock_guard lock(mu_);
  release_free_segments();
  // Blocks still in use (a tensor outlived the pool) keep their segments: leaked, not freed
  // under a live pointer. Free blocks of those segments go with them.
  for (auto* set : {&small_free_, &large_free_}) {
    for (Block* b : *set) delete b;
    set->clear();
  }
  for (auto& [addr, b] : active_) delete b;
}

BlockPool::Block* BlockPool::reserve_segment(std::size_t rounded, bool small) {
  // Without caching, the segment is the block itself, so compute-sanitizer sees its bounds.
  const std::size_t seg = caching_ ? caching::segment_size(rounded) : rounded;
  // Only out-of-memory (nullptr, or DeviceOutOfMemory) is worth releasing the cache for; any
  // other error (a sticky illegal address, a lost device) propagates as it is, with nothing
  // changed here yet, so the accounting stays as it was.
  auto try_reserve = [&](std::string& why) -> void* {
    try {
      return backend_.reserve(seg);
    } catch (const cuda::DeviceOutOfMemory& e) {
      why = e.what();
      return nullptr;
    }
  };
  std::string why;
  void* p = try_reserve(why);
  if (!p) {
    // The device is full: give back what the cache holds and ask once more.
    s_.num_cache_flushes++;
    if (release_free_segments() > 0) p = try_reserve(why);
  }
  if (!p) out_of_memory(rounded, why);
  auto* b = new Block;
  b->addr = reinterpret_cast<std::uintptr_t>(p);
  b->size = seg;
  b->segment = static_cast<std::uint64_t>(s_.num_segment_allocs);
  b->small = small;
  s_.reserved += seg;
  s_.reserved_peak = std::max(s_.reserved_peak, s_.reserved);
  s_.segments++;
  s_.num_segment_allocs++;
  if (tracker_) tracker_->on_reserve(static_cast<std::int64_t>(seg));
  return b;
}

void BlockPool::out_of_memory(std::size_t rounded, const std::string& why) {
  s_.num_ooms++;
  std::size_t free_b = 0, total_b = 0;
  std::string device;
  bool known = false;
  try {
    known = backend_.mem_info(free_b, total_b);
  } catch (const Error&) {
    known = false;
  }
  device = known ? fmt::format("free {} of {}", format_bytes(static_cast<std::int64_t>(free_b)),
                               format_bytes(static_cast<std::int64_t>(total_b)))
                 : std::string("free ? of ?");
  auto b = [](std::size_t n) { return format_bytes(static_cast<std::int64_t>(n)); };
  const std::string& cause = current_mem_cause();
  throw OutOfMemory(fmt::format(
      "[allocator] {}: out of memory: requested {}, reserved {}, allocated {} ({}); a new {} "
      "segment was refused after releasing the cache{}{}{}",
      name_, b(rounded), b(s_.reserved), b(s_.allocated), device, b(caching::segment_size(rounded)),
      why.empty() ? "" : ": ", why, cause.empty() ? "" : "; asked for by " + cause));
}

std::size_t BlockPool::release_free_segments() {
  std::size_t released = 0;
  for (auto* set : {&small_free_, &large_free_}) {
    std::vector<Block*> whole;
    for (Block* b : *set)
      if (!b->prev && !b->next) whole.push_back(b);
    for (Block* b : whole) released += release_segment(*set, b);
  }
  return released;
}

std::size_t BlockPool::release_segment(FreeSet& set, Block* b) {
  // The device first: if it fails, the segment is still a free block of the pool and every
  // counter still includes it, so the error propagates with the accounting consistent.
  backend_.release(reinterpret_cast<void*>(b->addr), b->size);
  const std::size_t size = b->size;
  set.erase(b);
  free_block_count_--;
  s_.reserved -= size;
  s_.segments--;
  if (tracker_) tracker_->on_reserve(-static_cast<std::int64_t>(size));
  delete b;
  return size;
}

void* BlockPool::allocate(std::size_t nbytes, MemCategory c) {
  const std::size_t guard = nbytes > 0 && backend_.can_guard() ? caching::guard_bytes() : 0;
  const caching::GuardLayout layout = caching::guard_layout(nbytes, guard);
  const std::size_t rounded = layout.charged;  // what the tracker is charged
  if (rounded == 0) {
    if (tracker_) tracker_->on_alloc(c, 0);  // counted as an event, charged nothing
    return nullptr;
  }
  // The block: the rounded request, or with guards the rounded request plus guard. Pool,
  // segment and split decisions follow the block's size.
  const std::size_t need = layout.block_bytes;
  const bool small = caching::is_small(need);
  std::lock_guard lock(mu_);
  FreeSet& pool = pool_of(small);
  Block key;  // sorts before every free block of at least `need` bytes
  key.size = need;
  Block* b = nullptr;
  if (!caching_) {
    b = reserve_segment(need, small);  // a segment of exactly the block: nothing to split
  } else if (auto it = pool.lower_bound(&key); it != pool.end()) {
    b = *it;
    pool.erase(it);
    free_block_count_--;
  } else {
    b = reserve_segment(need, small);
  }
  const std::size_t rest = b->size - need;
  if (rest >= (small ? caching::kSmallSplitMin : caching::kLargeSplitMin)) {
    auto* tail = new Block;
    tail->addr = b->addr + need;
    tail->size = rest;
    tail->segment = b->segment;
    tail->small = small;
    tail->prev = b;
    tail->next = b->next;
    if (b->next) b->next->prev = tail;
    b->next = tail;
    b->size = need;
    pool.insert(tail);
    free_block_count_++;
  }
  b->allocated = true;
  b->charged = rounded;
  b->requested = nbytes;
  b->guard = layout.guard_len;
  b->category = c;
  if (b->guard > 0) {
    try {
      backend_.fill(reinterpret_cast<void*>(b->addr + layout.guard_offset), caching::kGuardPattern,
                    b->guard);
    } catch (...) {
      // Give the block back untouched by the accounting, then report the device's error.
      b->allocated = false;
      b->charged = b->requested = b->guard = 0;
      insert_free(b);
      throw;
    }
  }
  active_.emplace(b->addr, b);
  s_.allocated += rounded;
  s_.allocated_peak = std::max(s_.allocated_peak, s_.allocated);
  s_.block_bytes += b->size;
  s_.num_allocs++;
  if (tracker_) tracker_->on_alloc(c, static_cast<std::int64_t>(rounded));
  return reinterpret_cast<void*>(b->addr);
}

std::string BlockPool::check_block_guard(const Block& b) {
  if (b.guard == 0) return "";
  std::vector<std::uint8_t> host(b.guard);
  try {
    backend_.read(host.data(), reinterpret_cast<const void*>(b.addr + b.requested), b.guard);
  } catch (const std::exception& e) {
    return fmt::format("{} block {:#x} (requested {} bytes, {}): guard not readable: {}", name_,
                       b.addr, b.requested, mem_category_name(b.category), e.what());
  } catch (...) {
    return fmt::format("{} block {:#x} (requested {} bytes, {}): guard not readable", name_, b.addr,
                       b.requested, mem_category_name(b.category));
  }
  const caching::GuardCheck c = caching::check_guard_bytes(host.data(), host.size());
  if (c.bad == 0) return "";
  return fmt::format(
      "{} block {:#x} (requested {} bytes, block {} bytes, {}): {} of {} guard bytes "
      "overwritten, at bytes {}..{} past the end",
      name_, b.addr, b.requested, b.size, mem_category_name(b.category), c.bad, b.guard, c.first,
      c.last);
}

std::vector<std::string> BlockPool::check_guards() {
  std::lock_guard lock(mu_);
  std::vector<std::string> out = std::move(guard_violations_);
  guard_violations_.clear();
  std::vector<const Block*> live;
  for (const auto& [addr, b] : active_)
    if (b->guard > 0) live.push_back(b);
  // Address order, so that reports are stable from run to run on the same layout.
  std::sort(live.begin(), live.end(),
            [](const Block* x, const Block* y) { return x->addr < y->addr; });
  for (const Block* b : live)
    if (std::string v = check_block_guard(*b); !v.empty()) out.push_back(std::move(v));
  return out;
}

void BlockPool::deallocate(void* p, MemCategory c) {
  if (!p) {
    if (tracker_) tracker_->on_free(c, 0);
    return;
  }
  std::lock_guard lock(mu_);
  auto it = active_.find(reinterpret_cast<std::uintptr_t>(p));
  KILN_CHECK(it != active_.end(), "[allocator] {}: free of {} which is not an allocated block",
             name_, p);
  Block* b = it->second;
  if (b->guard > 0) {
    // Never throws: this runs in destructors. A violation is kept for check_guards() and
    // printed now, while the block's owner is still on the stack.
    std::string v = check_block_guard(*b);
    if (!v.empty()) {
      std::fprintf(stderr, "kiln: guard bytes overwritten (found at free): %s\n", v.c_str());
      guard_violations_.push_back(std::move(v));
    }
  }
  active_.erase(it);
  s_.allocated -= b->charged;
  s_.block_bytes -= b->size;
  if (tracker_) tracker_->on_free(b->category, static_cast<std::int64_t>(b->charged));
  b->allocated = false;
  b->charged = b->requested = b->guard = 0;
  insert_free(b);
  // Without caching the block is its own segment, whole and free now: back to the device.
  if (!caching_) release_segment(pool_of(b->small), b);
}

void BlockPool::insert_free(Block* b) {
  FreeSet& pool = pool_of(b->small);
  // Merge with free neighbours: the block absorbs them, so its address stays the lowest.
  if (Block* n = b->next; n && !n->allocated) {
    pool.erase(n);
    free_block_count_--;
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  if (Block* q = b->prev; q && !q->allocated) {
    pool.erase(q);  // its key (size) changes below
    free_block_count_--;
    q->size += b->size;
    q->next = b->next;
    if (b->next) b->next->prev = q;
    delete b;
    b = q;
  }
  pool.insert(b);
  free_block_count_++;
}

std::size_t BlockPool::empty_cache() {
  std::lock_guard lock(mu_);
  return release_free_segments();
}

PoolStats BlockPool::stats() const {
  std::lock_guard lock(mu_);
  PoolStats s = s_;
  s.active_blocks = active_.size();
  s.free_blocks = free_block_count_;
  s.largest_free = 0;
  if (!small_free_.empty()) s.largest_free = (*small_free_.rbegin())->size;
  if (!large_free_.empty())
    s.largest_free = std::max(s.largest_free, (*large_free_.rbegin())->size);
  return s;
}

std::size_t BlockPool::block_size(const void* p) const {
  std::lock_guard lock(mu_);
  auto it = active_.find(reinterpret_cast<std::uintptr_t>(p));
  return it == active_.end() ? 0 : it->second->size;
}

// ---- CUDA ----------------------------------------------------------------------------------

namespace {

// Segments from cudaMalloc on one device; the current device is switched for the call and
// restored, so tensors on cuda:1 can be made while cuda:0 is current.
class CudaBackend final : public PoolBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  void* reserve(std::size_t bytes) override {
    DeviceGuard g(device_);
    return cuda::device_malloc(bytes);
  }
  void release(void* p, std::size_t) override {
    DeviceGuard g(device_);
    cuda::device_free(p);
  }
  bool mem_info(std::size_t& free_bytes, std::size_t& total_bytes) override {
    DeviceGuard g(device_);
    const cuda::MemInfo m = cuda::mem_get_info();
    free_bytes = m.free_bytes;
    total_bytes = m.total_bytes;
    return true;
  }
  bool can_guard() const override { return true; }
  // On the legacy default stream, like every kernel: the fill lands after the kernels that
  // used the block before, and the read after the ones that wrote it.
  void fill(void* p, std::uint8_t value, std::size_t n) override {
    DeviceGuard g(device_);
    cuda::memset_async(p, value, n);
  }
  void read(void* host_dst, const void* p, std::size_t n) override {
    DeviceGuard g(device_);
    cuda::memcpy_d2h(host_dst, p, n);
  }

 private:
  struct DeviceGuard {
    explicit DeviceGuard(int d) : prev(cuda::current_device()) {
      if (prev != d) cuda::set_device(d);
    }
    ~DeviceGuard() {
      if (prev != cuda::current_device()) {
        try {
          cuda::set_device(prev);
        } catch (const Error&) {  // nothing sensible to do in a destructor
        }
      }
    }
    int prev;
  };
  int device_;
};

}  // namespace

CudaCachingAllocator::CudaCachingAllocator(int device)
    : device_(device),
      backend_(std::make_unique<CudaBackend>(device)),
      pool_(std::make_unique<BlockPool>(
          *backend_, &MemoryTracker::get(DeviceType::CUDA),
          device == 0 ? std::string("cuda") : fmt::format("cuda:{}", device),
          !caching::no_caching_from_env())) {}

CudaCachingAllocator::~CudaCachingAllocator() = default;

void* CudaCachingAllocator::allocate(std::size_t nbytes, MemCategory c) {
  return pool_->allocate(nbytes, c);
}

void CudaCachingAllocator::deallocate(void* p, std::size_t, MemCategory c) {
  pool_->deallocate(p, c);
}

std::size_t CudaCachingAllocator::empty_cache() { return pool_->empty_cache(); }
PoolStats CudaCachingAllocator::stats() const { return pool_->stats(); }

namespace caching {

bool no_caching_from_env() {
  const char* v = std::getenv("KILN_NO_CACHING");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

std::vector<std::string> check_guards() {
  std::vector<std::string> out;
  if (!cuda::compiled_with_cuda()) return out;
  const int n = cuda::device_count();
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> v = cuda_caching_allocator(i).check_guards();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace caching

CudaCachingAllocator& cuda_caching_allocator(int index) {
  KILN_CHECK(cuda::compiled_with_cuda(),
             "[allocator] cuda: kiln was built without CUDA (configure with -DKILN_CUDA=ON)");
  // One per visible device, made once (constructing one touches no device); never destroyed,
  // see the header. After this, a lookup takes no lock.
  static const std::vector<CudaCachingAllocator*> per_device = [] {
    std::vector<CudaCachingAllocator*> v;
    for (int i = 0; i < cuda::device_count(); ++i) v.push_back(new CudaCachingAllocator(i));
    return v;
  }();
  KILN_CHECK(index >= 0 && static_cast<std::size_t>(index) < per_device.size(),
             "[allocator] cuda:{} is not a visible device ({} found)", index, per_device.size());
  return *per_device[static_cast<std::size_t>(index)];
}

DeviceMemoryRows cuda_device_memory(int index) {
  CudaCachingAllocator& alloc = cuda_caching_allocator(index);
  const int prev = cuda::current_device();
  if (prev != index) cuda::set_device(index);
  DeviceMemoryRows d;
  try {
    const PoolStats ps = alloc.stats();
    const cuda::MemInfo m = cuda::mem_get_info();
    const cuda::RuntimeBytes r = cuda::runtime_bytes();
    auto i64 = [](std::size_t n) { return static_cast<std::int64_t>(n); };
    d.total = i64(m.total_bytes);
    d.used = i64(m.total_bytes - m.free_bytes);
    d.other = i64(r.other_processes);
    d.reserved = i64(ps.reserved);
    d.allocated = i64(ps.allocated);
    d.context = i64(r.context);
    d.libraries = i64(r.libraries());
    d.context_measured = r.context_measured;
  } catch (...) {
    if (prev != index) cuda::set_device(prev);
    throw;
  }
  if (prev != index) cuda::set_device(prev);
  return d;
}

// ---- meta simulation -----------------------------------------------------------------------

namespace {
CountingBackend& meta_backend() {
  static auto* b = new CountingBackend();  // never destroyed, like the pool on it
  return *b;
}
}  // namespace

BlockPool& meta_cuda_pool() {
  static auto* p = new BlockPool(meta_backend(), &MemoryTracker::get(DeviceType::Meta), "cuda");
  return *p;
}

void set_meta_cuda_capacity(std::size_t bytes) {
  (void)meta_cuda_pool();  // the pool exists before the backend's limit changes under it
  meta_backend().set_capacity(bytes);
}

std::size_t empty_meta_cuda_cache() { return meta_cuda_pool().empty_cache(); }

}  // namespace kiln
