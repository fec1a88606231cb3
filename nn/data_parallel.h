// Data parallelism over a dist::Communicator: every rank holds the whole model, runs its share of
// the global batch, and the gradients are combined in buckets while backward still runs.
//
// Buckets: the parameters in reverse order (the order backward finishes them), cut into buckets of
// about bucket_bytes. The autograd engine reports each parameter whose gradient is final
// (GradReadyHookScope); when every gradient of a bucket is final, its collective starts,
// non-blocking, and later buckets keep MPI progressing while backward goes on. Buckets start in
// index order on every rank (collectives must match).
//
// A bucket is rank-major: the part (segment) of rank q is, for each parameter of the bucket, the
// elements dist::shard_range(numel, q, world) of its gradient. The segments are views of the
// gradients themselves (dist::Communicator::Segments), which the communicator sends and receives
// in place: there is no packed copy. Then
//   - ZeRO-0 (plain data parallel): the bucket is all-reduced (mean) in place in each .grad,
//     so clipping and AdamW run on the same averaged gradients, identically, on every rank.
//   - ZeRO-1: the bucket is reduce-scattered (mean): rank r keeps only its part, the gradient of
//     its shard of every parameter, in one buffer per bucket (with more than two ranks the ring
//     leaves partial sums in the rest of each .grad, which nothing reads before zero_grad()). Each
//     rank clips (the norm is summed over the ranks) and steps AdamW on its shards only: m and v
//     (and f32 masters of bf16 parameters) hold shard_range(numel, r, world).size() elements per
//     parameter, charged to OptimizerState (MasterWeights). Then every rank's updated shards are
//     all-gathered, in place, into the parameters.
// ZeRO-1's shard gradients (and the MPI ring's receive buffer, distributed/mpi_ring.h) are Temporaries,
// freed by the end of the step. A parameter that no backward reached on this rank is given a zero
// gradient, so that it takes its part in the collective.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "autograd/engine.h"
#include "distributed/communicator.h"
#include "nn/optim.h"

namespace kiln::nn {

struct DataParallelOptions {
  int zero = 0;                         // 0: all-reduce; 1: ZeRO-1 (sharded AdamW state)
  std::int64_t bucket_bytes = 4 << 20;  // gradient bytes per bucket (at least one parameter)
  bool overlap = true;                  // false: all buckets start after backward
};

// The last step's communication, for logs and the scaling benchmark.
struct CommStats {
  double wait_ms = 0;             // after backward, waiting for the buckets (the exposed part)
  std::int64_t buffer_bytes = 0;  // ZeRO-1's shard gradient buffers (Temporaries)
  int buckets = 0;
  int started_in_backward = 0;  // buckets whose collective started before backward ended
};

class DataParallel {
 public:
  // `params`: the model's named parameters (contiguous). With zero == 1 the sharded AdamW is
  // built here (shard_optimizer()); with zero == 0 the caller keeps its own AdamW.
  DataParallel(dist::Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& params,
               const AdamWOptions& adamw, const DataParallelOptions& o);
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  ~DataParallel();

  // For GradReadyHookScope around backward().
  GradReadyHook grad_ready_hook();
  // After backward: starts what is left and waits for every bucket. ZeRO-0: each .grad is the mean
  // over the ranks. ZeRO-1: this rank's shard gradients are ready.
  CommStats finish_backward();

  // ZeRO-1 only: clips the shard gradients to a global norm of max_norm (if > 0; the squares are
  // summed over the ranks) and returns the norm before clipping.
  double clip_grad_norm(double max_norm);
  // ZeRO-1 only: AdamW on this rank's shards, then the parameters are all-gathered.
  void step();
  // ZeRO-1: zeroes the parameters' .grad and frees the shard gradients.
  void zero_grad();
  // ZeRO-1's AdamW over this rank's shards (named like the parameters; flat 1-D views).
  AdamW& shard_optimizer();

  // ZeRO-1, collective: every parameter's full AdamW state (m, v, and the f32 master of a low-
  // precision parameter), gathered from the shards into f32 CPU tensors of the parameter's shape
  // (Temporaries), with the step count; for save_checkpoint on rank 0.
  std::unique_ptr<Optimizer> gather_optimizer_state();
  // ZeRO-1: an empty full-size state to load a checkpoint into, then scatter_optimizer_state().
  std::unique_ptr<Optimizer> empty_full_optimizer_state() const;
  // ZeRO-1: takes this rank's shards of `full` (as made by the two calls above) into the sharded
  // AdamW, and its step count.
  void scatter_optimizer_state(const Optimizer& full);

  dist::Communicator& comm() { return comm_; }
  int zero() const { return o_.zero; }
  const CommStats& last_stats() const { return stats_; }

 private:
  struct Param;
  struct Bucket;
  void on_grad_ready(TensorImpl* leaf);
  void start_ready_buckets();
  void start_bucket(Bucket& b);
  // Bucket b's gradients (or, with params, its parameters) as rank-major segments: segment q
  // holds, for each parameter of b in order, the elements shard_range(numel, q, world).
  dist::Communicator::Segments segments(const Bucket& b, bool params) const;
  void all_gather_params();

  dist::Communicator& comm_;
  DataParallelOptions o_;
  int rank_ = 0, world_ = 1;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::unordered_map<TensorImpl*, std::size_t> param_of_;
  std::size_t next_bucket_ = 0;  // the next bucket to start
  std::unique_ptr<AdamW> shard_opt_;
  std::vector<Tensor> shard_views_;  // per parameter (undefined where this rank's shard is empty)
  CommStats stats_;
  bool in_backward_ = false;
};

}  // namespace kiln::nn
