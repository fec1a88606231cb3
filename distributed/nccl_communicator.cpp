// Compiled in CUDA builds only (the whole file is under KILN_CUDA).
#include "distributed/nccl_communicator.h"

#if defined(KILN_CUDA)

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "distributed/nccl_bootstrap.h"
#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"

namespace kiln::dist {

namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "ncclUniqueId size changed");

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    default:
      fail("[nccl] no NCCL type for {}", dtype_name(t));
  }
}

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }

void check_cuda_tensor(const Tensor& t, int device, const char* op) {
  KILN_CHECK(t.device().is_cuda() && t.device().index == device,
             "[nccl] {}: NcclCommunicator carries tensors on cuda:{}, got one on {}", op, device,
             t.device().str());
}

class NcclPending final : public PendingOp {
 public:
  NcclPending(NcclCommunicator& c, const char* op, Tensor keep, Tensor result)
      : c_(c), op_(op), keep_(std::move(keep)), result_(std::move(result)) {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(e, nullptr));
    event_ = e;
  }
  ~NcclPending() override {
    if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));  // best effort in a dtor
  }
  bool test() override {
    if (done_) return true;
    const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event_));
    if (rc == cudaErrorNotReady) return false;
    KILN_CUDA_CHECK(rc);
    done_ = true;
    return true;
  }
  void wait() override {
    if (!done_) c_.wait_event(event_, op_);
    done_ = true;
  }

 private:
  NcclCommunicator& c_;
  const char* op_;
  Tensor keep_, result_;
  void* event_ = nullptr;
  bool done_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MpiCommunicator& mpi) : mpi_(mpi), timeout_s_(wait_timeout_s()) {
  device_ =
      device_for_local_rank(mpi.local_rank(), mpi.local_size(), cuda::device_count(), mpi.host());
  cuda::set_device(device_);
  UniqueIdBytes id{};
  if (mpi.rank() == 0) {
    ncclUniqueId nid;
    KILN_NCCL_CHECK(ncclGetUniqueId(&nid));
    std::memcpy(id.data(), &nid, sizeof(nid));
  }
  id = broadcast_unique_id(mpi, id);
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  ncclComm_t comm = nullptr;
  KILN_NCCL_CHECK(ncclCommInitRank(&comm, mpi.size(), nid, mpi.rank()));
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) ncclCommDestroy(as_comm(comm_));  // a dtor cannot throw; the job is ending
}

void NcclCommunicator::wait_event(void* event, const char* op) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) KILN_CUDA_CHECK(rc);
    ncclResult_t async = ncclSuccess;
    KILN_NCCL_CHECK(ncclCommGetAsyncError(as_comm(comm_), &async));
    if (async != ncclSuccess) {
      ncclCommAbort(as_comm(comm_));
      comm_ = nullptr;
      fail("[nccl] rank {}: {} failed: {} (a peer was lost or NCCL failed)", rank(), op,
           ncclGetErrorString(async));
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        timeout_s_) {
      ncclCommAbort(as_comm(comm_));
      comm_ = nullptr;
      fail(
          "[nccl] rank {}: {} did not complete within {:.0f} s (KILN_DIST_TIMEOUT_S): a peer "
          "was lost or stalled",
          rank(), op, timeout_s_);
    }
    std::this_thread::yield();
  }
}

std::unique_ptr<PendingOp> NcclCommunicator::start_all_reduce(Tensor& t, ReduceOp op) {
  check_buffer(t, -1, "all_reduce", "the tensor");
  check_cuda_tensor(t, device_, "all_reduce");
  KILN_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                                nccl_type(t.dtype()), op == ReduceOp::Avg ? ncclAvg : ncclSum,
                                as_comm(comm_), nullptr));
  return std::make_unique<NcclPending>(*this, "all_reduce", Tensor(), t);
}

std::unique_ptr<PendingOp> NcclCommunicator::start_reduce_scatter(
    const Tensor& in, Tensor& out, std::span<const std::int64_t> counts, ReduceOp op) {
  const std::int64_t total = sum_counts(counts, size(), "reduce_scatter");
  check_buffer(in, total, "reduce_scatter", "the input");
  check_buffer(out, counts[static_cast<std::size_t>(rank())], "reduce_scatter", "the output");
  check_cuda_tensor(in, device_, "reduce_scatter");
  check_cuda_tensor(out, device_, "reduce_scatter");
  // NCCL's reduce-scatter takes equal parts: uneven ZeRO shards are reduced one rank's part at a
  // time (ncclReduce to that rank), grouped into one launch.
  const std::size_t esz = dtype_size(in.dtype());
  KILN_NCCL_CHECK(ncclGroupStart());
  std::int64_t off = 0;
  for (int q = 0; q < size(); ++q) {
    const std::int64_t n = counts[static_cast<std::size_t>(q)];
    void* recv = q == rank() ? out.raw_data() : nullptr;
    if (n > 0)
      KILN_NCCL_CHECK(ncclReduce(static_cast<const char*>(in.raw_data()) + off * esz, recv,
                                 static_cast<size_t>(n), nccl_type(in.dtype()),
                                 op == ReduceOp::Avg ? ncclAvg : ncclSum, q, as_comm(comm_),
                                 nullptr));
    off += n;
  }
  KILN_NCCL_CHECK(ncclGroupEnd());
  return std::make_unique<NcclPending>(*this, "reduce_scatter", in, out);
}

void NcclCommunicator::all_gather(const Tensor& in, Tensor& out,
                                  std::span<const std::int64_t> counts) {
  const std::int64_t total = sum_counts(counts, size(), "all_gather");
  check_buffer(in, counts[static_cast<std::size_t>(rank())], "all_gather", "the input");
  check_buffer(out, total, "all_gather", "the output");
  check_cuda_tensor(in, device_, "all_gather");
  check_cuda_tensor(out, device_, "all_gather");
  // Uneven parts: one broadcast per rank, grouped.
  const std::size_t esz = dtype_size(in.dtype());
  KILN_NCCL_CHECK(ncclGroupStart());
  std::int64_t off = 0;
  for (int q = 0; q < size(); ++q) {
    const std::int64_t n = counts[static_cast<std::size_t>(q)];
    if (n > 0)
      KILN_NCCL_CHECK(ncclBroadcast(
          q == rank() ? in.raw_data() : nullptr, static_cast<char*>(out.raw_data()) + off * esz,
          static_cast<size_t>(n), nccl_type(in.dtype()), q, as_comm(comm_), nullptr));
    off += n;
  }
  KILN_NCCL_CHECK(ncclGroupEnd());
  NcclPending(*this, "all_gather", in, out).wait();
}

void NcclCommunicator::broadcast(Tensor& t, int root) {
  check_buffer(t, -1, "broadcast", "the tensor");
  check_cuda_tensor(t, device_, "broadcast");
  KILN_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                                nccl_type(t.dtype()), root, as_comm(comm_), nullptr));
  NcclPending(*this, "broadcast", Tensor(), t).wait();
}

void NcclCommunicator::barrier() {
  cuda::device_synchronize();
  mpi_.barrier();
}

}  // namespace kiln::dist

#endif  // KILN_CUDA
