// Data parallelism over MPI, run by ctest as `mpirun -np 2 test_dist --gtest_filter=...`
// (tests/CMakeLists.txt: the dist.* tests): the Communicator's collectives and NCCL's host-side
// bootstrap. Each test also passes in a world of one (run without mpirun).
#include <gtest/gtest.h>

#include "dist/communicator.h"
#include "dist/mpi_communicator.h"
#include "dist/nccl_bootstrap.h"
#include "dist/nccl_communicator.h"
#include "dist/shard.h"
#include "kernels/cuda/runtime.h"
#include "tests/dist/dist_test_util.h"

using namespace kiln;
using kiln::test::comm;

// ---- the Communicator ------------------------------------------------------------------------

TEST(Dist, CollectivesF32Bf16F64) {
  dist::Communicator& c = comm();
  const int r = c.rank(), n = c.size();
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    // all_reduce: element i of rank r is r + i; the sum is n(n-1)/2 + n i (exact in bf16 here).
    Tensor t = Tensor::empty({5}, DType::F32);
    for (int i = 0; i < 5; ++i) t.data<float>()[i] = static_cast<float>(r + i);
    Tensor s = t.to(dt).clone(), a = t.to(dt).clone();
    c.all_reduce(s, dist::ReduceOp::Sum);
    c.all_reduce(a, dist::ReduceOp::Avg);
    const auto sv = s.to_double_vector(), av = a.to_double_vector();
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(sv[i], n * (n - 1) / 2.0 + n * i) << dtype_name(dt);
      EXPECT_EQ(av[i], (n - 1) / 2.0 + i) << dtype_name(dt);
    }
    // reduce_scatter with uneven parts (ZeRO's shards of 7 elements): every rank sends r + 1.
    const std::vector<std::int64_t> counts = dist::shard_counts(7, n);
    Tensor in = Tensor::empty({7}, DType::F32);
    for (int i = 0; i < 7; ++i) in.data<float>()[i] = static_cast<float>((r + 1) * (i + 1));
    Tensor out = Tensor::empty({counts[static_cast<std::size_t>(r)]}, dt);
    c.reduce_scatter(in.to(dt), out, counts, dist::ReduceOp::Sum);
    const auto range = dist::shard_range(7, r, n);
    const auto ov = out.to_double_vector();
    for (std::int64_t i = 0; i < range.size(); ++i)
      EXPECT_EQ(ov[static_cast<std::size_t>(i)], n * (n + 1) / 2.0 * (range.begin + i + 1));
    // all_gather puts the parts back in rank order.
    Tensor mine = Tensor::empty({range.size()}, DType::F32);
    for (std::int64_t i = 0; i < range.size(); ++i)
      mine.data<float>()[i] = static_cast<float>(range.begin + i);
    Tensor all = Tensor::empty({7}, dt);
    c.all_gather(mine.to(dt), all, counts);
    const auto gv = all.to_double_vector();
    for (int i = 0; i < 7; ++i) EXPECT_EQ(gv[static_cast<std::size_t>(i)], i);
    // broadcast from the last rank.
    Tensor b = Tensor::empty({3}, DType::F32);
    for (int i = 0; i < 3; ++i) b.data<float>()[i] = static_cast<float>(10 * r + i);
    Tensor bt = b.to(dt);
    c.broadcast(bt, n - 1);
    const auto bv = bt.to_double_vector();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(bv[static_cast<std::size_t>(i)], 10 * (n - 1) + i);
  }
  c.barrier();
  EXPECT_EQ(c.max_scalar(static_cast<double>(r)), n - 1);
}

TEST(Dist, RefusesMismatchedBuffers) {
  Tensor t = Tensor::empty({4}, DType::I32);
  try {
    comm().all_reduce(t, dist::ReduceOp::Sum);
    FAIL() << "an i32 all_reduce was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected f32, bf16 or f64"), std::string::npos)
        << e.what();
  }
}

// ---- NCCL's host side, on the CPU --------------------------------------------------------------

TEST(Dist, NcclBootstrapBroadcastsUniqueIdOverMpi) {
  dist::Communicator& c = comm();
  // Each rank starts with different bytes (all 256 values appear); every rank ends with rank 0's.
  dist::UniqueIdBytes id{};
  for (std::size_t i = 0; i < id.size(); ++i)
    id[i] = static_cast<char>((i * 37 + 11 * static_cast<std::size_t>(c.rank())) & 0xff);
  const dist::UniqueIdBytes got = dist::broadcast_unique_id(c, id);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(static_cast<unsigned char>(got[i]), static_cast<unsigned char>((i * 37) & 0xff));
}

TEST(Dist, NcclBootstrapMapsOneRankPerGpu) {
  EXPECT_EQ(dist::device_for_local_rank(0, 2, 2, "h"), 0);
  EXPECT_EQ(dist::device_for_local_rank(1, 2, 8, "h"), 1);
  try {
    dist::device_for_local_rank(1, 2, 1, "node7");  // two ranks, one GPU: the lent machines
    FAIL() << "two ranks on one GPU were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node7 runs 2 ranks but sees 1 GPU"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dist::device_for_local_rank(0, 1, 0, "h"), Error);
  // Under mpirun on one host, the local ranks are the ranks.
  if (comm().backend() == "mpi") {
    auto& m = static_cast<dist::MpiCommunicator&>(comm());
    EXPECT_EQ(m.local_size(), m.size());
    EXPECT_EQ(m.local_rank(), m.rank());
  }
}

TEST(Dist, NcclCollectivesOnGpus) {
  const int gpus = cuda::device_count();
  if (!cuda::compiled_with_cuda() || gpus < comm().size() || comm().size() < 2)
    GTEST_SKIP() << "NCCL needs one GPU per rank and 2+ ranks: this is a "
                 << (cuda::compiled_with_cuda() ? "CUDA" : "CPU-only") << " build with " << gpus
                 << " GPU(s) for " << comm().size() << " rank(s)";
#if defined(KILN_CUDA)
  dist::NcclCommunicator nccl(static_cast<dist::MpiCommunicator&>(comm()));
  const Device d = Device::cuda(nccl.device());
  Tensor t = Tensor::empty({4}, DType::F32);
  for (int i = 0; i < 4; ++i) t.data<float>()[i] = static_cast<float>(nccl.rank() + i);
  Tensor g = t.to(d);
  nccl.all_reduce(g, dist::ReduceOp::Sum);
  const auto v = g.to(Device::cpu()).to_double_vector();
  const int n = nccl.size();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v[static_cast<std::size_t>(i)], n * (n - 1) / 2.0 + n * i);
#endif
}

// Without an MPI launcher the world is one process and MPI is never initialized.
TEST(Dist, WorldOfOneNeedsNoMpi) {
  if (dist::launched_by_mpi()) {
    EXPECT_EQ(comm().backend(), "mpi");
    return;
  }
  EXPECT_EQ(comm().backend(), "local");
  EXPECT_EQ(comm().size(), 1);
  int initialized = 1;
  ASSERT_EQ(MPI_Initialized(&initialized), MPI_SUCCESS);
  EXPECT_EQ(initialized, 0);
}
