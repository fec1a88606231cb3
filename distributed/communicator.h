// Collectives over the ranks of one training job, on kiln Tensors.
//
// A Communicator is one process's handle on the job: rank() of size() processes. Backends:
//   - LocalCommunicator: a world of one (no MPI at run time; every collective is a copy or
//   nothing).
//   - MpiCommunicator (distributed/mpi_communicator.h): CPU tensors over MPI, one rank per process.
//   - NcclCommunicator (distributed/nccl_communicator.h, CUDA builds): CUDA tensors over NCCL, one rank
//     per GPU, bootstrapped through MPI.
// world() picks the process's communicator once: MPI when the process was started by an MPI
// launcher (mpirun/srun set OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK), else a world of one.
//
// Tensors must be contiguous, of the same dtype and (where the op says so) the same numel on every
// rank. f32, bf16 and f64 are reduced; bf16 sums run in f32 per element pair and round once.
// A lost peer never hangs a rank: every wait has a deadline (KILN_DIST_TIMEOUT_S, default 600 s)
// and same-host peers are probed for life while waiting, so the error names the lost rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace kiln::dist {

enum class ReduceOp { Sum, Avg };

// A collective in flight. wait() finishes it (and, for Avg, divides by the world size).
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // Lets the transport progress; true when done (wait() then returns at once).
  virtual bool test() = 0;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "nccl"

  // t (same numel on every rank) becomes the sum or mean of every rank's t, in place.
  virtual std::unique_ptr<PendingOp> start_all_reduce(Tensor& t, ReduceOp op) = 0;
  // in: numel = sum(counts) on every rank, rank q's part at offset counts[0] + ... + counts[q-1].
  // out: numel = counts[rank()]; receives the sum or mean of every rank's part `rank()`.
  virtual std::unique_ptr<PendingOp> start_reduce_scatter(const Tensor& in, Tensor& out,
                                                          std::span<const std::int64_t> counts,
                                                          ReduceOp op) = 0;
  // in: numel = counts[rank()]; out: numel = sum(counts), every rank's `in` in rank order.
  virtual void all_gather(const Tensor& in, Tensor& out, std::span<const std::int64_t> counts) = 0;
  // t on every rank becomes root's t.
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;

  // The same three collectives on a buffer given in pieces, so that a caller whose data lives in
  // many tensors (DataParallel's gradients and parameters) needs no packing copy. segments[q] is
  // rank q's part: the concatenation of its pieces (contiguous views), which every rank gives in
  // the same number and sizes. The base class packs the pieces into one tensor and unpacks it;
  // MpiCommunicator sends and receives the pieces in place.
  using Segments = std::vector<std::vector<Tensor>>;
  // Every piece becomes the sum or mean over the ranks of that piece.
  virtual std::unique_ptr<PendingOp> start_all_reduce(const Segments& s, ReduceOp op);
  // out (numel of segment rank()) receives the sum or mean of every rank's segment rank(). The
  // pieces of other segments may be overwritten with partial sums.
  virtual std::unique_ptr<PendingOp> start_reduce_scatter(const Segments& in, Tensor& out,
                                                          ReduceOp op);
  // Segment rank() holds this rank's values; every other segment receives its rank's.
  virtual void all_gather(const Segments& s);

  void all_reduce(Tensor& t, ReduceOp op) { start_all_reduce(t, op)->wait(); }
  void reduce_scatter(const Tensor& in, Tensor& out, std::span<const std::int64_t> counts,
                      ReduceOp op) {
    start_reduce_scatter(in, out, counts, op)->wait();
  }
  // One f64 value reduced over the ranks (CPU; for losses, norms and byte counts).
  double all_reduce_scalar(double v, ReduceOp op);
  // The largest of every rank's v.
  double max_scalar(double v);
};

// The process's communicator (created on first use; see the file comment).
Communicator& world();
// True when this process was started by an MPI launcher (the environment world() reads).
bool launched_by_mpi();
// Ends the job at the end of main(): with rc == 0 MPI is finalized; a failing rank (rc != 0 or a
// lost peer) aborts the whole job instead, so that no peer waits for it until its deadline.
int finalize_world(int rc);

// A world of one: all_reduce and broadcast leave t as it is, reduce_scatter and all_gather copy.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  using Communicator::all_gather;  // the pieces' versions: the base class packs them
  using Communicator::start_all_reduce;
  using Communicator::start_reduce_scatter;
  std::unique_ptr<PendingOp> start_all_reduce(Tensor& t, ReduceOp op) override;
  std::unique_ptr<PendingOp> start_reduce_scatter(const Tensor& in, Tensor& out,
                                                  std::span<const std::int64_t> counts,
                                                  ReduceOp op) override;
  void all_gather(const Tensor& in, Tensor& out, std::span<const std::int64_t> counts) override;
  void broadcast(Tensor&, int root) override;
  void barrier() override {}
};

// Checks shared by the backends: `t` is contiguous, of a reducible dtype, `numel` long.
void check_buffer(const Tensor& t, std::int64_t numel, const char* op, const char* what);
std::int64_t sum_counts(std::span<const std::int64_t> counts, int world, const char* op);

// The deadline of every wait, in seconds: KILN_DIST_TIMEOUT_S (default 600), checked.
double wait_timeout_s();

// The per-rank element counts of one parameter's ZeRO shards (distributed/shard.h), rank order.
std::vector<std::int64_t> shard_counts(std::int64_t numel, int world);

}  // namespace kiln::dist
