#include "distributed/communicator.h"

#include <climits>
#include <cstdlib>
#include <mutex>

#include "distributed/mpi_communicator.h"
#include "distributed/shard.h"
#include "tensor/ops.h"

namespace kiln::dist {

namespace {

class DonePending final : public PendingOp {
 public:
  bool test() override { return true; }
  void wait() override {}
};

// Segments packed into one contiguous tensor for the base class's collectives.
struct Packed {
  Tensor buf;
  std::vector<std::int64_t> counts;
};

std::int64_t segment_numel(const std::vector<Tensor>& pieces) {
  std::int64_t n = 0;
  for (const Tensor& t : pieces) n += t.numel();
  return n;
}

void check_segments(const Communicator::Segments& s, int world, const char* op) {
  KILN_CHECK(static_cast<int>(s.size()) == world, "[dist] {}: {} segments for a world of {}", op,
             s.size(), world);
  const Tensor* first = nullptr;
  for (const auto& pieces : s)
    for (const Tensor& t : pieces) {
      check_buffer(t, -1, op, "a piece");
      if (!first) first = &t;
      KILN_CHECK(t.dtype() == first->dtype() && t.device() == first->device(),
                 "[dist] {}: pieces of {} on {} and {} on {}", op, dtype_name(first->dtype()),
                 first->device().str(), dtype_name(t.dtype()), t.device().str());
    }
  KILN_CHECK(first != nullptr, "[dist] {}: no pieces", op);
}

Packed pack(const Communicator::Segments& s, bool copy) {
  Packed p;
  const Tensor* first = nullptr;
  for (const auto& pieces : s) {
    p.counts.push_back(segment_numel(pieces));
    if (!first && !pieces.empty()) first = &pieces.front();
  }
  std::int64_t total = 0;
  for (std::int64_t c : p.counts) total += c;
  MemoryScope scope(MemCategory::Temporaries);
  p.buf = Tensor::empty({total}, first->dtype(), first->device());
  if (copy) {
    std::int64_t off = 0;
    for (const auto& pieces : s)
      for (const Tensor& t : pieces) {
        p.buf.narrow(0, off, t.numel()).copy_(t.view({t.numel()}));
        off += t.numel();
      }
  }
  return p;
}

void unpack(const Tensor& buf, const Communicator::Segments& s) {
  std::int64_t off = 0;
  for (const auto& pieces : s)
    for (const Tensor& t : pieces) {
      Tensor dst = t;
      dst.view({t.numel()}).copy_(buf.narrow(0, off, t.numel()));
      off += t.numel();
    }
}

// The base class's all_reduce on pieces: the packed buffer is reduce-scattered over the pieces'
// own segments, then all-gathered and unpacked when done. (A plain all_reduce of the packed
// buffer would cut it into other segments; with more than two ranks the segment decides the
// order of the sum, and the backends must agree with each other.)
class GatherWhenDone final : public PendingOp {
 public:
  GatherWhenDone(Communicator& c, Packed p, Communicator::Segments s, ReduceOp op)
      : c_(c), p_(std::move(p)), s_(std::move(s)) {
    MemoryScope scope(MemCategory::Temporaries);
    mine_ = Tensor::empty({p_.counts[static_cast<std::size_t>(c.rank())]}, p_.buf.dtype(),
                          p_.buf.device());
    op_ = c.start_reduce_scatter(p_.buf, mine_, p_.counts, op);
  }
  bool test() override {
    if (!done_ && op_->test()) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    op_->wait();
    finish();
  }

 private:
  void finish() {
    done_ = true;
    c_.all_gather(mine_, p_.buf, p_.counts);
    unpack(p_.buf, s_);
    p_.buf = mine_ = Tensor();
  }
  Communicator& c_;
  Packed p_;
  Communicator::Segments s_;
  Tensor mine_;
  std::unique_ptr<PendingOp> op_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<PendingOp> Communicator::start_all_reduce(const Segments& s, ReduceOp op) {
  check_segments(s, size(), "all_reduce");
  return std::make_unique<GatherWhenDone>(*this, pack(s, true), s, op);
}

std::unique_ptr<PendingOp> Communicator::start_reduce_scatter(const Segments& in, Tensor& out,
                                                              ReduceOp op) {
  check_segments(in, size(), "reduce_scatter");
  Packed p = pack(in, true);
  // The packed input must outlive the collective: the returned op holds it.
  struct KeepInput final : PendingOp {
    std::unique_ptr<PendingOp> op;
    Tensor in;
    bool test() override { return op->test(); }
    void wait() override { op->wait(); }
  };
  auto keep = std::make_unique<KeepInput>();
  keep->op = start_reduce_scatter(p.buf, out, p.counts, op);
  keep->in = p.buf;
  return keep;
}

void Communicator::all_gather(const Segments& s) {
  check_segments(s, size(), "all_gather");
  Packed p = pack(s, false);
  const auto me = static_cast<std::size_t>(rank());
  Tensor mine;
  {
    MemoryScope scope(MemCategory::Temporaries);
    mine = Tensor::empty({p.counts[me]}, p.buf.dtype(), p.buf.device());
  }
  std::int64_t off = 0;
  for (const Tensor& t : s[me]) {
    mine.narrow(0, off, t.numel()).copy_(t.view({t.numel()}));
    off += t.numel();
  }
  all_gather(mine, p.buf, p.counts);
  unpack(p.buf, s);
}

void check_buffer(const Tensor& t, std::int64_t numel, const char* op, const char* what) {
  KILN_CHECK(t.defined(), "[dist] {}: {} is undefined", op, what);
  KILN_CHECK(t.is_contiguous(), "[dist] {}: {} must be contiguous", op, what);
  KILN_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F64,
             "[dist] {}: {} is {}; expected f32, bf16 or f64", op, what, dtype_name(t.dtype()));
  KILN_CHECK(numel < 0 || t.numel() == numel, "[dist] {}: {} has {} elements, expected {}", op,
             what, t.numel(), numel);
}

std::int64_t sum_counts(std::span<const std::int64_t> counts, int world, const char* op) {
  KILN_CHECK(static_cast<int>(counts.size()) == world, "[dist] {}: {} counts for a world of {}", op,
             counts.size(), world);
  std::int64_t total = 0;
  for (std::int64_t c : counts) {
    KILN_CHECK(c >= 0 && c <= INT_MAX, "[dist] {}: count {} is outside [0, {}]", op, c, INT_MAX);
    total += c;
  }
  return total;
}

std::vector<std::int64_t> shard_counts(std::int64_t numel, int world) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(world));
  for (int q = 0; q < world; ++q)
    c[static_cast<std::size_t>(q)] = shard_range(numel, q, world).size();
  return c;
}

double wait_timeout_s() {
  const char* s = std::getenv("KILN_DIST_TIMEOUT_S");
  if (s == nullptr || *s == '\0') return 600;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  KILN_CHECK(end != s && *end == '\0' && v > 0 && v <= 1e7,
             "[dist] KILN_DIST_TIMEOUT_S='{}' must be a number of seconds in (0, 1e7]", s);
  return v;
}

double Communicator::all_reduce_scalar(double v, ReduceOp op) {
  if (size() == 1) return v;
  Tensor t = Tensor::empty({1}, DType::F64);
  *t.data<double>() = v;
  all_reduce(t, op);
  return *t.data<double>();
}

double Communicator::max_scalar(double v) {
  if (size() == 1) return v;
  Tensor in = Tensor::empty({1}, DType::F64), all = Tensor::empty({size()}, DType::F64);
  *in.data<double>() = v;
  std::vector<std::int64_t> ones(static_cast<std::size_t>(size()), 1);
  all_gather(in, all, ones);
  double m = v;
  for (double x : all.to_double_vector()) m = std::max(m, x);
  return m;
}

std::unique_ptr<PendingOp> LocalCommunicator::start_all_reduce(Tensor& t, ReduceOp) {
  check_buffer(t, -1, "all_reduce", "the tensor");
  return std::make_unique<DonePending>();
}

std::unique_ptr<PendingOp> LocalCommunicator::start_reduce_scatter(
    const Tensor& in, Tensor& out, std::span<const std::int64_t> counts, ReduceOp) {
  const std::int64_t total = sum_counts(counts, 1, "reduce_scatter");
  check_buffer(in, total, "reduce_scatter", "the input");
  check_buffer(out, total, "reduce_scatter", "the output");
  out.copy_(in);
  return std::make_unique<DonePending>();
}

void LocalCommunicator::all_gather(const Tensor& in, Tensor& out,
                                   std::span<const std::int64_t> counts) {
  const std::int64_t total = sum_counts(counts, 1, "all_gather");
  check_buffer(in, total, "all_gather", "the input");
  check_buffer(out, total, "all_gather", "the output");
  out.copy_(in);
}

void LocalCommunicator::broadcast(Tensor&, int root) {
  KILN_CHECK(root == 0, "[dist] broadcast: root {} in a world of one", root);
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

namespace {
std::once_flag g_world_once;
std::unique_ptr<Communicator> g_world;
}  // namespace

Communicator& world() {
  std::call_once(g_world_once, [] {
    if (launched_by_mpi())
      g_world = std::make_unique<MpiCommunicator>();
    else
      g_world = std::make_unique<LocalCommunicator>();
  });
  return *g_world;
}

int finalize_world(int rc) {
  if (!g_world || g_world->backend() != "mpi") return rc;
  return static_cast<MpiCommunicator&>(*g_world).finalize(rc);
}

}  // namespace kiln::dist
