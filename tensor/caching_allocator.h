// The CUDA caching allocator, and the same logic run on fake addresses for the meta device's
// dry run (set_meta_simulates(DeviceType::CUDA)), so the dry run's reserved and slack figures are
// the ones the GPU would show for the same sequence of allocations.
//
// cudaMalloc is slow and synchronizes; training allocates the same shapes every step. So memory
// is taken from the device in segments and carved into blocks, and a freed block goes back to a
// pool, not to the driver. The rules (our own; similar in spirit to PyTorch's allocator, simpler):
//
//   rounding   a request of n > 0 bytes becomes a block of round_up(n, 512) bytes (kRoundBytes);
//              this is what the tracker is charged (charged_size). n == 0 gives nullptr and
//              charges 0 bytes (the event is still counted).
//   pools      rounded size <= 1 MiB (kSmallMax): the small pool; larger: the large pool. A
//              request only ever takes a block from its own pool, so small tensors never
//              fragment the big segments.
//   segments   the small pool grows by 2 MiB segments (kSmallSegment). The large pool grows by
//              20 MiB segments (kLargeSegment) for requests < 10 MiB (kLargeMin), and by
//              round_up(size, 2 MiB) segments for larger requests.
//   best fit   the free blocks of a pool are ordered by (size, segment, address); a request
//              takes the smallest free block that is big enough; among equal sizes, the one in
//              the oldest segment (segments are numbered as they are reserved), then the lowest
//              address. Segment order rather than device address decides ties, so the choice
//              never depends on where the driver placed a segment: the meta simulation on fake
//              addresses makes exactly the choices the GPU does.
//   split      a block larger than the request is split when the remainder is >= 512 bytes
//              (small pool) or >= 1 MiB (large pool); the remainder becomes a free block. An
//              unsplit remainder (< 1 MiB, large pool) stays inside the allocated block and
//              shows as slack, since only the rounded request is charged.
//   merge      a freed block merges with its free neighbours in the same segment.
//   release    empty_cache() gives fully free segments back to the device. Nothing else does,
//              except the out-of-memory path: when the device refuses a new segment, every fully
//              free segment is released and the segment is asked for once more; if that fails
//              too, kiln::Error "[allocator] cuda: out of memory: requested X, reserved Y,
//              allocated Z (free F of T); a new S segment was refused ...".
//
// Accounting, with the MemoryTracker of the pool's device kind:
//   allocated  sum of the rounded sizes of blocks in use: on_alloc / on_free per block, charged
//              to the MemCategory the caller passes (the thread's MemoryScope).
//   reserved   sum of the segment sizes held: on_reserve(+segment) / on_reserve(-segment).
//   so "allocator slack" = reserved - allocated is exactly the bytes the pool holds but no tensor
//   uses (free blocks, unsplit remainders).
//
// Streams: blocks are not tied to streams. A freed block is reused at once, which is safe while
// all kernels run on one stream (stream order makes the next user wait for the last one). Code
// that frees memory still in use by another stream must synchronize first.
//
// Guard bytes (a debug mode for the backend-ops test): with caching::set_guard_bytes(g), or the
// environment variable KILN_GUARD_BYTES=g, every block allocated from then on is followed by g
// guard bytes filled with kGuardPattern; they are checked when the block is freed and by
// caching::check_guards(). The guard starts right after the requested bytes, not after the
// rounding, so a one-byte overrun is caught; the block itself becomes round_up(n + g, 512).
// The tracker is still charged round_up(n, 512), so allocated figures do not change (reserved
// and slack do, by the guards). Off (g = 0, the default), nothing changes at all. Only backends
// with memory (CUDA, the tests' malloc) guard; the meta simulation never does. On CUDA the fill
// is a cudaMemsetAsync and the check a copy to the host, both on the legacy default stream in
// order with the kernels; the check at free time synchronizes that stream, so this is a debug
// mode (tests, compute-sanitizer runs), not one to time.
//
// No caching (a debug mode for compute-sanitizer runs): with KILN_NO_CACHING=1 in the
// environment when the CUDA allocator of a device is made, every block is its own cudaMalloc of
// exactly the block's size (round_up(n + guard, 512)) and goes back with cudaFree when freed. So
// memcheck knows each tensor's bounds and reports an overrun into a neighbouring tensor, which
// inside one shared 2/20 MiB segment it cannot see. The rounding and the tracker's charges are
// unchanged; reserved equals the blocks in use; it is slow (a cudaMalloc/cudaFree per tensor).
//
// Errors: only out of memory (reserve() returning nullptr, or throwing cuda::DeviceOutOfMemory)
// releases the cache and retries. Any other error of reserve() or release() propagates with its
// own message, and the pool's accounting is left as it was before the failed call.
//
// Thread-safe: one mutex per pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/memory.h"
#include "tensor/storage.h"

namespace kiln {

namespace caching {
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kRoundBytes = 512;          // block granularity
inline constexpr std::size_t kSmallMax = 1 * kMiB;       // largest small-pool block
inline constexpr std::size_t kSmallSegment = 2 * kMiB;   // small-pool segment
inline constexpr std::size_t kLargeMin = 10 * kMiB;      // below this, a 20 MiB segment
inline constexpr std::size_t kLargeSegment = 20 * kMiB;  // large-pool segment for < kLargeMin
inline constexpr std::size_t kLargeRound = 2 * kMiB;     // larger segments round to this
inline constexpr std::size_t kSmallSplitMin = 512;       // split if the remainder is at least
inline constexpr std::size_t kLargeSplitMin = 1 * kMiB;
// Larger requests are refused before rounding could overflow (no device has 2^60 bytes).
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 60;

// round_up(n, 512); 0 for 0. Throws for n > kMaxRequest.
std::size_t round_size(std::size_t nbytes);
bool is_small(std::size_t rounded);
// The segment reserved when no free block of the pool fits a block of `rounded` bytes.
std::size_t segment_size(std::size_t rounded);

// ---- guard bytes (see the top of this file)
inline constexpr std::uint8_t kGuardPattern = 0xA5;  // 10100101: no float/bf16 zero or one
inline constexpr std::size_t kMaxGuardBytes = std::size_t{1} << 20;
// Guard bytes after every block allocated from now on (0: off). Blocks keep the guard they were
// allocated with, so switching while blocks are alive is safe. Throws above kMaxGuardBytes.
void set_guard_bytes(std::size_t n);
std::size_t guard_bytes();  // initially KILN_GUARD_BYTES, else 0
// Checks the guards of every live block of the CUDA allocators and returns one line per
// violated block (its address, requested and guard sizes, category, how many guard bytes
// changed and where), together with the violations found when blocks were freed since the
// last call (which were also printed to stderr then). Empty: all intact, or no GPU.
std::vector<std::string> check_guards();

// Where the guard of a block of `nbytes` requested bytes lies, with `guard` guard bytes.
struct GuardLayout {
  std::size_t block_bytes = 0;   // round_size(nbytes + guard); round_size(nbytes) when off
  std::size_t charged = 0;       // round_size(nbytes): what the tracker is charged either way
  std::size_t guard_offset = 0;  // == nbytes: the guard follows the requested bytes directly
  std::size_t guard_len = 0;     // == guard
};
GuardLayout guard_layout(std::size_t nbytes, std::size_t guard);
// Guard bytes read back (host copy) against the pattern.
struct GuardCheck {
  std::size_t bad = 0;    // bytes that differ from the pattern
  std::size_t first = 0;  // offset of the first and last differing byte (valid when bad > 0)
  std::size_t last = 0;
};
GuardCheck check_guard_bytes(const std::uint8_t* guard, std::size_t n,
                             std::uint8_t pattern = kGuardPattern);
}  // namespace caching

namespace caching {
// KILN_NO_CACHING set and not "0" (see the top of this file).
bool no_caching_from_env();
}  // namespace caching

// Where a BlockPool gets its segments: the CUDA driver, malloc (tests), or nothing at all
// (meta). reserve() returns nullptr or throws cuda::DeviceOutOfMemory when the device is full,
// and throws another kiln::Error for any other failure; release() gets back exactly a pointer
// and size that reserve() returned.
class PoolBackend {
 public:
  virtual ~PoolBackend() = default;
  virtual void* reserve(std::size_t bytes) = 0;
  virtual void release(void* p, std::size_t bytes) = 0;
  // Device free / total bytes for the out-of-memory message; false when unknown.
  virtual bool mem_info(std::size_t& free_bytes, std::size_t& total_bytes) {
    (void)free_bytes, (void)total_bytes;
    return false;
  }
  // Guard bytes need real memory: fill sets n bytes at p (inside a block) to `value`, read
  // copies n bytes at p to the host. Backends without memory return false from can_guard().
  virtual bool can_guard() const { return false; }
  virtual void fill(void* p, std::uint8_t value, std::size_t n) { (void)p, (void)value, (void)n; }
  virtual void read(void* host_dst, const void* p, std::size_t n) {
    (void)host_dst, (void)p, (void)n;
  }
};

// No memory: hands out distinct fake, 2 MiB-aligned addresses and counts. With a capacity it
// refuses a segment that would take the reserved bytes past it, as a device of that size would
// (fragmentation of the driver's own address space is not modelled).
class CountingBackend final : public PoolBackend {
 public:
  explicit CountingBackend(std::size_t capacity = SIZE_MAX) : capacity_(capacity) {}
  void* reserve(std::size_t bytes) override;
  void release(void* p, std::size_t bytes) override;
  bool mem_info(std::size_t& free_bytes, std::size_t& total_bytes) override;
  std::size_t reserved() const { return reserved_; }
  void set_capacity(std::size_t capacity) { capacity_ = capacity; }

 private:
  std::size_t capacity_;
  std::size_t reserved_ = 0;
  std::uintptr_t next_ = std::uintptr_t{1} << 44;  // far from any real host pointer
};

struct PoolStats {
  std::size_t allocated = 0;  // rounded sizes of blocks in use (what the tracker is charged)
  std::size_t allocated_peak = 0;
  std::size_t block_bytes = 0;  // sizes of blocks in use (>= allocated: unsplit remainders)
  std::size_t reserved = 0;     // segments held
  std::size_t reserved_peak = 0;
  std::size_t segments = 0;
  std::size_t active_blocks = 0;
  std::size_t free_blocks = 0;          // both pools
  std::size_t largest_free = 0;         // largest free block, both pools
  std::int64_t num_allocs = 0;          // requests served (n > 0)
  std::int64_t num_segment_allocs = 0;  // segments reserved from the backend
  std::int64_t num_cache_flushes = 0;   // out-of-memory retries that released cached segments
  std::int64_t num_ooms = 0;            // requests that failed after the retry
};

// The caching logic, on any backend. `name` starts the out-of-memory message ("cuda"); the
// tracker (may be null) is charged as described at the top of this file. caching = false: one
// segment per block, released when the block is freed (KILN_NO_CACHING, above).
class BlockPool {
 public:
  BlockPool(PoolBackend& backend, MemoryTracker* tracker, std::string name, bool caching = true);
  // Every block must be free by now; held segments are released.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least charged_size(nbytes) bytes, charged to c; nullptr for nbytes == 0.
  void* allocate(std::size_t nbytes, MemCategory c);
  // p from allocate. A block remembers its category; c is used only for p == nullptr (a
  // zero-byte request). Throws for a pointer this pool did not hand out.
  void deallocate(void* p, MemCategory c);
  static std::size_t charged_size(std::size_t nbytes) { return caching::round_size(nbytes); }
  // Releases every fully free segment; returns the bytes released.
  std::size_t empty_cache();
  PoolStats stats() const;
  // Size of the block behind p (0 if p is not an allocated block): for tests.
  std::size_t block_size(const void* p) const;
  // Guard bytes (caching::check_guards): checks every live guarded block, and returns those
  // violations with the ones found at free time since the last call.
  std::vector<std::string> check_guards();

 private:
  struct Block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::uint64_t segment = 0;  // reservation order of its segment (best-fit tie break)
    std::size_t charged = 0;    // rounded request, while allocated
    std::size_t requested = 0;  // bytes asked for, while allocated (the guard starts there)
    std::size_t guard = 0;      // guard bytes after `requested` (0: none)
    bool small = false;
    bool allocated = false;
    MemCategory category = MemCategory::Temporaries;
    Block* prev = nullptr;  // neighbours in the same segment, by address
    Block* next = nullptr;
  };
  struct BySizeAddr {
    bool operator()(const Block* a, const Block* b) const {
      if (a->size != b->size) return a->size < b->size;
      if (a->segment != b->segment) return a->segment < b->segment;
      return a->addr < b->addr;
    }
  };
  using FreeSet = std::set<Block*, BySizeAddr>;

  FreeSet& pool_of(bool small) { return small ? small_free_ : large_free_; }
  Block* reserve_segment(std::size_t rounded, bool small);  // caller holds mu_
  std::size_t release_free_segments();                      // caller holds mu_
  // One whole free segment `b` of `set` back to the backend; returns its size (caller holds mu_).
  std::size_t release_segment(FreeSet& set, Block* b);
  void insert_free(Block* b);  // a free block into its pool, merged with free neighbours
  [[noreturn]] void out_of_memory(std::size_t rounded, const std::string& why);
  // "" when the guard is intact, else the violation's description (caller holds mu_).
  std::string check_block_guard(const Block& b);

  PoolBackend& backend_;
  MemoryTracker* tracker_;
  std::string name_;
  bool caching_ = true;
  mutable std::mutex mu_;
  FreeSet small_free_, large_free_;
  std::unordered_map<std::uintptr_t, Block*> active_;
  std::size_t free_block_count_ = 0;
  PoolStats s_;
  std::vector<std::string> guard_violations_;  // found at free time, until check_guards()
};

// The CUDA allocator of one device: a BlockPool over kiln::cuda::device_malloc/device_free,
// charging MemoryTracker::get(DeviceType::CUDA). Compiled in every build; without CUDA the
// runtime stubs throw on the first segment.
class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device);
  ~CudaCachingAllocator() override;
  void* allocate(std::size_t nbytes, MemCategory c) override;
  void deallocate(void* p, std::size_t nbytes, MemCategory c) override;
  std::size_t charged_size(std::size_t nbytes) const override {
    return caching::round_size(nbytes);
  }
  std::size_t empty_cache();
  PoolStats stats() const;
  std::vector<std::string> check_guards() { return pool_->check_guards(); }
  int device() const { return device_; }

 private:
  int device_;
  std::unique_ptr<PoolBackend> backend_;
  std::unique_ptr<BlockPool> pool_;
};

// The allocator of cuda:index, created on first use and never destroyed (tensors may outlive
// statics). Throws when the build has no CUDA or the index is not a visible device.
CudaCachingAllocator& cuda_caching_allocator(int index);

// cuda:index now, as the driver sees it (cudaMemGetInfo) beside this allocator's segments and
// the runtime's own memory (kiln::cuda::runtime_bytes): the Runtime and Unattributed rows.
// Call it after a device_synchronize() if kernels may still be queued (they do not change
// the figures, but library calls in flight may). Throws like cuda_caching_allocator.
DeviceMemoryRows cuda_device_memory(int index);

// The meta device's simulation of the CUDA allocator: a BlockPool on a CountingBackend that
// charges MemoryTracker::get(DeviceType::Meta). Used by the meta allocator while
// meta_simulates() == DeviceType::CUDA.
BlockPool& meta_cuda_pool();
// The simulated device size (SIZE_MAX: unlimited, the default), so a dry run can fail the way
// a device of that size would. Call it while no dry run is allocating.
void set_meta_cuda_capacity(std::size_t bytes);
// Releases the simulated pool's fully free segments (as empty_cache on the device would).
std::size_t empty_meta_cuda_cache();

}  // namespace kiln
