// MpiCommunicator: collectives on CPU tensors over MPI (OpenMPI in the set-up). One rank per
// process; MPI is initialized (MPI_THREAD_FUNNELED: only the main thread calls MPI, OpenMP threads
// stay inside kernels) when world() first runs under an MPI launcher, and never otherwise.
// all_reduce, reduce_scatter and all_gather run as rings of point-to-point messages
// (distributed/mpi_ring.h, which says why); broadcast and barrier are MPI's own.
//
// Errors: MPI_COMM_WORLD and the job's communicator return errors instead of aborting
// (MPI_ERRORS_RETURN); every return code is checked. Every collective is started non-blocking and
// waited on with a deadline (KILN_DIST_TIMEOUT_S, default 600 s: longer than rank 0's evaluation
// and checkpoint, which the others wait out in their next collective). While waiting, the ranks on
// this host are probed once a second by pid (exchanged at start-up), so a killed peer is named
// within about a second; a peer on another host is named by the deadline.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace kiln::dist {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator();  // MPI_Init_thread unless MPI is initialized already
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::unique_ptr<PendingOp> start_all_reduce(Tensor& t, ReduceOp op) override;
  std::unique_ptr<PendingOp> start_reduce_scatter(const Tensor& in, Tensor& out,
                                                  std::span<const std::int64_t> counts,
                                                  ReduceOp op) override;
  void all_gather(const Tensor& in, Tensor& out, std::span<const std::int64_t> counts) override;
  // The pieces are sent and received in place (no packing).
  std::unique_ptr<PendingOp> start_all_reduce(const Segments& s, ReduceOp op) override;
  std::unique_ptr<PendingOp> start_reduce_scatter(const Segments& in, Tensor& out,
                                                  ReduceOp op) override;
  void all_gather(const Segments& s) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;

  // This rank's index among the ranks on its host (MPI_COMM_TYPE_SHARED), and their number.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return peers_[static_cast<std::size_t>(rank_)].host; }
  MPI_Comm comm() const { return comm_; }

  // Waits for `req` until the deadline, probing same-host peers; fails naming a lost rank.
  void wait(MPI_Request& req, const char* op);
  // The same wait for any condition that MPI progress makes true (`done` tests requests).
  void wait_until(const std::function<bool()>& done, const char* op);
  // Non-throwing test of `req` (MPI progress); fails on an MPI error.
  bool test(MPI_Request& req, const char* op);
  // Ends the job (see finalize_world()).
  int finalize(int rc);

  // Fails with MPI's own words for `rc` (and any lost peer), naming the call.
  [[noreturn]] void fail_mpi(int rc, const char* call);
  MPI_Datatype mpi_type(DType t) const;
  // The tag of the next point-to-point collective (distributed/mpi_ring.h): the same sequence on every
  // rank, since collectives start in the same order everywhere.
  int next_tag() { return tag_ = tag_ % 32767 + 1; }  // MPI guarantees tags up to 32767

 private:
  struct Peer {
    int pid = 0;
    std::string host;
  };
  // The ranks on this host whose process is gone (exited, killed or a zombie).
  std::vector<int> lost_local_peers() const;
  [[noreturn]] void fail_lost(const std::vector<int>& lost, const char* op);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, tag_ = 0;
  bool own_init_ = false;
  bool failed_ = false;
  double timeout_s_ = 600;
  std::vector<Peer> peers_;
  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;
};

// Calls an MPI function and fails through `self` (an MpiCommunicator) on any other return code.
#define KILN_MPI(self, call)                                               \
  do {                                                                     \
    const int kiln_mpi_rc_ = (call);                                       \
    if (kiln_mpi_rc_ != MPI_SUCCESS) (self).fail_mpi(kiln_mpi_rc_, #call); \
  } while (0)

// MPI's message for an error code.
std::string mpi_error_string(int rc);

}  // namespace kiln::dist
