// The caching allocator's rules (tensor/caching_allocator.h) on host memory: rounding, pools,
// best fit, split and merge, empty_cache, the out-of-memory retry, exact tracker figures, the
// meta simulation step by step against a malloc-backed pool, and fragmentation. Expected values
// are derived in the test from the stated rules, never read back from the allocator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cuda/runtime.h"
#include "tensor/caching_allocator.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"
#include "tests/tensor/caching_backends.h"

namespace kiln {
namespace {

using namespace test_caching;  // NOLINT: the shared backends and rules

TEST(CachingAllocator, RoundingAndSegmentRules) {
  for (std::size_t n : {std::size_t{1}, std::size_t{511}, std::size_t{512}, std::size_t{513},
                        std::size_t{1000}, MiB - 1, MiB, MiB + 1, 10 * MiB - 1, 10 * MiB,
                        10 * MiB + 1, 21 * MiB + 7, std::size_t{3} << 32}) {
    const std::size_t r = round_size(n);
    EXPECT_EQ(r, ref_round(n)) << n;
    EXPECT_EQ(r % 512, 0u) << n;
    EXPECT_GE(r, n);
    EXPECT_LT(r - n, 512u);
    EXPECT_EQ(caching::is_small(r), r <= MiB) << n;
    EXPECT_EQ(caching::segment_size(r), ref_segment(r)) << n;
    EXPECT_GE(caching::segment_size(r), r);
    EXPECT_EQ(BlockPool::charged_size(n), r);
  }
  EXPECT_EQ(round_size(0), 0u);
  EXPECT_THROW(round_size(SIZE_MAX), Error);
  EXPECT_THROW(round_size(caching::kMaxRequest + 1), Error);
}

TEST(CachingAllocator, ZeroBytesGiveNullAndChargeNothing) {
  MallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  EXPECT_EQ(pool.allocate(0, MemCategory::Weights), nullptr);
  pool.deallocate(nullptr, MemCategory::Weights);
  MemStats s = t.stats();
  EXPECT_EQ(s.total, 0);
  EXPECT_EQ(s.reserved, 0);
  EXPECT_EQ(s.num_allocs, 1);
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_EQ(be.reserves, 0);
}

TEST(CachingAllocator, SplitReuseMergeAndEmptyCache) {
  MallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  const MemCategory W = MemCategory::Weights;
  void* a = pool.allocate(1000, W);
  void* b = pool.allocate(3000, W);
  void* c = pool.allocate(5000, W);
  // One 2 MiB segment, carved front to back.
  EXPECT_EQ(be.reserves, 1);
  EXPECT_EQ(addr(b), addr(a) + ref_round(1000));
  EXPECT_EQ(addr(c), addr(b) + ref_round(3000));
  EXPECT_EQ(pool.block_size(b), ref_round(3000));
  PoolStats s = pool.stats();
  EXPECT_EQ(s.reserved, 2 * MiB);
  EXPECT_EQ(s.allocated, ref_round(1000) + ref_round(3000) + ref_round(5000));
  EXPECT_EQ(s.free_blocks, 1u);  // the segment's tail
  EXPECT_EQ(s.largest_free, 2 * MiB - s.allocated);

  // B's hole (3072) is the best fit for 2000 bytes (2048): reused, and split (1024 left).
  pool.deallocate(b, W);
  void* d = pool.allocate(2000, W);
  EXPECT_EQ(d, b);
  EXPECT_EQ(pool.block_size(d), ref_round(2000));
  EXPECT_EQ(pool.stats().free_blocks, 2u);
  EXPECT_EQ(be.reserves, 1);

  // Freeing everything merges the segment back into one free block.
  for (void* p : {a, c, d}) pool.deallocate(p, W);
  s = pool.stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.free_blocks, 1u);
  EXPECT_EQ(s.largest_free, 2 * MiB);
  EXPECT_EQ(s.reserved, 2 * MiB);  // cached, not returned
  EXPECT_EQ(t.stats().reserved, i64(2 * MiB));

  // The cached segment serves the next request without the backend.
  void* e = pool.allocate(MiB, W);
  EXPECT_EQ(e, a);
  EXPECT_EQ(be.reserves, 1);
  pool.deallocate(e, W);

  EXPECT_EQ(pool.empty_cache(), 2 * MiB);
  s = pool.stats();
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.segments, 0u);
  EXPECT_EQ(s.free_blocks, 0u);
  EXPECT_EQ(be.held(), 0u);
  EXPECT_EQ(t.stats().reserved, 0);
  EXPECT_EQ(t.stats().reserved_peak, i64(2 * MiB));
}

TEST(CachingAllocator, BestFitPicksSmallestThenLowestAddress) {
  MallocBackend be;
  BlockPool pool(be, nullptr, "test");
  const MemCategory T = MemCategory::Temporaries;
  // Holes of 4096, 1536, 2560 and 1536 bytes, each fenced by a live 512-byte block so that
  // freeing them merges nothing.
  const std::vector<std::size_t> holes = {4096, 1536, 2560, 1536};
  std::vector<void*> hole_ptr, fences;
  for (std::size_t h : holes) {
    hole_ptr.push_back(pool.allocate(h, T));
    fences.push_back(pool.allocate(512, T));
  }
  for (void* p : hole_ptr) pool.deallocate(p, T);
  ASSERT_EQ(pool.stats().free_blocks, holes.size() + 1);  // + the segment's tail

  // 1500 -> 1536: two exact fits in one segment; the lower address (hole 1) wins, taken whole.
  void* x = pool.allocate(1500, T);
  EXPECT_EQ(x, hole_ptr[1]);
  EXPECT_EQ(pool.block_size(x), 1536u);
  // Again 1536: now only hole 3 fits exactly.
  void* y = pool.allocate(1536, T);
  EXPECT_EQ(y, hole_ptr[3]);
  // 2100 -> 2560: the 2560 hole, not the larger 4096 one.
  void* z = pool.allocate(2100, T);
  EXPECT_EQ(z, hole_ptr[2]);
  // 3000 -> 3072: only the 4096 hole fits; it is split (1024 left, >= 512).
  void* w = pool.allocate(3000, T);
  EXPECT_EQ(w, hole_ptr[0]);
  EXPECT_EQ(pool.block_size(w), 3072u);
  // 1024 exactly fits what is left of hole 0.
  void* v = pool.allocate(1024, T);
  EXPECT_EQ(addr(v), addr(hole_ptr[0]) + 3072);
  EXPECT_EQ(be.reserves, 1);
  for (void* p : {x, y, z, w, v}) pool.deallocate(p, T);
  for (void* p : fences) pool.deallocate(p, T);
  EXPECT_EQ(pool.stats().free_blocks, 1u);
  pool.empty_cache();
}

TEST(CachingAllocator, SmallAndLargePoolsStayApart) {
  MallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  const MemCategory A = MemCategory::Activations;
  // 1.5 MiB is large: a 20 MiB segment, split (18.5 MiB left >= 1 MiB).
  void* l1 = pool.allocate(3 * MiB / 2, A);
  EXPECT_EQ(pool.stats().reserved, 20 * MiB);
  EXPECT_EQ(pool.block_size(l1), 3 * MiB / 2);
  // 1 MiB is small: its own 2 MiB segment although the large one has 18.5 MiB free.
  void* s1 = pool.allocate(MiB, A);
  void* s2 = pool.allocate(MiB, A);
  EXPECT_EQ(pool.stats().reserved, 22 * MiB);
  EXPECT_EQ(addr(s2), addr(s1) + MiB);
  void* s3 = pool.allocate(1, A);  // the small segment is full: another 2 MiB one
  EXPECT_EQ(pool.stats().reserved, 24 * MiB);
  EXPECT_EQ(pool.stats().segments, 3u);
  // A large request does not take the free small segment space either.
  pool.deallocate(s1, A);
  pool.deallocate(s2, A);
  void* l2 = pool.allocate(MiB + 512, A);
  EXPECT_EQ(addr(l2), addr(l1) + 3 * MiB / 2);
  EXPECT_EQ(pool.stats().reserved, 24 * MiB);

  // The first large segment has 20 - 1.5 - (1 MiB + 512) = 17.5 MiB - 512 left. 18.5 MiB does
  // not fit: a new segment of round_up(18.5 MiB, 2 MiB) = 20 MiB, its 1.5 MiB tail split off.
  const std::size_t rest = 20 * MiB - 3 * MiB / 2 - (MiB + 512);
  void* l3 = pool.allocate(37 * MiB / 2, A);
  EXPECT_EQ(pool.stats().reserved, 24 * MiB + ref_segment(37 * MiB / 2));
  EXPECT_EQ(pool.block_size(l3), 37 * MiB / 2);
  // 16.5 MiB takes that 17.5 MiB - 512 block (best fit over the 1.5 MiB tail); what is left
  // (1 MiB - 512) is under 1 MiB, so not split: the block is larger than the charge.
  void* l4 = pool.allocate(33 * MiB / 2, A);
  EXPECT_EQ(addr(l4), addr(l2) + MiB + 512);
  EXPECT_EQ(pool.block_size(l4), rest);
  PoolStats s = pool.stats();
  const std::size_t charged = 3 * MiB / 2 + 512 + (MiB + 512) + 37 * MiB / 2 + 33 * MiB / 2;
  EXPECT_EQ(s.allocated, charged);
  EXPECT_EQ(s.block_bytes, charged - 33 * MiB / 2 + rest);
  MemStats m = t.stats();
  EXPECT_EQ(m.total, i64(charged));
  EXPECT_EQ(m.current[static_cast<std::size_t>(A)], i64(charged));
  EXPECT_EQ(m.reserved - m.total, i64(s.reserved - charged));  // slack includes the unsplit tail
  for (void* p : {l1, s3, l2, l3, l4}) pool.deallocate(p, A);
  EXPECT_EQ(pool.stats().free_blocks, 4u);  // one per segment
  EXPECT_EQ(pool.empty_cache(), 24 * MiB + 20 * MiB);
  EXPECT_EQ(t.stats().total, 0);
  EXPECT_EQ(t.stats().reserved, 0);
}

TEST(CachingAllocator, TrackerSeesAllocatedReservedAndSlackPerCategory) {
  MallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  struct Req {
    std::size_t n;
    MemCategory c;
  };
  const std::vector<Req> reqs = {{100, MemCategory::Weights},
                                 {70000, MemCategory::Weights},
                                 {3 * MiB + 5, MemCategory::Gradients},
                                 {1, MemCategory::KVCache},
                                 {12 * MiB + 3, MemCategory::Activations}};
  std::vector<void*> ptrs;
  CategoryBytes want{};
  std::size_t want_total = 0;
  for (const Req& r : reqs) {
    ptrs.push_back(pool.allocate(r.n, r.c));
    want[static_cast<std::size_t>(r.c)] += i64(ref_round(r.n));
    want_total += ref_round(r.n);
    MemStats m = t.stats();
    EXPECT_EQ(m.current, want);
    EXPECT_EQ(m.total, i64(want_total));
    EXPECT_EQ(m.reserved, i64(pool.stats().reserved));
    EXPECT_EQ(m.reserved, i64(be.held()));
    EXPECT_EQ(m.reserved - m.total, i64(pool.stats().reserved - pool.stats().allocated));
  }
  // Segments: one small (2 MiB) and one 20 MiB (for 3 MiB + 512), whose 17 MiB - 512 tail then
  // holds the 12 MiB + 512 block.
  EXPECT_EQ(be.held(), 2 * MiB + ref_segment(ref_round(3 * MiB + 5)));
  EXPECT_LE(ref_round(12 * MiB + 3), ref_segment(ref_round(3 * MiB + 5)) - ref_round(3 * MiB + 5));
  EXPECT_EQ(t.stats().peak, want);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    // The charge follows the block's category even if the caller passes another one.
    pool.deallocate(ptrs[i], MemCategory::Temporaries);
    want[static_cast<std::size_t>(reqs[i].c)] -= i64(ref_round(reqs[i].n));
    EXPECT_EQ(t.stats().current, want);
  }
  EXPECT_EQ(t.stats().total, 0);
  EXPECT_EQ(t.stats().reserved, i64(be.held()));  // all slack now
  pool.empty_cache();
  EXPECT_EQ(t.stats().reserved, 0);
}

TEST(CachingAllocator, OutOfMemoryReleasesCacheAndRetriesOnce) {
  MallocBackend be(22 * MiB);
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  const MemCategory W = MemCategory::Weights;
  void* big = pool.allocate(5 * MiB, W);  // 20 MiB segment
  pool.deallocate(big, W);                // cached
  void* s1 = pool.allocate(MiB, W);       // 2 MiB segment: 22 MiB held, the limit
  void* s2 = pool.allocate(MiB, W);
  EXPECT_EQ(be.held(), 22 * MiB);
  // Needs another 2 MiB segment: refused, the cached 20 MiB segment goes, the retry succeeds.
  void* s3 = pool.allocate(512, W);
  ASSERT_NE(s3, nullptr);
  EXPECT_EQ(be.refusals, 1);
  EXPECT_EQ(be.held(), 4 * MiB);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.num_cache_flushes, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.reserved, 4 * MiB);
  EXPECT_EQ(t.stats().reserved, i64(4 * MiB));

  // 30 MiB cannot fit even after releasing the cache (nothing fully free): the error names the
  // request, what is reserved and allocated, and the device's free and total.
  const std::size_t allocated = 2 * MiB + 512;
  try {
    pool.allocate(30 * MiB, W);
    ADD_FAILURE() << "expected out of memory";
  } catch (const Error& e) {
    const std::string msg = e.what();
    const std::string want = fmt::format(
        "[allocator] test: out of memory: requested {}, reserved {}, allocated {} "
        "(free {} of {})",
        format_bytes(i64(30 * MiB)), format_bytes(i64(4 * MiB)), format_bytes(i64(allocated)),
        format_bytes(i64(18 * MiB)), format_bytes(i64(22 * MiB)));
    EXPECT_EQ(msg.rfind(want, 0), 0u) << msg;
    EXPECT_NE(msg.find(format_bytes(i64(ref_segment(30 * MiB))) + " segment"), std::string::npos)
        << msg;
  }
  // Refused once; nothing was fully free, so nothing to release and no second try.
  EXPECT_EQ(be.refusals, 2);
  s = pool.stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.allocated, allocated);  // nothing charged by the failed request
  EXPECT_EQ(t.stats().total, i64(allocated));
  EXPECT_EQ(t.stats().reserved, i64(4 * MiB));
  // The pool still works.
  void* s4 = pool.allocate(1000, W);
  EXPECT_NE(s4, nullptr);
  for (void* p : {s1, s2, s3, s4}) pool.deallocate(p, W);
  pool.empty_cache();
}

TEST(CachingAllocator, OutOfMemoryKeepsTheBackendsReason) {
  MallocBackend be(4 * MiB, /*throw_on_fail=*/true);
  BlockPool pool(be, nullptr, "cuda");
  try {
    pool.allocate(6 * MiB, MemCategory::Weights);
    ADD_FAILURE() << "expected out of memory";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[allocator] cuda: out of memory: requested 6.00 MiB", 0), 0u) << msg;
    EXPECT_NE(msg.find("(free 4.00 MiB of 4.00 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[test] backend refused"), std::string::npos) << msg;
  }
  // Nothing was cached, so there was nothing to release and no second try.
  EXPECT_EQ(be.refusals, 1);
  EXPECT_EQ(pool.stats().reserved, 0u);
}

// A device that works until told to fail, then fails with an error that is not out of memory
// (as a sticky cudaErrorIllegalAddress from an earlier kernel would), on reserve or on release.
class FaultyBackend final : public PoolBackend {
 public:
  void* reserve(std::size_t bytes) override {
    if (fail_reserve) fail("[fake] cudaMalloc: an illegal memory access was encountered");
    if (oom_reserve) throw cuda::DeviceOutOfMemory("[fake] cudaMalloc: out of memory");
    return inner.reserve(bytes);
  }
  void release(void* p, std::size_t bytes) override {
    if (fail_release) fail("[fake] cudaFree: an illegal memory access was encountered");
    inner.release(p, bytes);
  }
  MallocBackend inner;
  bool fail_reserve = false, oom_reserve = false, fail_release = false;
};

TEST(CachingAllocator, NonOutOfMemoryErrorPropagatesWithoutReleasingTheCache) {
  FaultyBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  const MemCategory W = MemCategory::Weights;
  pool.deallocate(pool.allocate(5 * MiB, W), W);  // a cached, fully free 20 MiB segment
  void* keep = pool.allocate(1000, W);            // a 2 MiB small segment in use
  const PoolStats before = pool.stats();
  be.fail_reserve = true;
  try {
    pool.allocate(30 * MiB, W);  // needs a new segment
    ADD_FAILURE() << "expected the device's error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[fake] cudaMalloc: an illegal memory access", 0), 0u) << msg;
    EXPECT_EQ(msg.find("out of memory"), std::string::npos) << msg;
  }
  // Not treated as out of memory: no cache flush, nothing released, nothing charged.
  const PoolStats after = pool.stats();
  EXPECT_EQ(after.num_cache_flushes, 0);
  EXPECT_EQ(after.num_ooms, 0);
  EXPECT_EQ(after.reserved, before.reserved);
  EXPECT_EQ(after.segments, before.segments);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.free_blocks, before.free_blocks);
  EXPECT_EQ(be.inner.held(), 22 * MiB);
  EXPECT_EQ(t.stats().reserved, i64(22 * MiB));
  be.fail_reserve = false;
  pool.deallocate(keep, W);
  EXPECT_EQ(pool.empty_cache(), 22 * MiB);
  EXPECT_EQ(t.stats().reserved, 0);
}

TEST(CachingAllocator, ReleaseErrorLeavesTheSegmentAccountedFor) {
  FaultyBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  const MemCategory W = MemCategory::Weights;
  pool.deallocate(pool.allocate(5 * MiB, W), W);  // cached 20 MiB segment
  be.fail_release = true;
  EXPECT_THROW(pool.empty_cache(), Error);
  // The segment the device did not take back is still held, free, and counted once.
  PoolStats s = pool.stats();
  EXPECT_EQ(s.reserved, 20 * MiB);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.free_blocks, 1u);
  EXPECT_EQ(t.stats().reserved, i64(20 * MiB));
  // The out-of-memory path meets the same release error: it propagates, not "out of memory".
  be.oom_reserve = true;
  try {
    pool.allocate(30 * MiB, W);
    ADD_FAILURE() << "expected the release error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[fake] cudaFree", 0), 0u) << e.what();
  }
  s = pool.stats();
  EXPECT_EQ(s.num_cache_flushes, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.reserved, 20 * MiB);
  EXPECT_EQ(s.allocated, 0u);
  // Once the device recovers, the same segment is released exactly once.
  be.fail_release = be.oom_reserve = false;
  EXPECT_EQ(pool.empty_cache(), 20 * MiB);
  EXPECT_EQ(pool.stats().reserved, 0u);
  EXPECT_EQ(t.stats().reserved, 0);
  EXPECT_EQ(be.inner.releases, 1);
}

TEST(CachingAllocator, NoCachingGivesEachBlockItsOwnSegment) {
  MallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test", /*caching=*/false);
  const MemCategory W = MemCategory::Weights;
  void* a = pool.allocate(100, W);
  void* b = pool.allocate(100, W);
  void* c = pool.allocate(3 * MiB + 1, W);
  // Exactly the rounded block each, no 2/20 MiB segments, no splitting.
  EXPECT_EQ(be.reserves, 3);
  EXPECT_EQ(be.held(), 512 + 512 + ref_round(3 * MiB + 1));
  EXPECT_EQ(pool.block_size(a), 512u);
  EXPECT_EQ(pool.block_size(c), ref_round(3 * MiB + 1));
  PoolStats s = pool.stats();
  EXPECT_EQ(s.reserved, s.allocated);
  EXPECT_EQ(s.free_blocks, 0u);
  EXPECT_EQ(t.stats().reserved, t.stats().total);
  // Freed blocks go straight back to the device: nothing cached.
  pool.deallocate(b, W);
  EXPECT_EQ(be.releases, 1);
  EXPECT_EQ(be.held(), 512 + ref_round(3 * MiB + 1));
  pool.deallocate(a, W);
  pool.deallocate(c, W);
  s = pool.stats();
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.segments, 0u);
  EXPECT_EQ(s.free_blocks, 0u);
  EXPECT_EQ(t.stats().reserved, 0);
  EXPECT_EQ(pool.empty_cache(), 0u);
}

TEST(CachingAllocator, NoCachingComesFromTheEnvironment) {
  const char* old = std::getenv("KILN_NO_CACHING");
  const std::string saved = old ? old : "";
  unsetenv("KILN_NO_CACHING");
  EXPECT_FALSE(caching::no_caching_from_env());
  setenv("KILN_NO_CACHING", "0", 1);
  EXPECT_FALSE(caching::no_caching_from_env());
  setenv("KILN_NO_CACHING", "1", 1);
  EXPECT_TRUE(caching::no_caching_from_env());
  if (old) {
    setenv("KILN_NO_CACHING", saved.c_str(), 1);
  } else {
    unsetenv("KILN_NO_CACHING");
  }
}

TEST(CachingAllocator, FreeOfUnknownPointerThrows) {
  MallocBackend be;
  BlockPool pool(be, nullptr, "test");
  void* p = pool.allocate(100, MemCategory::Weights);
  int x = 0;
  EXPECT_THROW(pool.deallocate(&x, MemCategory::Weights), Error);
  pool.deallocate(p, MemCategory::Weights);
  EXPECT_THROW(pool.deallocate(p, MemCategory::Weights), Error);  // double free
  pool.empty_cache();
}

// Every other 4 MiB block freed: 20 MiB free in 4 MiB holes, yet an 8 MiB request needs a
// new segment. The slack is the holes plus the new segment's tail, exactly.
TEST(CachingAllocator, FragmentationShowsAsSlack) {
  MallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  const MemCategory A = MemCategory::Activations;
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(pool.allocate(4 * MiB, A));
  EXPECT_EQ(pool.stats().segments, 2u);  // five 4 MiB blocks fill a 20 MiB segment exactly
  EXPECT_EQ(pool.stats().free_blocks, 0u);
  for (int i = 0; i < 10; i += 2) pool.deallocate(blocks[static_cast<std::size_t>(i)], A);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.free_blocks, 5u);  // no two holes are neighbours
  EXPECT_EQ(s.largest_free, 4 * MiB);
  void* big = pool.allocate(8 * MiB, A);
  s = pool.stats();
  EXPECT_EQ(s.segments, 3u);
  EXPECT_EQ(s.reserved, 60 * MiB);
  EXPECT_EQ(s.allocated, 5 * 4 * MiB + 8 * MiB);
  MemStats m = t.stats();
  EXPECT_EQ(m.reserved - m.total, i64(5 * 4 * MiB + (20 * MiB - 8 * MiB)));
  // Freeing a block between two holes merges all three into 12 MiB, which then fits 8 MiB.
  pool.deallocate(blocks[1], A);
  EXPECT_EQ(pool.stats().largest_free, 20 * MiB - 8 * MiB);  // the new segment's tail is 12 too
  void* again = pool.allocate(12 * MiB, A);
  // Two free 12 MiB blocks (the merged holes, the new segment's tail): the older segment wins,
  // wherever the backend put the segments.
  EXPECT_EQ(again, blocks[0]);
  EXPECT_EQ(pool.stats().segments, 3u);
  pool.deallocate(again, A);
  pool.deallocate(big, A);
  for (int i = 3; i < 10; i += 2) pool.deallocate(blocks[static_cast<std::size_t>(i)], A);
  s = pool.stats();
  EXPECT_EQ(s.free_blocks, 3u);
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(pool.empty_cache(), 60 * MiB);
  EXPECT_EQ(t.stats().reserved, 0);
}

TEST(CachingAllocator, ThreadsShareOnePool) {
  MallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  auto work = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<void*> live;
    for (int i = 0; i < 500; ++i) {
      if (!live.empty() && rng() % 2) {
        pool.deallocate(live.back(), MemCategory::Temporaries);
        live.pop_back();
      } else {
        live.push_back(pool.allocate(1 + rng() % (3 * MiB), MemCategory::Temporaries));
      }
    }
    for (void* p : live) pool.deallocate(p, MemCategory::Temporaries);
  };
  std::thread a(work, 1u), b(work, 2u);
  a.join();
  b.join();
  EXPECT_EQ(pool.stats().allocated, 0u);
  EXPECT_EQ(t.stats().total, 0);
  EXPECT_EQ(t.stats().num_allocs, t.stats().num_frees);
  pool.empty_cache();
  EXPECT_EQ(t.stats().reserved, 0);
}

// Segments handed out at falling addresses (a driver may place them anywhere).
class FallingAddressBackend final : public PoolBackend {
 public:
  void* reserve(std::size_t bytes) override {
    next_ -= (bytes + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
    return reinterpret_cast<void*>(next_);
  }
  void release(void*, std::size_t) override {}

 private:
  std::uintptr_t next_ = std::uintptr_t{1} << 50;
};

// Ties between equal free blocks go to the older segment, so where the backend puts segments
// never changes a decision: rising and falling addresses give the same blocks at every step.
TEST(CachingAllocator, DecisionsDoNotDependOnSegmentAddresses) {
  CountingBackend rising;
  FallingAddressBackend falling;
  BlockPool x(rising, nullptr, "x"), y(falling, nullptr, "y");
  std::vector<std::pair<void*, void*>> live;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 2000; ++step) {
    if (!live.empty() && (rng() % 2 || live.size() > 30)) {
      const std::size_t i = rng() % live.size();
      x.deallocate(live[i].first, MemCategory::Temporaries);
      y.deallocate(live[i].second, MemCategory::Temporaries);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      // Few distinct sizes, so equal-size free blocks in different segments are common.
      const std::size_t n = (std::size_t{1} << (rng() % 4)) * (rng() % 2 ? 4 * MiB : 256 * KiB);
      void* a = x.allocate(n, MemCategory::Temporaries);
      void* b = y.allocate(n, MemCategory::Temporaries);
      EXPECT_EQ(x.block_size(a), y.block_size(b)) << step;
      live.emplace_back(a, b);
    }
    const PoolStats px = x.stats(), py = y.stats();
    EXPECT_EQ(px.reserved, py.reserved) << step;
    EXPECT_EQ(px.segments, py.segments) << step;
    EXPECT_EQ(px.free_blocks, py.free_blocks) << step;
    EXPECT_EQ(px.block_bytes, py.block_bytes) << step;
    if (HasFailure()) break;
  }
  for (auto& [a, b] : live) {
    x.deallocate(a, MemCategory::Temporaries);
    y.deallocate(b, MemCategory::Temporaries);
  }
  EXPECT_EQ(x.empty_cache(), y.empty_cache());
}

// ---- the meta simulation -----------------------------------------------------------------------

struct SimulateCuda : MetaSimulatesScope {
  SimulateCuda() : MetaSimulatesScope(DeviceType::CUDA) {}
};

// The same scripted allocations and frees on a malloc-backed pool and through the meta device's
// allocator (simulating CUDA): identical allocated and reserved after every step.
TEST(CachingAllocatorMeta, ScriptMatchesMallocBackedPoolAtEveryStep) {
  SimulateCuda sim;
  empty_meta_cuda_cache();
  ASSERT_EQ(meta_cuda_pool().stats().reserved, 0u) << "meta blocks alive from another test";
  MemoryTracker& mt = MemoryTracker::get(DeviceType::Meta);
  const MemStats base = mt.stats();
  Allocator& meta = allocator_for(Device::meta());

  MallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");

  struct Live {
    void* real;
    void* fake;
    std::size_t n;
    MemCategory c;
  };
  std::vector<Live> live;
  std::mt19937_64 rng(20261121);
  std::uniform_real_distribution<double> log_size(0.0, std::log2(48.0 * MiB));
  for (int step = 0; step < 600; ++step) {
    const bool do_free = !live.empty() && (rng() % 100 < 45 || live.size() > 40);
    if (do_free) {
      const std::size_t i = rng() % live.size();
      pool.deallocate(live[i].real, live[i].c);
      meta.deallocate(live[i].fake, live[i].n, live[i].c);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const auto n = static_cast<std::size_t>(std::exp2(log_size(rng)));
      const auto c = static_cast<MemCategory>(rng() % kNumMemCategories);
      Live l{pool.allocate(n, c), meta.allocate(n, c), n, c};
      EXPECT_EQ(meta.charged_size(n), ref_round(n));
      // Same block, at the same offset from its segment's start (segments differ in address).
      EXPECT_EQ(pool.block_size(l.real), meta_cuda_pool().block_size(l.fake)) << step;
      live.push_back(l);
    }
    if (step % 97 == 96) {  // both sides release their fully free segments now and then
      EXPECT_EQ(pool.empty_cache(), empty_meta_cuda_cache()) << step;
    }
    const MemStats a = t.stats(), m = mt.stats();
    EXPECT_EQ(a.total, m.total - base.total) << "allocated, step " << step;
    EXPECT_EQ(a.reserved, m.reserved - base.reserved) << "reserved, step " << step;
    for (std::size_t k = 0; k < kNumMemCategories; ++k)
      EXPECT_EQ(a.current[k], m.current[k] - base.current[k]) << "category " << k;
    const PoolStats ps = pool.stats(), ms = meta_cuda_pool().stats();
    EXPECT_EQ(ps.segments, ms.segments) << step;
    EXPECT_EQ(ps.free_blocks, ms.free_blocks) << step;
    EXPECT_EQ(ps.largest_free, ms.largest_free) << step;
    if (HasFailure()) break;  // and still free everything below, for the tests after this one
  }
  EXPECT_GT(pool.stats().reserved_peak, 100 * MiB);  // the script did reach the large pool
  for (const Live& l : live) {
    pool.deallocate(l.real, l.c);
    meta.deallocate(l.fake, l.n, l.c);
  }
  EXPECT_EQ(pool.empty_cache(), empty_meta_cuda_cache());
  EXPECT_EQ(mt.stats().total, base.total);
  EXPECT_EQ(mt.stats().reserved, base.reserved);
}

TEST(CachingAllocatorMeta, TensorsAcrossModeSwitches) {
  const auto M = DeviceType::Meta;
  empty_meta_cuda_cache();
  MemoryTracker& mt = MemoryTracker::get(M);
  const MemStats base = mt.stats();
  Tensor cpu_style = Tensor::empty({100}, DType::F32, Device::meta());  // 400 B -> 448, no address
  Tensor cuda_style;
  {
    SimulateCuda sim;
    cuda_style = Tensor::empty({100}, DType::F32, Device::meta());  // 400 B -> 512 in a segment
    EXPECT_EQ(allocator_for(Device::meta()).charged_size(400), 512u);
    EXPECT_EQ(mt.stats().total - base.total, 448 + 512);
    EXPECT_EQ(mt.stats().reserved - base.reserved, 448 + i64(2 * MiB));
    cpu_style = Tensor();  // made under CPU simulation: freed that way although CUDA is on now
  }
  EXPECT_EQ(mt.stats().total - base.total, 512);
  cuda_style = Tensor();  // and this one goes back to the simulated pool
  EXPECT_EQ(mt.stats().total, base.total);
  EXPECT_EQ(mt.stats().reserved - base.reserved, i64(2 * MiB));  // cached segment: slack
  EXPECT_EQ(empty_meta_cuda_cache(), 2 * MiB);
  EXPECT_EQ(mt.stats().reserved, base.reserved);
}

TEST(CachingAllocatorMeta, SimulatedCapacityFailsLikeTheDevice) {
  SimulateCuda sim;
  empty_meta_cuda_cache();
  set_meta_cuda_capacity(64 * MiB);
  Allocator& meta = allocator_for(Device::meta());
  void* a = meta.allocate(40 * MiB, MemCategory::Weights);
  try {
    meta.allocate(30 * MiB, MemCategory::Weights);
    ADD_FAILURE() << "expected out of memory";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[allocator] cuda: out of memory: requested 30.00 MiB, reserved 40.00 MiB, "
                        "allocated 40.00 MiB (free 24.00 MiB of 64.00 MiB)",
                        0),
              0u)
        << msg;
  }
  set_meta_cuda_capacity(SIZE_MAX);
  meta.deallocate(a, 40 * MiB, MemCategory::Weights);
  EXPECT_EQ(empty_meta_cuda_cache(), 40 * MiB);
}

}  // namespace
}  // namespace kiln
