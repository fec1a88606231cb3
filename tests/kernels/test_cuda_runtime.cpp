// Tests of the CUDA runtime wiring (kernels/cuda/runtime.h): error translation for every library,
// device queries, raw memory round trips, streams, the library handles and an nvcc-built kernel.
// Without a GPU the device tests skip and say so; the error-translation tests still run.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

#if defined(KILN_CUDA)

// Message of the kiln::Error thrown by fn, or "" (and a test failure) when none is thrown.
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected kiln::Error";
  return "";
}

// ---- error translation: no device needed ------------------------------------------------------

TEST(CudaErrors, CudaCheckNamesFileLineCallAndMessage) {
  constexpr int kCudaErrorMemoryAllocation = 2;  // cudaErrorMemoryAllocation
  const int line = __LINE__ + 1;
  const std::string msg = error_message([] { KILN_CUDA_CHECK(kCudaErrorMemoryAllocation); });
  EXPECT_EQ(msg.rfind("[cuda] test_cuda_runtime.cpp:" + std::to_string(line) + " ", 0), 0u) << msg;
  EXPECT_NE(msg.find("kCudaErrorMemoryAllocation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
}

TEST(CudaErrors, SuccessDoesNotThrowAndArgumentIsEvaluatedOnce) {
  int calls = 0;
  auto ok = [&] { return ++calls, 0; };
  EXPECT_NO_THROW(KILN_CUDA_CHECK(ok()));
  EXPECT_NO_THROW(KILN_CUBLAS_CHECK(ok()));
  EXPECT_NO_THROW(KILN_CUDNN_CHECK(ok()));
  EXPECT_NO_THROW(KILN_NCCL_CHECK(ok()));
  EXPECT_EQ(calls, 4);
}

TEST(CudaErrors, CublasCudnnNcclChecksNameTheirLibrary) {
  constexpr int kCublasStatusAllocFailed = 3;  // CUBLAS_STATUS_ALLOC_FAILED
  constexpr int kCudnnStatusBadParam = 2000;   // CUDNN_STATUS_BAD_PARAM (cuDNN 9)
  constexpr int kNcclInvalidArgument = 4;      // ncclInvalidArgument
  const std::string cublas = error_message([] { KILN_CUBLAS_CHECK(kCublasStatusAllocFailed); });
  EXPECT_EQ(cublas.rfind("[cublas] test_cuda_runtime.cpp:", 0), 0u) << cublas;
  EXPECT_NE(cublas.find("CUBLAS_STATUS_ALLOC_FAILED"), std::string::npos) << cublas;

  const std::string cudnn = error_message([] { KILN_CUDNN_CHECK(kCudnnStatusBadParam); });
  EXPECT_EQ(cudnn.rfind("[cudnn] test_cuda_runtime.cpp:", 0), 0u) << cudnn;
  EXPECT_NE(cudnn.find("BAD_PARAM"), std::string::npos) << cudnn;

  const std::string nccl = error_message([] { KILN_NCCL_CHECK(kNcclInvalidArgument); });
  EXPECT_EQ(nccl.rfind("[nccl] test_cuda_runtime.cpp:", 0), 0u) << nccl;
  EXPECT_NE(nccl.find("kNcclInvalidArgument"), std::string::npos) << nccl;
}

TEST(CudaDevices, RuntimeBytesNeverThrowAndStartEmptyWithoutADevice) {
  RuntimeBytes r;
  EXPECT_NO_THROW(r = runtime_bytes());
  if (device_count() == 0) {
    EXPECT_FALSE(r.context_created);
    EXPECT_EQ(r.total(), 0u);
  }
}

TEST(CudaDevices, DeviceCountNeverThrows) {
  int n = -1;
  EXPECT_NO_THROW(n = device_count());
  EXPECT_GE(n, 0);
  EXPECT_TRUE(compiled_with_cuda());
}

// ---- device tests ------------------------------------------------------------------------------

class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) {
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount found none (driver version "
                   << driver_version() << ")";
    }
    set_device(0);
  }
};

TEST_F(CudaDevice, InfoAndMemInfoAreSane) {
  const DeviceInfo info = device_info(0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.sm_major, 9) << "kiln builds sm_90 code; " << info.name << " is sm_"
                              << info.sm_major << info.sm_minor;
  EXPECT_GT(info.multiprocessors, 0);
  EXPECT_GT(info.total_memory, size_t{1} << 30);
  EXPECT_EQ(info.bf16_peak_tflops, 0.0);  // unknown until measured

  const MemInfo m = mem_get_info();
  EXPECT_GT(m.total_bytes, 0u);
  EXPECT_LE(m.free_bytes, m.total_bytes);
  // The driver's total and the device property describe the same memory (MIG aside).
  EXPECT_LE(m.total_bytes, info.total_memory);
  EXPECT_GE(m.total_bytes, info.total_memory / 2);

  EXPECT_THROW(device_info(device_count()), kiln::Error);
  EXPECT_GT(runtime_version(), 0);
  EXPECT_GE(driver_version(), runtime_version() / 1000 * 1000);  // driver supports this major
}

TEST_F(CudaDevice, MallocMemcpyRoundTrip) {
  // Odd size, so no copy path can rely on alignment of the length.
  const size_t n = (size_t{1} << 20) + 13;
  std::vector<uint8_t> host(n);
  std::mt19937 gen(1234);
  for (auto& b : host) b = static_cast<uint8_t>(gen());

  Stream stream;
  void* a = device_malloc(n);
  void* b = device_malloc(n);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  memset_async(b, 0xAB, n, stream.get());
  memcpy_h2d(a, host.data(), n, stream.get());
  memcpy_d2d(b, a, n - 1, stream.get());  // leaves b's last byte as the memset value
  std::vector<uint8_t> back(n, 0);
  memcpy_d2h(back.data(), b, n, stream.get());
  EXPECT_EQ(std::memcmp(back.data(), host.data(), n - 1), 0);
  EXPECT_EQ(back[n - 1], 0xAB);

  // Zero-byte operations are no-ops and zero-byte allocations give nullptr.
  EXPECT_EQ(device_malloc(0), nullptr);
  EXPECT_NO_THROW(memcpy_h2d(a, host.data(), 0));
  EXPECT_NO_THROW(device_free(nullptr));
  device_free(a);
  device_free(b);
}

TEST_F(CudaDevice, FreeMemoryFallsByWhatWeAllocate) {
  const size_t bytes = size_t{256} << 20;
  device_synchronize();
  const MemInfo before = mem_get_info();
  void* p = device_malloc(bytes);
  const MemInfo during = mem_get_info();
  device_free(p);
  EXPECT_EQ(before.total_bytes, during.total_bytes);
  EXPECT_GE(before.free_bytes - during.free_bytes, bytes);
}

TEST_F(CudaDevice, OutOfMemoryIsAClearErrorAndNotSticky) {
  const size_t too_much = mem_get_info().total_bytes * 4;
  const std::string msg = error_message([&] { device_malloc(too_much); });
  // Its own type, so the caching allocator releases its cache for this error and no other.
  EXPECT_THROW(device_malloc(too_much), DeviceOutOfMemory);
  EXPECT_NE(msg.find("[cuda] device_malloc: out of memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(too_much)), std::string::npos) << msg;
  void* p = nullptr;
  EXPECT_NO_THROW(p = device_malloc(4096));  // the failed call left no sticky error behind
  device_free(p);
}

TEST_F(CudaDevice, NvccBuiltKernelRuns) {
  const size_t n = 1000003;            // several blocks plus a partial one
  const unsigned start = 4000000000u;  // wraps around 2^32 inside the range
  auto* d = static_cast<unsigned*>(device_malloc(n * sizeof(unsigned)));
  Stream stream;
  fill_iota_u32(d, n, start, stream.get());
  std::vector<unsigned> out(n);
  memcpy_d2h(out.data(), d, n * sizeof(unsigned), stream.get());
  device_free(d);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += out[i] != static_cast<unsigned>(start + i);
  EXPECT_EQ(bad, 0u);
}

TEST_F(CudaDevice, StreamsMove) {
  Stream a;
  StreamHandle h = a.get();
  EXPECT_NE(h, nullptr);
  Stream b(std::move(a));
  EXPECT_EQ(b.get(), h);
  EXPECT_EQ(a.get(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is defined
  Stream c;
  c = std::move(b);
  EXPECT_EQ(c.get(), h);
  EXPECT_NO_THROW(c.synchronize());
}

TEST_F(CudaDevice, LibraryHandlesAndVersions) {
  cublasLtContext* lt = cublaslt_handle();
  EXPECT_NE(lt, nullptr);
  EXPECT_EQ(cublaslt_handle(), lt);  // created once
  const Workspace ws = cublaslt_workspace();
  EXPECT_NE(ws.ptr, nullptr);
  EXPECT_EQ(ws.bytes, size_t{32} << 20);
  EXPECT_GE(runtime_reserved_bytes(), ws.bytes);
  EXPECT_EQ(runtime_reserved_bytes(), runtime_bytes().libraries());

  cudnnContext* dnn = cudnn_handle();
  EXPECT_NE(dnn, nullptr);
  EXPECT_EQ(cudnn_handle(), dnn);

  EXPECT_GE(cudnn_version(), 90000);  // cuDNN 9
  EXPECT_GE(nccl_version(), 20000);   // NCCL 2.x
  EXPECT_GT(cublaslt_version(), 0);
}

// The smoke stage's probe (scripts/gpu_check.sh runs it with --gtest_filter=CudaProbe.*): which
// driver, runtime and library versions and files were loaded. It prints, and checks only what
// kiln needs: cuDNN 9 and NCCL 2 (the versions the loaded libraries report, not the headers').
TEST(CudaProbe, VersionsAndLoadedLibraries) {
  const int devices = device_count();
  if (devices > 0) {
    set_device(0);
    (void)cublaslt_handle();  // loads cuBLASLt's and cuDNN's own sub-libraries
    (void)cudnn_handle();
  }
  std::printf("probe: devices %d driver %d runtime %d cublasLt %d cudnn %d nccl %d\n", devices,
              driver_version(), runtime_version(), cublaslt_version(), cudnn_version(),
              nccl_version());
  for (const std::string& lib :
       loaded_libraries({"libcuda", "libcudart", "libcublas", "libcudnn", "libnccl", "libnvrtc",
                         "libnvJitLink", "libopenblas", "libstdc++", "libgomp"}))
    std::printf("probe: loaded %s\n", lib.c_str());
  std::fflush(stdout);
  EXPECT_GE(cudnn_version(), 90000);
  EXPECT_LT(cudnn_version(), 100000);
  EXPECT_GE(nccl_version(), 20000);
  EXPECT_FALSE(loaded_libraries({"libcudnn"}).empty());
}

TEST_F(CudaDevice, RuntimeBytesAreMeasuredAndAddUp) {
  // SetUp made the context (set_device); its cost was measured then.
  (void)cublaslt_handle();
  (void)cudnn_handle();
  const RuntimeBytes r = runtime_bytes();
  EXPECT_TRUE(r.context_created);
  const MemInfo m = mem_get_info();
  const size_t used = m.total_bytes - m.free_bytes;
  // A CUDA context on a Hopper GPU costs at least a few MiB and far less than the card.
  EXPECT_GT(r.context, size_t{1} << 20) << "context " << r.context;
  EXPECT_LT(r.context, m.total_bytes / 4) << "context " << r.context;
  EXPECT_EQ(r.cublaslt_workspace, size_t{32} << 20);
  EXPECT_EQ(r.libraries(), r.cublaslt_handle + r.cublaslt_workspace + r.cudnn_handle);
  EXPECT_EQ(r.total(), r.context + r.libraries());
  // The driver's used memory holds at least what we measured, and what others held before.
  EXPECT_GE(used, r.total() + r.other_processes);
  if (!r.context_measured) EXPECT_EQ(r.other_processes, 0u);
  std::printf(
      "runtime bytes: context %zu (%s), cublasLt handle %zu + workspace %zu, cudnn %zu, "
      "other processes %zu; driver used %zu\n",
      r.context, r.context_measured ? "NVML before/after" : "all used after creation",
      r.cublaslt_handle, r.cublaslt_workspace, r.cudnn_handle, r.other_processes, used);
  // Reading the figures again changes nothing.
  const RuntimeBytes again = runtime_bytes();
  EXPECT_EQ(again.total(), r.total());
  EXPECT_THROW(set_device(device_count()), kiln::Error);
}

#else  // built without CUDA

TEST(CudaRuntime, CpuOnlyStubsSayNoCuda) {
  EXPECT_FALSE(compiled_with_cuda());
  EXPECT_EQ(device_count(), 0);
  try {
    (void)device_malloc(16);
    ADD_FAILURE() << "device_malloc must throw in a CPU-only build";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
}

TEST(CudaRuntime, CpuOnlyRuntimeBytesAreZero) {
  const RuntimeBytes r = runtime_bytes();
  EXPECT_FALSE(r.context_created);
  EXPECT_EQ(r.total(), 0u);
  EXPECT_EQ(runtime_reserved_bytes(), 0u);
}

TEST(CudaRuntime, Skipped) { GTEST_SKIP() << "built without CUDA (configure with -DKILN_CUDA=ON)"; }

#endif

}  // namespace
}  // namespace kiln::cuda
