#include "nn/data_parallel.h"

#include <chrono>
#include <cmath>

#include "distributed/shard.h"
#include "tensor/ops.h"

namespace kiln::nn {

struct DataParallel::Param {
  std::string name;
  Tensor p;
  std::int64_t numel = 0;
  std::size_t bucket = 0;
  std::vector<std::int64_t> in_segment;  // per rank q: offset inside q's part of the bucket
};

struct DataParallel::Bucket {
  std::vector<std::size_t> params;
  DType dtype = DType::F32;
  Device device = Device::cpu();
  std::vector<std::int64_t> counts;       // per rank: its part's elements
  std::vector<std::int64_t> segment_off;  // per rank: its part's offset
  std::int64_t numel = 0;
  int pending = 0;  // gradients not final yet in this backward
  Tensor shard;     // ZeRO-1: this rank's part, reduced
  std::unique_ptr<dist::PendingOp> op;
};

namespace {

// A full-size AdamW state to gather into or load from: m, v (and masters) f32 CPU Temporaries.
class FullOptimizerState final : public Optimizer {
 public:
  void add(const std::string& name, const Tensor& p) {
    MemoryScope scope(MemCategory::Temporaries);
    ParamState s{name,
                 p,
                 Tensor::empty(p.shape(), DType::F32),
                 Tensor::empty(p.shape(), DType::F32),
                 p.dim() >= 2,
                 Tensor()};
    if (p.dtype() != DType::F32) s.master = Tensor::empty(p.shape(), DType::F32);
    state_.push_back(std::move(s));
  }
  void step() override { fail("[zero] a gathered optimizer state is for checkpoints, not steps"); }
};

Tensor flat_slice(const Tensor& t, std::int64_t begin, std::int64_t len) {
  return t.view({t.numel()}).narrow(0, begin, len);
}

}  // namespace

DataParallel::DataParallel(dist::Communicator& comm,
                           const std::vector<std::pair<std::string, Tensor>>& params,
                           const AdamWOptions& adamw, const DataParallelOptions& o)
    : comm_(comm), o_(o), rank_(comm.rank()), world_(comm.size()) {
  KILN_CHECK(o.zero == 0 || o.zero == 1, "[dist] --zero {}: the trainer implements ZeRO 0 and 1",
             o.zero);
  KILN_CHECK(o.bucket_bytes > 0, "[dist] bucket size {} must be > 0", o.bucket_bytes);
  for (const auto& [name, p] : params) {
    KILN_CHECK(p.is_contiguous(), "[dist] parameter {} is not contiguous", name);
    KILN_CHECK(
        o.zero == 0 || p.device().is_cpu(),
        "[dist] --zero 1 runs on the CPU for now; on CUDA use --zero 0 (NCCL data parallel)");
    params_.push_back({name, p, p.numel(), 0, {}});
  }
  // Buckets over the parameters in reverse: backward finishes the last layers first.
  std::int64_t bytes = 0;
  for (std::size_t k = params_.size(); k-- > 0;) {
    Param& pr = params_[k];
    const bool fresh = buckets_.empty() || bytes >= o.bucket_bytes ||
                       buckets_.back().dtype != pr.p.dtype() ||
                       buckets_.back().device != pr.p.device();
    if (fresh) {
      buckets_.emplace_back();
      buckets_.back().dtype = pr.p.dtype();
      buckets_.back().device = pr.p.device();
      buckets_.back().counts.assign(static_cast<std::size_t>(world_), 0);
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    pr.bucket = buckets_.size() - 1;
    pr.in_segment.resize(static_cast<std::size_t>(world_));
    for (int q = 0; q < world_; ++q) {
      const auto qi = static_cast<std::size_t>(q);
      pr.in_segment[qi] = b.counts[qi];
      b.counts[qi] += dist::shard_range(pr.numel, q, world_).size();
    }
    b.params.push_back(k);
    b.numel += pr.numel;
    bytes += pr.numel * static_cast<std::int64_t>(dtype_size(pr.p.dtype()));
    param_of_[pr.p.impl()] = k;
  }
  for (Bucket& b : buckets_) {
    b.segment_off.assign(static_cast<std::size_t>(world_), 0);
    for (int q = 1; q < world_; ++q)
      b.segment_off[static_cast<std::size_t>(q)] = b.segment_off[static_cast<std::size_t>(q - 1)] +
                                                   b.counts[static_cast<std::size_t>(q - 1)];
  }
  if (o.zero == 1) {
    // AdamW over flat views of this rank's shards: its m, v (and masters) are shard-sized.
    std::vector<std::pair<std::string, Tensor>> views;
    std::vector<bool> decay;
    shard_views_.resize(params_.size());
    for (std::size_t k = 0; k < params_.size(); ++k) {
      const dist::ShardRange r = dist::shard_range(params_[k].numel, rank_, world_);
      if (r.size() == 0) continue;
      shard_views_[k] = flat_slice(params_[k].p, r.begin, r.size());
      views.emplace_back(params_[k].name, shard_views_[k]);
      decay.push_back(params_[k].p.dim() >= 2);  // the full parameter's rule, not the view's
    }
    shard_opt_ = std::make_unique<AdamW>(views, adamw);
    for (std::size_t i = 0; i < decay.size(); ++i) shard_opt_->state()[i].decay = decay[i];
  }
}

DataParallel::~DataParallel() = default;

GradReadyHook DataParallel::grad_ready_hook() {
  for (Bucket& b : buckets_) b.pending = static_cast<int>(b.params.size());
  next_bucket_ = 0;
  stats_ = {};
  in_backward_ = true;
  return [this](TensorImpl* leaf) { on_grad_ready(leaf); };
}

void DataParallel::on_grad_ready(TensorImpl* leaf) {
  auto it = param_of_.find(leaf);
  if (it == param_of_.end()) return;
  buckets_[params_[it->second].bucket].pending--;
  if (o_.overlap) start_ready_buckets();
  // Non-blocking collectives progress only inside MPI calls: poke the ones in flight.
  for (std::size_t k = 0; k < next_bucket_; ++k)
    if (buckets_[k].op) buckets_[k].op->test();
}

void DataParallel::start_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    start_bucket(buckets_[next_bucket_]);
    if (in_backward_) stats_.started_in_backward++;
    next_bucket_++;
  }
}

dist::Communicator::Segments DataParallel::segments(const Bucket& b, bool params) const {
  dist::Communicator::Segments s(static_cast<std::size_t>(world_));
  for (int q = 0; q < world_; ++q)
    for (std::size_t k : b.params) {
      const Param& pr = params_[k];
      const dist::ShardRange r = dist::shard_range(pr.numel, q, world_);
      s[static_cast<std::size_t>(q)].push_back(
          flat_slice(params ? pr.p : pr.p.grad(), r.begin, r.size()));
    }
  return s;
}

void DataParallel::start_bucket(Bucket& b) {
  for (std::size_t k : b.params) {
    Tensor& p = params_[k].p;
    if (!p.grad().defined()) {
      // No gradient reached it on this rank; it still takes its part (zeros) in the collective,
      // and afterwards holds the ranks' mean like every other parameter.
      MemoryScope scope(MemCategory::Gradients);
      p.set_grad(ops::zeros(p.shape(), p.dtype(), p.device()));
    }
  }
  // The gradients travel in place, as the bucket's rank-major segments (dist::Communicator::
  // Segments): no packing copy.
  if (o_.zero == 0) {
    b.op = comm_.start_all_reduce(segments(b, false), dist::ReduceOp::Avg);
  } else {
    MemoryScope scope(MemCategory::Temporaries);
    b.shard = Tensor::empty({b.counts[static_cast<std::size_t>(rank_)]}, b.dtype, b.device);
    stats_.buffer_bytes += static_cast<std::int64_t>(b.shard.nbytes());
    b.op = comm_.start_reduce_scatter(segments(b, false), b.shard, dist::ReduceOp::Avg);
  }
}

CommStats DataParallel::finish_backward() {
  in_backward_ = false;
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_) b.pending = 0;  // parameters no node reached: start them anyway
  start_ready_buckets();
  for (Bucket& b : buckets_) {
    b.op->wait();
    b.op.reset();
    if (o_.zero == 1) {
      // This rank's shard gradients are views of the bucket's reduced part.
      for (std::size_t k : b.params) {
        const dist::ShardRange r = dist::shard_range(params_[k].numel, rank_, world_);
        if (r.size() > 0)
          shard_views_[k].set_grad(
              b.shard.narrow(0, params_[k].in_segment[static_cast<std::size_t>(rank_)], r.size()));
      }
    }
  }
  stats_.buckets = static_cast<int>(buckets_.size());
  stats_.wait_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return stats_;
}

double DataParallel::clip_grad_norm(double max_norm) {
  KILN_CHECK(o_.zero == 1, "[dist] DataParallel::clip_grad_norm is ZeRO-1's");
  double sq = 0;
  std::vector<Tensor> grads;
  for (const Tensor& v : shard_views_)
    if (v.defined() && v.grad().defined()) grads.push_back(v.grad());
  for (const Tensor& g : grads) sq += ops::sum_squares(g);
  const double norm = std::sqrt(comm_.all_reduce_scalar(sq, dist::ReduceOp::Sum));
  if (max_norm > 0.0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);  // as nn::clip_grad_norm
    for (Tensor& g : grads) ops::scale_(g, scale);
  }
  return norm;
}

AdamW& DataParallel::shard_optimizer() {
  KILN_CHECK(shard_opt_ != nullptr, "[dist] no sharded optimizer without ZeRO-1");
  return *shard_opt_;
}

void DataParallel::step() {
  shard_optimizer().step();
  all_gather_params();
}

void DataParallel::all_gather_params() {
  // AdamW has updated this rank's shards in place; the other ranks' arrive in place too.
  for (Bucket& b : buckets_) comm_.all_gather(segments(b, true));
}

void DataParallel::zero_grad() {
  for (Param& pr : params_) {
    Tensor g = pr.p.grad();
    if (g.defined()) ops::fill_(g, 0.0);
  }
  for (Tensor& v : shard_views_)
    if (v.defined()) v.set_grad(Tensor());
  for (Bucket& b : buckets_) b.shard = Tensor();
}

std::unique_ptr<Optimizer> DataParallel::empty_full_optimizer_state() const {
  auto full = std::make_unique<FullOptimizerState>();
  for (const Param& pr : params_) full->add(pr.name, pr.p);
  return full;
}

std::unique_ptr<Optimizer> DataParallel::gather_optimizer_state() {
  AdamW& opt = shard_optimizer();
  auto full = empty_full_optimizer_state();
  full->step_count = opt.step_count;
  full->lr = opt.lr;
  std::size_t si = 0;  // the next entry of opt.state(): parameters with a non-empty shard
  MemoryScope scope(MemCategory::Temporaries);
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const Param& pr = params_[k];
    const std::vector<std::int64_t> counts = dist::shard_counts(pr.numel, world_);
    ParamState* mine = shard_views_[k].defined() ? &opt.state()[si++] : nullptr;
    ParamState& dst = full->state()[k];
    auto gather = [&](const Tensor* shard, Tensor& out) {
      const Device d = pr.p.device();
      Tensor in = shard ? *shard : Tensor::empty({0}, DType::F32, d);
      Tensor all = Tensor::empty({pr.numel}, DType::F32, d);
      comm_.all_gather(in, all, counts);
      out.view({pr.numel}).copy_(all.to(Device::cpu()));
    };
    gather(mine ? &mine->m : nullptr, dst.m);
    gather(mine ? &mine->v : nullptr, dst.v);
    if (dst.master.defined()) gather(mine ? &mine->master : nullptr, dst.master);
  }
  return full;
}

void DataParallel::scatter_optimizer_state(const Optimizer& full) {
  AdamW& opt = shard_optimizer();
  KILN_CHECK(full.state().size() == params_.size(), "[zero] state of {} parameters for {}",
             full.state().size(), params_.size());
  std::size_t si = 0;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    if (!shard_views_[k].defined()) continue;
    const dist::ShardRange r = dist::shard_range(params_[k].numel, rank_, world_);
    const ParamState& src = full.state()[k];
    ParamState& dst = opt.state()[si++];
    dst.m.copy_(flat_slice(src.m, r.begin, r.size()));
    dst.v.copy_(flat_slice(src.v, r.begin, r.size()));
    if (dst.master.defined())
      dst.master.copy_(
          flat_slice(src.master.defined() ? src.master : params_[k].p, r.begin, r.size()));
  }
  opt.step_count = full.step_count;
}

}  // namespace kiln::nn
