// The collectives of data-parallel training, timed under mpirun: kiln's ring (distributed/mpi_ring.h,
// what MpiCommunicator runs) against MPI's own MPI_Ireduce_scatter / MPI_Iallreduce /
// MPI_Iallgatherv on the same f32 buffers in the same run. Sizes: stories15M's 4 MiB gradient
// bucket and its tied embedding's 36.9 MB (f32; half that in bf16), which is the bucket backward
// finishes last. kiln's bf16 ring is timed too (MPI has no bf16 type; its sum would be a user op).
//
//   mpirun -np 2 build-cpu/bench/kiln_bench_collectives [--rounds 7]
//
// Prints one JSON line per (collective, size, implementation) from rank 0: the median over the
// rounds of the slowest rank's milliseconds (a barrier before each round).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"
#include "distributed/shard.h"
#include "tensor/ops.h"

using namespace kiln;

namespace {

double timed(dist::Communicator& c, int rounds, const std::function<void()>& run) {
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    c.barrier();
    const double t0 = MPI_Wtime();
    run();
    ms.push_back(c.max_scalar((MPI_Wtime() - t0) * 1e3));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln's ring collectives against MPI's own, under mpirun"};
  int rounds = 7;
  app.add_option("--rounds", rounds, "timed rounds per case (the median is printed)")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  try {
    dist::Communicator& world = dist::world();
    if (world.backend() != "mpi") {
      std::fprintf(stderr,
                   "error: [bench_collectives] needs MPI (a world of ranks to time): run it under "
                   "mpirun -np 2\n");
      return 2;
    }
    auto& c = static_cast<dist::MpiCommunicator&>(world);
    const int r = c.rank(), n = c.size();
    auto report = [&](const char* op, std::int64_t numel, const char* impl, DType dt, double ms) {
      if (r == 0)
        std::printf(
            "{\"collective\": \"%s\", \"elements\": %lld, \"dtype\": \"%s\", \"impl\": \"%s\", "
            "\"ranks\": %d, \"ms\": %.3f}\n",
            op, static_cast<long long>(numel), std::string(dtype_name(dt)).c_str(), impl, n, ms);
    };
    for (std::int64_t numel : {std::int64_t{1} << 20, std::int64_t{9216000}}) {
      const std::vector<std::int64_t> counts = dist::shard_counts(numel, n);
      std::vector<int> icounts(counts.begin(), counts.end()), displs(counts.size());
      for (std::size_t q = 1; q < counts.size(); ++q) displs[q] = displs[q - 1] + icounts[q - 1];
      const auto me = static_cast<std::size_t>(r);
      for (DType dt : {DType::F32, DType::BF16}) {
        Tensor buf = ops::full({numel}, 1.0, dt), out = Tensor::empty({counts[me]}, dt);
        report("reduce_scatter", numel, "kiln_ring", dt,
               timed(c, rounds, [&] { c.reduce_scatter(buf, out, counts, dist::ReduceOp::Sum); }));
        report("all_reduce", numel, "kiln_ring", dt,
               timed(c, rounds, [&] { c.all_reduce(buf, dist::ReduceOp::Sum); }));
        report("all_gather", numel, "kiln_ring", dt,
               timed(c, rounds, [&] { c.all_gather(out, buf, counts); }));
        if (dt != DType::F32) continue;
        auto* b = static_cast<float*>(buf.raw_data());
        auto* o = static_cast<float*>(out.raw_data());
        auto finish = [&](MPI_Request& q) { c.wait(q, "bench"); };
        report("reduce_scatter", numel, "mpi", dt, timed(c, rounds, [&] {
                 MPI_Request q;
                 KILN_MPI(c, MPI_Ireduce_scatter(b, o, icounts.data(), MPI_FLOAT, MPI_SUM, c.comm(),
                                                 &q));
                 finish(q);
               }));
        report("all_reduce", numel, "mpi", dt, timed(c, rounds, [&] {
                 MPI_Request q;
                 KILN_MPI(c, MPI_Iallreduce(MPI_IN_PLACE, b, static_cast<int>(numel), MPI_FLOAT,
                                            MPI_SUM, c.comm(), &q));
                 finish(q);
               }));
        report("all_gather", numel, "mpi", dt, timed(c, rounds, [&] {
                 MPI_Request q;
                 KILN_MPI(c, MPI_Iallgatherv(o, icounts[me], MPI_FLOAT, b, icounts.data(),
                                             displs.data(), MPI_FLOAT, c.comm(), &q));
                 finish(q);
               }));
      }
    }
    return dist::finalize_world(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return dist::finalize_world(1);
  }
}
