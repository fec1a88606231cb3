#include "distributed/mpi_ring.h"

#include <climits>
#include <utility>

#include "distributed/mpi_communicator.h"
#include "kernels/cpu/elementwise.h"
#include "tensor/ops.h"

namespace kiln::dist {
namespace {

// dst[i] = src[i] + dst[i] (each pair added in the compute type, rounded once).
template <typename T>
void add_into(std::int64_t n, const Tensor& src, Tensor& dst) {
  const std::int64_t unit = 1;
  auto* d = static_cast<T*>(dst.raw_data());
  cpu::binary(cpu::BinaryOp::Add, 1, &n, static_cast<const T*>(src.raw_data()), &unit, d, &unit, d);
}

void add_into(const Tensor& src, Tensor& dst) {
  const std::int64_t n = dst.numel();
  if (n == 0) return;
  switch (dst.dtype()) {
    case DType::F32:
      return add_into<float>(n, src, dst);
    case DType::F64:
      return add_into<double>(n, src, dst);
    case DType::BF16:
      return add_into<bf16>(n, src, dst);
    default:
      fail("[dist] ring: no sum for {}", dtype_name(dst.dtype()));
  }
}

Tensor flat(const Tensor& t) { return t.view({t.numel()}); }

class RingOp final : public PendingOp {
 public:
  RingOp(MpiCommunicator& c, RingKind kind, const char* op, Communicator::Segments segs, Tensor out,
         bool avg)
      : c_(c),
        kind_(kind),
        op_(op),
        segs_(std::move(segs)),
        out_(std::move(out)),
        avg_(avg),
        rank_(c.rank()),
        world_(c.size()),
        tag_(c.next_tag()) {
    KILN_CHECK(static_cast<int>(segs_.size()) == world_, "[dist] {}: {} segments for a world of {}",
               op, segs_.size(), world_);
    std::int64_t largest = 0;
    for (auto& pieces : segs_) {
      std::int64_t n = 0;
      for (Tensor& t : pieces) {
        check_buffer(t, -1, op, "a piece");
        KILN_CHECK(t.device().is_cpu(), "[dist] {}: a piece is on {}; MPI carries CPU tensors", op,
                   t.device().str());
        KILN_CHECK(t.numel() <= INT_MAX,
                   "[dist] {}: a piece of {} elements exceeds MPI's int count", op, t.numel());
        t = flat(t);
        n += t.numel();
      }
      largest = std::max(largest, n);
    }
    if (kind_ == RingKind::ReduceScatter) check_buffer(out_, count(rank_), op, "the output");
    // Reduce steps receive into scratch, except the last step of a reduce-scatter, which receives
    // straight into `out`.
    const bool needs_scratch =
        kind_ == RingKind::AllReduce || (kind_ == RingKind::ReduceScatter && world_ > 2);
    if (world_ > 1 && needs_scratch) {
      MemoryScope scope(MemCategory::Temporaries);
      scratch_ = Tensor::empty({largest}, dtype_of_pieces());
    }
    phase_ = kind_ == RingKind::AllGather ? Phase::Gather : Phase::Reduce;
    if (world_ == 1)
      finish_reduce();  // nothing to exchange
    else
      post();
  }
  ~RingOp() override {
    // Abandoned in flight (an exception unwound past it; the job is ending): MPI may still write
    // the buffers, so they must outlive this object.
    if (phase_ != Phase::Done) {
      static std::vector<Communicator::Segments> abandoned;
      abandoned.push_back(segs_);
      abandoned.push_back({{out_, scratch_}});
    }
  }
  bool test() override {
    while (phase_ != Phase::Done) {
      for (MPI_Request& r : reqs_)
        if (!c_.test(r, op_)) return false;
      complete_step();
    }
    return true;
  }
  void wait() override {
    c_.wait_until([this] { return test(); }, op_);
  }

 private:
  enum class Phase { Reduce, Gather, Done };

  DType dtype_of_pieces() const {
    for (const auto& pieces : segs_)
      if (!pieces.empty()) return pieces.front().dtype();
    return out_.dtype();
  }
  int mod(int q) const { return ((q % world_) + world_) % world_; }
  std::int64_t count(int q) const {
    std::int64_t n = 0;
    for (const Tensor& t : segs_[static_cast<std::size_t>(q)]) n += t.numel();
    return n;
  }
  const std::vector<Tensor>& pieces(int q) const { return segs_[static_cast<std::size_t>(q)]; }
  bool last_step() const { return step_ == world_ - 2; }

  // Posts the receives and sends of step_ of the current phase: one message per piece.
  void post() {
    const int left = mod(rank_ - 1), right = mod(rank_ + 1);
    int send_q, recv_q;
    Tensor recv_to;  // contiguous destination of the received segment, or none (into pieces)
    if (phase_ == Phase::Reduce) {
      send_q = mod(rank_ - step_ - 1);
      recv_q = mod(rank_ - step_ - 2);
      recv_to = kind_ == RingKind::ReduceScatter && last_step() ? out_ : scratch_;
    } else {
      send_q = mod(rank_ - step_);
      recv_q = mod(rank_ - step_ - 1);
    }
    recv_q_ = recv_q;
    reqs_.clear();
    std::int64_t off = 0;
    for (const Tensor& t : pieces(recv_q)) {
      if (t.numel() == 0) continue;
      void* to = recv_to.defined() ? recv_to.narrow(0, off, t.numel()).raw_data() : t.raw_data();
      off += t.numel();
      reqs_.push_back(MPI_REQUEST_NULL);
      KILN_MPI(c_, MPI_Irecv(to, static_cast<int>(t.numel()), c_.mpi_type(t.dtype()), left, tag_,
                             c_.comm(), &reqs_.back()));
    }
    for (const Tensor& t : pieces(send_q)) {
      if (t.numel() == 0) continue;
      reqs_.push_back(MPI_REQUEST_NULL);
      KILN_MPI(c_, MPI_Isend(t.raw_data(), static_cast<int>(t.numel()), c_.mpi_type(t.dtype()),
                             right, tag_, c_.comm(), &reqs_.back()));
    }
  }

  void complete_step() {
    if (phase_ == Phase::Reduce) {
      // The received partial sums of segment recv_q_ meet this rank's values of it.
      const bool into_out = kind_ == RingKind::ReduceScatter && last_step();
      std::int64_t off = 0;
      for (const Tensor& t : pieces(recv_q_)) {
        Tensor mine = t;
        if (into_out) {
          Tensor o = out_.narrow(0, off, t.numel());
          add_into(mine, o);  // out = received + this rank's own values
        } else {
          add_into(scratch_.narrow(0, off, t.numel()), mine);
        }
        off += t.numel();
      }
    }
    if (!last_step()) {
      step_++;
      post();
      return;
    }
    step_ = 0;
    if (phase_ == Phase::Reduce)
      finish_reduce();
    else
      phase_ = Phase::Done;
  }

  // Segment `rank` is reduced: scale it for Avg, then gather (all-reduce) or stop.
  void finish_reduce() {
    if (kind_ == RingKind::AllGather) {
      phase_ = Phase::Done;
      return;
    }
    if (kind_ == RingKind::ReduceScatter && world_ == 1) {
      std::int64_t off = 0;
      for (const Tensor& t : pieces(0)) {
        out_.narrow(0, off, t.numel()).copy_(t);
        off += t.numel();
      }
    }
    if (avg_ && world_ > 1) {
      if (kind_ == RingKind::ReduceScatter) {
        ops::scale_(out_, 1.0 / world_);
      } else {
        for (const Tensor& t : pieces(rank_)) {
          Tensor owned = t;
          ops::scale_(owned, 1.0 / world_);
        }
      }
    }
    if (kind_ == RingKind::AllReduce && world_ > 1) {
      phase_ = Phase::Gather;
      post();
    } else {
      phase_ = Phase::Done;
    }
  }

  MpiCommunicator& c_;
  RingKind kind_;
  const char* op_;
  Communicator::Segments segs_;
  Tensor out_, scratch_;
  bool avg_;
  int rank_, world_, tag_;
  Phase phase_ = Phase::Reduce;
  int step_ = 0, recv_q_ = 0;
  std::vector<MPI_Request> reqs_;
};

}  // namespace

std::unique_ptr<PendingOp> start_ring(MpiCommunicator& c, RingKind kind, const char* op,
                                      Communicator::Segments segments, const Tensor& out,
                                      bool avg) {
  KILN_CHECK(!(kind == RingKind::AllGather && avg), "[dist] {}: all_gather has no mean", op);
  return std::make_unique<RingOp>(c, kind, op, std::move(segments), out, avg);
}

Communicator::Segments contiguous_segments(const Tensor& buf,
                                           std::span<const std::int64_t> counts) {
  Communicator::Segments s(counts.size());
  std::int64_t off = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    s[q].push_back(buf.narrow(0, off, counts[q]));
    off += counts[q];
  }
  return s;
}

}  // namespace kiln::dist
