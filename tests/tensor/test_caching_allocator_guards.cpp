// The caching allocator's guard bytes (an overrun past a request is found and reported), the
// driver's view (runtime and unattributed rows) and the CUDA device's pool: the rest of
// test_caching_allocator.cpp's rules, on the same test backends (caching_backends.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cuda/runtime.h"
#include "tensor/caching_allocator.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"
#include "tests/tensor/caching_backends.h"

namespace kiln {
namespace {

using namespace test_caching;  // NOLINT: the shared backends and rules

// ---- guard bytes
// ---------------------------------------------------------------------------------

TEST(CachingAllocatorGuards, LayoutPutsTheGuardRightAfterTheRequest) {
  // Off: the block is the rounded request, no guard.
  caching::GuardLayout g = caching::guard_layout(1000, 0);
  EXPECT_EQ(g.block_bytes, 1024u);
  EXPECT_EQ(g.charged, 1024u);
  EXPECT_EQ(g.guard_len, 0u);
  // 1000 + 64 = 1064 -> a 1536-byte block; the guard is bytes [1000, 1064); the charge is
  // still round(1000) = 1024.
  g = caching::guard_layout(1000, 64);
  EXPECT_EQ(g.block_bytes, 1536u);
  EXPECT_EQ(g.charged, 1024u);
  EXPECT_EQ(g.guard_offset, 1000u);
  EXPECT_EQ(g.guard_len, 64u);
  // A request that is a multiple of 512 gets a whole extra 512 bytes for any guard.
  g = caching::guard_layout(4096, 1);
  EXPECT_EQ(g.block_bytes, 4608u);
  EXPECT_EQ(g.charged, 4096u);
  EXPECT_EQ(g.guard_offset, 4096u);
  // Zero bytes: nullptr, no block, no guard.
  g = caching::guard_layout(0, 64);
  EXPECT_EQ(g.block_bytes, 0u);
  EXPECT_EQ(g.guard_len, 0u);
  // The guard can move a request from the small pool (<= 1 MiB) to the large one.
  g = caching::guard_layout(MiB, 64);
  EXPECT_EQ(g.block_bytes, MiB + 512);
  EXPECT_FALSE(caching::is_small(g.block_bytes));
  EXPECT_THROW(caching::guard_layout(16, caching::kMaxGuardBytes + 1), Error);
  EXPECT_THROW(caching::guard_layout(caching::kMaxRequest, 64), Error);
  EXPECT_THROW(caching::set_guard_bytes(caching::kMaxGuardBytes + 1), Error);
}

TEST(CachingAllocatorGuards, PatternCheckFindsEveryChangedByte) {
  std::vector<std::uint8_t> g(64, caching::kGuardPattern);
  caching::GuardCheck c = caching::check_guard_bytes(g.data(), g.size());
  EXPECT_EQ(c.bad, 0u);
  g[3] = 0;
  g[10] = caching::kGuardPattern ^ 1;  // one bit
  g[63] = 0xFF;
  c = caching::check_guard_bytes(g.data(), g.size());
  EXPECT_EQ(c.bad, 3u);
  EXPECT_EQ(c.first, 3u);
  EXPECT_EQ(c.last, 63u);
  EXPECT_EQ(caching::check_guard_bytes(g.data(), 0).bad, 0u);
  // Another pattern.
  std::vector<std::uint8_t> z(8, 0);
  EXPECT_EQ(caching::check_guard_bytes(z.data(), z.size(), 0).bad, 0u);
  EXPECT_EQ(caching::check_guard_bytes(z.data(), z.size()).bad, 8u);
}

TEST(CachingAllocatorGuards, PoolFillsChecksAndReportsOverruns) {
  GuardedMallocBackend be;
  MemoryTracker t;
  BlockPool pool(be, &t, "test");
  const MemCategory A = MemCategory::Activations;
  GuardBytesScope guards(64);
  auto* p = static_cast<std::uint8_t*>(pool.allocate(1000, A));
  ASSERT_NE(p, nullptr);
  // Charged as without guards; the block holds the guard.
  EXPECT_EQ(t.stats().total, i64(1024));
  EXPECT_EQ(pool.stats().allocated, 1024u);
  EXPECT_EQ(pool.block_size(p), 1536u);
  EXPECT_EQ(be.fills, 1);
  for (std::size_t i = 1000; i < 1064; ++i)
    ASSERT_EQ(p[i], caching::kGuardPattern) << "guard byte " << i;
  // Writing all 1000 requested bytes is fine.
  std::memset(p, 0x11, 1000);
  EXPECT_TRUE(pool.check_guards().empty());
  // A one-byte overrun is caught, with the sizes in the message.
  p[1000] = 0x11;
  std::vector<std::string> v = pool.check_guards();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("requested 1000 bytes"), std::string::npos) << v[0];
  EXPECT_NE(v[0].find("1 of 64 guard bytes"), std::string::npos) << v[0];
  EXPECT_NE(v[0].find("activations"), std::string::npos) << v[0];
  EXPECT_NE(v[0].find("bytes 0..0 past the end"), std::string::npos) << v[0];
  // The check does not repair anything: it is still reported next time.
  EXPECT_EQ(pool.check_guards().size(), 1u);
  p[1000] = caching::kGuardPattern;
  EXPECT_TRUE(pool.check_guards().empty());

  // A violation found at free time is kept for the next check_guards(), once.
  auto* q = static_cast<std::uint8_t*>(pool.allocate(100, A));
  q[100 + 63] = 0;  // the guard's last byte
  const int reads = be.reads;
  pool.deallocate(q, A);
  EXPECT_EQ(be.reads, reads + 1);
  v = pool.check_guards();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("requested 100 bytes"), std::string::npos) << v[0];
  EXPECT_NE(v[0].find("bytes 63..63"), std::string::npos) << v[0];
  EXPECT_TRUE(pool.check_guards().empty());

  // Switching off: new blocks are exactly what they are without guards; the live guarded
  // block keeps its guard and is still checked.
  caching::set_guard_bytes(0);
  void* r = pool.allocate(1000, A);
  EXPECT_EQ(pool.block_size(r), 1024u);
  EXPECT_EQ(be.fills, 2);  // p and q only
  p[1063] = 0;
  v = pool.check_guards();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("requested 1000 bytes"), std::string::npos) << v[0];
  p[1063] = caching::kGuardPattern;
  pool.deallocate(p, A);
  pool.deallocate(r, A);
  EXPECT_EQ(t.stats().total, 0);
  EXPECT_TRUE(pool.check_guards().empty());
  pool.empty_cache();
}

TEST(CachingAllocatorGuards, OffChangesNothingAndBackendsWithoutMemoryNeverGuard) {
  // The same script on a guard-capable pool with guards off and on a plain pool: identical
  // addresses (relative to the first block), block sizes and tracker figures.
  GuardedMallocBackend gbe;
  MallocBackend be;
  MemoryTracker tg, tp;
  BlockPool guarded(gbe, &tg, "g"), plain(be, &tp, "p");
  const std::vector<std::size_t> sizes = {1, 700, 4096, MiB, 3 * MiB + 1, 100};
  std::vector<void*> a, b;
  for (std::size_t n : sizes) {
    a.push_back(guarded.allocate(n, MemCategory::Weights));
    b.push_back(plain.allocate(n, MemCategory::Weights));
    EXPECT_EQ(guarded.block_size(a.back()), plain.block_size(b.back())) << n;
  }
  EXPECT_EQ(gbe.fills, 0);
  EXPECT_EQ(tg.stats().total, tp.stats().total);
  EXPECT_EQ(tg.stats().reserved, tp.stats().reserved);
  for (void* p : a) guarded.deallocate(p, MemCategory::Weights);
  for (void* p : b) plain.deallocate(p, MemCategory::Weights);
  EXPECT_EQ(gbe.reads, 0);
  guarded.empty_cache();
  plain.empty_cache();

  // Meta (no memory): guards on, the simulated blocks are unchanged, so a dry run is too.
  GuardBytesScope guards(64);
  CountingBackend cb;
  BlockPool meta(cb, nullptr, "meta");
  void* m = meta.allocate(1000, MemCategory::Weights);
  EXPECT_EQ(meta.block_size(m), 1024u);
  EXPECT_TRUE(meta.check_guards().empty());
  meta.deallocate(m, MemCategory::Weights);
  // A plain malloc pool (can_guard() false) ignores them too.
  void* x = plain.allocate(1000, MemCategory::Weights);
  EXPECT_EQ(plain.block_size(x), 1024u);
  plain.deallocate(x, MemCategory::Weights);
  plain.empty_cache();
}

TEST(CachingAllocatorGuards, GuardsMoveRequestsBetweenPoolsConsistently) {
  // 1 MiB is small without guards, large with them: the block then comes from a 20 MiB
  // segment, and the 19 MiB - 512 remainder is split off as a free block.
  GuardedMallocBackend be;
  BlockPool pool(be, nullptr, "test");
  GuardBytesScope guards(8);
  void* p = pool.allocate(MiB, MemCategory::Weights);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.reserved, 20 * MiB);
  EXPECT_EQ(pool.block_size(p), MiB + 512);
  EXPECT_EQ(s.allocated, MiB);
  EXPECT_EQ(s.block_bytes, MiB + 512);
  EXPECT_EQ(s.largest_free, 20 * MiB - MiB - 512);
  pool.deallocate(p, MemCategory::Weights);
  EXPECT_EQ(pool.stats().free_blocks, 1u);  // merged back whole
  EXPECT_EQ(pool.empty_cache(), 20 * MiB);
}

TEST(CachingAllocatorGuards, CheckGuardsWithoutADeviceIsEmpty) {
  if (cuda::device_count() > 0) {
    // With a device, every CUDA block is intact after the other tests.
    EXPECT_TRUE(caching::check_guards().empty());
    return;
  }
  EXPECT_TRUE(caching::check_guards().empty());
  EXPECT_EQ(caching::guard_bytes(), 0u);  // KILN_GUARD_BYTES is not set under ctest
}

// ---- the driver's view: runtime and unattributed rows -------------------------------------------

TEST(DeviceMemoryRows, UnattributedIsWhatNothingNames) {
  DeviceMemoryRows d;
  d.total = i64(80 * 1024 * MiB);
  d.used = i64(5000 * MiB);
  d.other = i64(100 * MiB);
  d.reserved = i64(4000 * MiB);
  d.allocated = i64(3500 * MiB);
  d.context = i64(500 * MiB);
  d.libraries = i64(34 * MiB);
  d.context_measured = true;
  EXPECT_EQ(d.runtime(), i64(534 * MiB));
  EXPECT_EQ(d.unattributed(), i64(366 * MiB));  // 5000 - 100 - 4000 - 534
  MemoryTracker t;
  t.on_reserve(i64(4000 * MiB));
  t.on_alloc(MemCategory::Weights, i64(3500 * MiB));
  const std::string text = format_memory_summary(t.stats(), "memory (cuda:0)", &d);
  EXPECT_NE(text.find("runtime"), std::string::npos) << text;
  EXPECT_NE(text.find("534.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("unattributed"), std::string::npos) << text;
  EXPECT_NE(text.find("366.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("other processes 100.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("allocator slack"), std::string::npos) << text;
  // Without rows (CPU), the table is as before: no driver lines.
  const std::string plain = format_memory_summary(t.stats(), "memory (cpu)");
  EXPECT_EQ(plain.find("unattributed"), std::string::npos) << plain;
}

TEST(DeviceMemoryRows, CudaDeviceMemoryAddsUpOnAGpu) {
  if (cuda::device_count() == 0) {
    EXPECT_THROW(cuda_device_memory(0), Error);  // no allocator without a device
    GTEST_SKIP() << "no CUDA device: cuda_device_memory";
  }
  CudaCachingAllocator& alloc = cuda_caching_allocator(0);
  void* p = alloc.allocate(64 * MiB, MemCategory::Activations);
  const DeviceMemoryRows d = cuda_device_memory(0);
  EXPECT_GE(d.reserved, i64(64 * MiB));
  EXPECT_GE(d.allocated, i64(64 * MiB));
  EXPECT_GT(d.context, 0);
  EXPECT_LE(d.used, d.total);
  // The driver sees at least our segments and the runtime we measured.
  EXPECT_GE(d.used, d.reserved + d.runtime() + d.other);
  EXPECT_GE(d.unattributed(), 0);
  alloc.deallocate(p, 64 * MiB, MemCategory::Activations);
}

// ---- the device
// ----------------------------------------------------------------------------------

TEST(CudaCachingAllocator, WithoutADeviceTheErrorIsClear) {
  if (cuda::device_count() > 0) {
    // A GPU machine must not skip: there the allocator exists, and an index past the last
    // device is the clear error instead.
    EXPECT_NO_THROW(allocator_for(Device::cuda()));
    try {
      cuda_caching_allocator(cuda::device_count());
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not a visible device"), std::string::npos)
          << e.what();
    }
    return;
  }
  try {
    allocator_for(Device::cuda());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[allocator] cuda: ", 0), 0u) << msg;
    EXPECT_NE(msg.find("--device cpu"), std::string::npos) << msg;
  }
}

TEST(CudaCachingAllocator, DeviceBlocksRoundTripAndCharge) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  CudaCachingAllocator& alloc = cuda_caching_allocator(0);
  alloc.empty_cache();
  ASSERT_EQ(alloc.stats().allocated, 0u) << "CUDA blocks alive from another test";
  MemoryTracker& t = MemoryTracker::get(DeviceType::CUDA);
  const MemStats base = t.stats();
  const cuda::MemInfo before = cuda::mem_get_info();
  EXPECT_EQ(&allocator_for(Device::cuda()), static_cast<Allocator*>(&alloc));
  const std::size_t n = 1000;
  void* p = alloc.allocate(n * sizeof(float), MemCategory::Weights);
  ASSERT_NE(p, nullptr);
  std::vector<float> host(n), back(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i) * 0.5f;
  cuda::memcpy_h2d(p, host.data(), n * sizeof(float));
  cuda::memcpy_d2h(back.data(), p, n * sizeof(float));
  EXPECT_EQ(back, host);
  const MemStats m = t.stats();
  EXPECT_EQ(m.total - base.total, i64(ref_round(n * sizeof(float))));
  EXPECT_EQ(m.reserved - base.reserved, i64(2 * MiB));
  const cuda::MemInfo during = cuda::mem_get_info();
  EXPECT_GE(before.free_bytes - during.free_bytes, 2 * MiB);  // the driver may round up more
  alloc.deallocate(p, n * sizeof(float), MemCategory::Weights);
  EXPECT_EQ(t.stats().total, base.total);
  EXPECT_EQ(alloc.empty_cache(), 2 * MiB);
  EXPECT_EQ(t.stats().reserved, base.reserved);
}

TEST(CudaCachingAllocator, GuardBytesCatchADeviceOverrun) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  CudaCachingAllocator& alloc = cuda_caching_allocator(0);
  MemoryTracker& t = MemoryTracker::get(DeviceType::CUDA);
  const std::int64_t base = t.stats().total;
  GuardBytesScope guards(64);
  auto* p = static_cast<std::uint8_t*>(alloc.allocate(1000, MemCategory::Activations));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(t.stats().total - base, i64(1024));  // charged as without guards
  std::vector<std::uint8_t> host(1064, 0);
  cuda::memcpy_d2h(host.data(), p, host.size());
  for (std::size_t i = 1000; i < 1064; ++i)
    ASSERT_EQ(host[i], caching::kGuardPattern) << "guard byte " << i;
  EXPECT_TRUE(caching::check_guards().empty());
  // Overrun by two bytes from the device side.
  const std::uint8_t junk[2] = {1, 2};
  cuda::memcpy_h2d(p + 1000, junk, 2);
  std::vector<std::string> v = caching::check_guards();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("2 of 64 guard bytes"), std::string::npos) << v[0];
  // Found again at free time, then reported once.
  alloc.deallocate(p, 1000, MemCategory::Activations);
  v = caching::check_guards();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("requested 1000 bytes"), std::string::npos) << v[0];
  EXPECT_TRUE(caching::check_guards().empty());
  EXPECT_EQ(t.stats().total, base);
}

}  // namespace
}  // namespace kiln
