// The host side of NCCL's start-up, apart from NCCL so that it builds and is tested on the CPU:
// rank 0's ncclUniqueId travels to every rank over MPI (as llm.c does), and each rank takes the GPU
// of its index among the ranks on its host (one rank per GPU).
#pragma once

#include <array>
#include <string>

#include "distributed/communicator.h"

namespace kiln::dist {

// NCCL_UNIQUE_ID_BYTES: the size of an ncclUniqueId (nccl.h), checked against it where NCCL is
// compiled in.
inline constexpr std::size_t kNcclUniqueIdBytes = 128;
using UniqueIdBytes = std::array<char, kNcclUniqueIdBytes>;

// Every rank returns root's `id` (the other ranks' argument is ignored). The bytes travel
// unchanged, whatever they hold.
UniqueIdBytes broadcast_unique_id(Communicator& comm, const UniqueIdBytes& id, int root = 0);

// The CUDA device of the rank that is `local_rank` of `local_size` ranks on `host`, which sees
// `n_devices` GPUs: device local_rank. Fails, naming the host and the counts, when the host runs
// more ranks than it has GPUs (ranks must not share a GPU).
int device_for_local_rank(int local_rank, int local_size, int n_devices, const std::string& host);

}  // namespace kiln::dist
