// Ring collectives on CPU tensors over MPI point-to-point messages, for MpiCommunicator's
// all_reduce, reduce_scatter and all_gather. Internal to distributed/.
//
// Why not MPI's own collectives: with two ranks on one host, OpenMPI 4.1's MPI_Ireduce_scatter
// and MPI_Iallreduce are 3.5-5x slower than this ring on stories15M's tied-embedding gradient
// (9.2M f32: 27-30 ms vs 6-6.5 ms and 38-40 ms vs 9-11 ms; its all-gather is about as fast) and
// need a user-op for bf16, whose 18 MB reduce-scatter took 20 ms against the ring's 3.3 ms
// (bench/bench_collectives.cpp, bench/results/collectives_*). Each rank runs on one core of the
// job's, so every millisecond a collective spends is taken from backward: the collectives are
// the data-parallel trainer's main cost above one process.
//
// The algorithm is the usual ring over the W ranks, on a buffer cut into W segments (segment q is
// rank q's part), with left = rank - 1 and right = rank + 1 (mod W):
//   reduce-scatter, steps s = 0 .. W-2: send segment (rank - s - 1) to the right, receive
//     segment (rank - s - 2) from the left and add this rank's own values to it. After the last
//     step, segment `rank` holds the sum over every rank, added in ring order.
//   all-gather, steps s = 0 .. W-2: send segment (rank - s) to the right, receive segment
//     (rank - s - 1) from the left into place.
//   all-reduce: reduce-scatter, then (for Avg) the owned segment scaled by 1/W, then all-gather.
// Every element is summed once, by its segment's owner, in one fixed order, so every rank ends
// with the same bits, and an all-reduce gives exactly the values a reduce-scatter does.
// bf16 pairs are added in f32 and rounded once (kernels/cpu/elementwise.h's add).
//
// Each step posts one MPI_Irecv and one MPI_Isend; test() advances the steps as their messages
// complete, so a collective in flight progresses whenever the caller tests it (DataParallel does
// from its gradient-ready hook). Every collective has its own tag, taken from a counter that
// advances identically on every rank (collectives start in the same order everywhere), so
// collectives in flight together never take each other's messages.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "distributed/communicator.h"

namespace kiln::dist {

class MpiCommunicator;

enum class RingKind { AllReduce, ReduceScatter, AllGather };

// Starts a ring collective on `segments` (Communicator::Segments: segment q, rank q's part, is the
// concatenation of its pieces, contiguous CPU views of the same sizes on every rank):
//   AllReduce: every piece becomes the sum (or mean) over the ranks, in place; `out` is unused.
//   ReduceScatter: `out` (the numel of segment `rank`) receives the sum (or mean) of every rank's
//     segment `rank`. Other segments' pieces are overwritten with partial sums (W > 2).
//   AllGather: segment `rank` holds this rank's values; the others are received into place.
//     `avg` must be false.
// A segment's pieces travel as one message each (in order; empty pieces send nothing). The
// tensors must stay alive and untouched until the returned op is done.
std::unique_ptr<PendingOp> start_ring(MpiCommunicator& c, RingKind kind, const char* op,
                                      Communicator::Segments segments, const Tensor& out, bool avg);

// The segments of one contiguous buffer cut into counts[q] elements per rank, rank order.
Communicator::Segments contiguous_segments(const Tensor& buf, std::span<const std::int64_t> counts);

}  // namespace kiln::dist
