#include "distributed/nccl_bootstrap.h"

#include <cstring>

#include "distributed/nccl_communicator.h"

namespace kiln::dist {

UniqueIdBytes broadcast_unique_id(Communicator& comm, const UniqueIdBytes& id, int root) {
  // 128 bytes as 16 f64 elements: MPI moves them as bits (no conversion between like hosts).
  static_assert(kNcclUniqueIdBytes % sizeof(double) == 0);
  Tensor t =
      Tensor::empty({static_cast<std::int64_t>(kNcclUniqueIdBytes / sizeof(double))}, DType::F64);
  if (comm.rank() == root) std::memcpy(t.raw_data(), id.data(), kNcclUniqueIdBytes);
  comm.broadcast(t, root);
  UniqueIdBytes out{};
  std::memcpy(out.data(), t.raw_data(), kNcclUniqueIdBytes);
  return out;
}

Communicator* communicator_for(Device device, Communicator* given,
                               std::unique_ptr<Communicator>& own) {
  Communicator* c = given ? given : &world();
#if defined(KILN_CUDA)
  if (device.is_cuda() && c->size() > 1 && c->backend() == "mpi") {
    own = std::make_unique<NcclCommunicator>(static_cast<MpiCommunicator&>(*c));
    return own.get();
  }
#else
  (void)own;
#endif
  KILN_CHECK(!device.is_cuda() || c->size() == 1 || c->backend() == "nccl",
             "[dist] {} ranks on CUDA need the NCCL backend, got {}", c->size(), c->backend());
  return c;
}

int device_for_local_rank(int local_rank, int local_size, int n_devices, const std::string& host) {
  KILN_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size,
             "[nccl] local rank {} of {} on {} is out of range", local_rank, local_size, host);
  KILN_CHECK(n_devices >= 1, "[nccl] {} has no visible CUDA device for its {} rank(s)", host,
             local_size);
  KILN_CHECK(local_size <= n_devices,
             "[nccl] {} runs {} ranks but sees {} GPU(s); launch one rank per GPU (mpirun -np "
             "{} per host, or fewer)",
             host, local_size, n_devices, n_devices);
  return local_rank;
}

}  // namespace kiln::dist
