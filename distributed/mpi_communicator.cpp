#include "distributed/mpi_communicator.h"

#include <fmt/format.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "distributed/mpi_ring.h"
#include "tensor/ops.h"

namespace kiln::dist {

namespace {

using Clock = std::chrono::steady_clock;

bool process_gone(int pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  // A killed child stays a zombie until its launcher reaps it.
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

void check_cpu(const Tensor& t, const char* op) {
  KILN_CHECK(t.device().is_cpu(),
             "[dist] {}: MpiCommunicator carries CPU tensors, got one on {} (CUDA tensors go "
             "through NcclCommunicator)",
             op, t.device().str());
}

}  // namespace

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(text, static_cast<std::size_t>(len));
}

MpiCommunicator::MpiCommunicator() : timeout_s_(wait_timeout_s()) {
  int initialized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS) fail("[mpi] MPI_Initialized failed");
  if (!initialized) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) fail("[mpi] MPI_Init_thread: {}", mpi_error_string(rc));
    own_init_ = true;
    KILN_CHECK(provided >= MPI_THREAD_FUNNELED,
               "[mpi] MPI_Init_thread gave thread level {}; kiln needs MPI_THREAD_FUNNELED",
               provided);
  }
  KILN_MPI(*this, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  KILN_MPI(*this, MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  KILN_MPI(*this, MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  KILN_MPI(*this, MPI_Comm_rank(comm_, &rank_));
  KILN_MPI(*this, MPI_Comm_size(comm_, &size_));
  MPI_Comm local = MPI_COMM_NULL;
  KILN_MPI(*this, MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  KILN_MPI(*this, MPI_Comm_rank(local, &local_rank_));
  KILN_MPI(*this, MPI_Comm_size(local, &local_size_));
  KILN_MPI(*this, MPI_Comm_free(&local));

  // Every rank's pid and host, so that a wait can tell which same-host peer is gone.
  struct Id {
    int pid;
    char host[64];
  } me{}, *all = nullptr;
  std::vector<Id> ids(static_cast<std::size_t>(size_));
  all = ids.data();
  me.pid = static_cast<int>(::getpid());
  if (::gethostname(me.host, sizeof(me.host) - 1) != 0)
    std::snprintf(me.host, sizeof(me.host), "unknown");
  KILN_MPI(*this, MPI_Allgather(&me, sizeof(Id), MPI_BYTE, all, sizeof(Id), MPI_BYTE, comm_));
  for (const Id& id : ids) peers_.push_back({id.pid, std::string(id.host, strnlen(id.host, 64))});

  KILN_MPI(*this, MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_));
  KILN_MPI(*this, MPI_Type_commit(&bf16_type_));
}

MpiCommunicator::~MpiCommunicator() = default;  // MPI objects end with finalize()

MPI_Datatype MpiCommunicator::mpi_type(DType t) const {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
      return bf16_type_;
    default:
      fail("[dist] no MPI type for {}", dtype_name(t));
  }
}

std::vector<int> MpiCommunicator::lost_local_peers() const {
  std::vector<int> lost;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || peers_[static_cast<std::size_t>(q)].host != host()) continue;
    if (process_gone(peers_[static_cast<std::size_t>(q)].pid)) lost.push_back(q);
  }
  return lost;
}

void MpiCommunicator::fail_lost(const std::vector<int>& lost, const char* op) {
  failed_ = true;
  std::string who;
  for (int q : lost)
    who += fmt::format("{}rank {} (pid {} on {})", who.empty() ? "" : ", ", q,
                       peers_[static_cast<std::size_t>(q)].pid,
                       peers_[static_cast<std::size_t>(q)].host);
  fail(
      "[dist] lost {} of a world of {}: it exited during {} on rank {}; stopping this rank "
      "(the last completed checkpoint is intact)",
      who, size_, op, rank_);
}

void MpiCommunicator::fail_mpi(int rc, const char* call) {
  failed_ = true;
  const std::vector<int> lost = peers_.empty() ? std::vector<int>{} : lost_local_peers();
  if (!lost.empty()) fail_lost(lost, call);
  fail("[mpi] rank {}: {} failed: {}", rank_, call, mpi_error_string(rc));
}

bool MpiCommunicator::test(MPI_Request& req, const char* op) {
  int flag = 0;
  MPI_Status status;
  const int rc = MPI_Test(&req, &flag, &status);
  if (rc != MPI_SUCCESS) fail_mpi(rc, op);
  return flag != 0;
}

void MpiCommunicator::wait(MPI_Request& req, const char* op) {
  wait_until([&] { return test(req, op); }, op);
}

void MpiCommunicator::wait_until(const std::function<bool()>& done, const char* op) {
  const auto start = Clock::now();
  auto next_probe = start + std::chrono::seconds(1);
  for (std::uint64_t spin = 0;; ++spin) {
    if (done()) return;
    if (spin % 64 != 63) {
      sched_yield();  // the other ranks may share this core
      continue;
    }
    const auto now = Clock::now();
    if (now >= next_probe) {
      next_probe = now + std::chrono::seconds(1);
      const std::vector<int> lost = lost_local_peers();
      if (!lost.empty()) fail_lost(lost, op);
    }
    if (std::chrono::duration<double>(now - start).count() > timeout_s_) {
      failed_ = true;
      // No peer on this host is gone: name who could be at fault.
      std::string local, remote;
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        const Peer& p = peers_[static_cast<std::size_t>(q)];
        std::string& list = p.host == host() ? local : remote;
        list += fmt::format("{}rank {} (pid {} on {})", list.empty() ? "" : ", ", q, p.pid, p.host);
      }
      fail(
          "[dist] rank {}: {} did not complete within {:.0f} s (KILN_DIST_TIMEOUT_S): a peer "
          "stalled or was lost. Alive on this host: {}; on other hosts (not probed): {}",
          rank_, op, timeout_s_, local.empty() ? "none" : local, remote.empty() ? "none" : remote);
    }
  }
}

std::unique_ptr<PendingOp> MpiCommunicator::start_all_reduce(Tensor& t, ReduceOp op) {
  check_buffer(t, -1, "all_reduce", "the tensor");
  check_cpu(t, "all_reduce");
  return start_ring(*this, RingKind::AllReduce, "all_reduce",
                    contiguous_segments(t, shard_counts(t.numel(), size_)), Tensor(),
                    op == ReduceOp::Avg);
}

std::unique_ptr<PendingOp> MpiCommunicator::start_all_reduce(const Segments& s, ReduceOp op) {
  return start_ring(*this, RingKind::AllReduce, "all_reduce", s, Tensor(), op == ReduceOp::Avg);
}

std::unique_ptr<PendingOp> MpiCommunicator::start_reduce_scatter(const Segments& in, Tensor& out,
                                                                 ReduceOp op) {
  return start_ring(*this, RingKind::ReduceScatter, "reduce_scatter", in, out, op == ReduceOp::Avg);
}

void MpiCommunicator::all_gather(const Segments& s) {
  start_ring(*this, RingKind::AllGather, "all_gather", s, Tensor(), false)->wait();
}

std::unique_ptr<PendingOp> MpiCommunicator::start_reduce_scatter(
    const Tensor& in, Tensor& out, std::span<const std::int64_t> counts, ReduceOp op) {
  const std::int64_t total = sum_counts(counts, size_, "reduce_scatter");
  check_buffer(in, total, "reduce_scatter", "the input");
  check_buffer(out, counts[static_cast<std::size_t>(rank_)], "reduce_scatter", "the output");
  check_cpu(in, "reduce_scatter");
  check_cpu(out, "reduce_scatter");
  KILN_CHECK(in.dtype() == out.dtype(), "[dist] reduce_scatter: input {} and output {} differ",
             dtype_name(in.dtype()), dtype_name(out.dtype()));
  return start_ring(*this, RingKind::ReduceScatter, "reduce_scatter",
                    contiguous_segments(in, counts), out, op == ReduceOp::Avg);
}

void MpiCommunicator::all_gather(const Tensor& in, Tensor& out,
                                 std::span<const std::int64_t> counts) {
  const std::int64_t total = sum_counts(counts, size_, "all_gather");
  const auto me = static_cast<std::size_t>(rank_);
  check_buffer(in, counts[me], "all_gather", "the input");
  check_buffer(out, total, "all_gather", "the output");
  check_cpu(in, "all_gather");
  check_cpu(out, "all_gather");
  KILN_CHECK(in.dtype() == out.dtype(), "[dist] all_gather: input {} and output {} differ",
             dtype_name(in.dtype()), dtype_name(out.dtype()));
  Segments segments = contiguous_segments(out, counts);
  segments[me].front().copy_(in);  // this rank's part, in place; the ring brings the others
  start_ring(*this, RingKind::AllGather, "all_gather", std::move(segments), Tensor(), false)
      ->wait();
}

void MpiCommunicator::broadcast(Tensor& t, int root) {
  check_buffer(t, -1, "broadcast", "the tensor");
  check_cpu(t, "broadcast");
  KILN_CHECK(root >= 0 && root < size_, "[dist] broadcast: root {} outside a world of {}", root,
             size_);
  KILN_CHECK(t.numel() <= INT_MAX, "[dist] broadcast: {} elements exceed MPI's int count",
             t.numel());
  MPI_Request req = MPI_REQUEST_NULL;
  KILN_MPI(*this, MPI_Ibcast(t.raw_data(), static_cast<int>(t.numel()), mpi_type(t.dtype()), root,
                             comm_, &req));
  wait(req, "broadcast");
}

void MpiCommunicator::barrier() {
  MPI_Request req = MPI_REQUEST_NULL;
  KILN_MPI(*this, MPI_Ibarrier(comm_, &req));
  wait(req, "barrier");
}

int MpiCommunicator::finalize(int rc) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (failed_) {
    // A peer is gone (or MPI failed): the other ranks find out by themselves. MPI_Finalize could
    // wait for the lost rank, so leave without it.
    std::_Exit(rc != 0 ? rc : 1);
  }
  if (rc != 0) {
    // This rank failed on its own (a bad file, a bad flag): its peers may be waiting for it in a
    // collective, so end the whole job now.
    MPI_Abort(MPI_COMM_WORLD, rc);
    std::_Exit(rc);
  }
  // After main's handlers: report a failure instead of throwing.
  auto check = [&](int code, const char* call) {
    if (code == MPI_SUCCESS) return true;
    std::fprintf(stderr, "error: [mpi] %s: %s\n", call, mpi_error_string(code).c_str());
    rc = 1;
    return false;
  };
  if (bf16_type_ != MPI_DATATYPE_NULL) check(MPI_Type_free(&bf16_type_), "MPI_Type_free");
  if (comm_ != MPI_COMM_NULL) check(MPI_Comm_free(&comm_), "MPI_Comm_free");
  if (own_init_) check(MPI_Finalize(), "MPI_Finalize");
  return rc;
}

}  // namespace kiln::dist
