// NcclCommunicator: collectives on CUDA tensors over NCCL, one rank per GPU (CUDA builds only).
// Start-up goes through MPI (distributed/nccl_bootstrap.h): rank 0's ncclUniqueId is broadcast over the
// MpiCommunicator, each rank takes the GPU of its local rank, then ncclCommInitRank. Collectives
// run on the default stream, in order with kiln's kernels; a wait polls the collective's event and
// ncclCommGetAsyncError with the same deadline as MPI (KILN_DIST_TIMEOUT_S), and aborts the NCCL
// communicator on an error or timeout, so a lost peer ends this rank instead of hanging it.
#pragma once

#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"

namespace kiln::dist {

#if defined(KILN_CUDA)

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `mpi`'s ranks; makes this rank's GPU current.
  explicit NcclCommunicator(MpiCommunicator& mpi);
  ~NcclCommunicator() override;
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  std::string backend() const override { return "nccl"; }
  int device() const { return device_; }
  using Communicator::all_gather;  // the pieces' versions: the base class packs them
  using Communicator::start_all_reduce;
  using Communicator::start_reduce_scatter;
  std::unique_ptr<PendingOp> start_all_reduce(Tensor& t, ReduceOp op) override;
  std::unique_ptr<PendingOp> start_reduce_scatter(const Tensor& in, Tensor& out,
                                                  std::span<const std::int64_t> counts,
                                                  ReduceOp op) override;
  void all_gather(const Tensor& in, Tensor& out, std::span<const std::int64_t> counts) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;

  // Waits for work recorded in `event` (a cudaEvent_t), checking NCCL's async error.
  void wait_event(void* event, const char* op);

 private:
  MpiCommunicator& mpi_;
  void* comm_ = nullptr;  // ncclComm_t
  int device_ = 0;
  double timeout_s_ = 600;
};

#endif  // KILN_CUDA

// The communicator for tensors on `device`: `given`, else the process's world; on CUDA with more
// than one MPI rank, NCCL over that MPI world (one rank per GPU), kept alive in `own`. Fails
// when CUDA tensors would meet a backend that cannot move them.
Communicator* communicator_for(Device device, Communicator* given,
                               std::unique_ptr<Communicator>& own);

}  // namespace kiln::dist
