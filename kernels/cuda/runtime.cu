// CUDA runtime wiring: error translation, device queries, raw memory, streams and the per-device
// library handles (cuBLASLt with its workspace, cuDNN). See runtime.h for the contract.
//
// Kernel here: fill_iota_u32, dst[i] = start + i (writes, `=`), a toolchain probe only.
#include "kernels/cuda/runtime.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <array>
#include <cstring>
#include <mutex>
#include <type_traits>

namespace kiln::cuda {

static_assert(std::is_same_v<StreamHandle, cudaStream_t>, "StreamHandle must be cudaStream_t");
static_assert(std::is_same_v<cublasLtContext*, cublasLtHandle_t>);
static_assert(std::is_same_v<cudnnContext*, cudnnHandle_t>);

namespace {

// "/work/main/kernels/cuda/runtime.cu" -> "runtime.cu": messages stay short and path-free.
const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

namespace detail {

void throw_cuda_error(int code, const char* call, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(code);
  fail("[cuda] {}:{} {}: {}: {}", base_name(file), line, call, cudaGetErrorName(err),
       cudaGetErrorString(err));
}

void throw_cublas_error(int code, const char* call, const char* file, int line) {
  const auto st = static_cast<cublasStatus_t>(code);
  fail("[cublas] {}:{} {}: {}: {}", base_name(file), line, call, cublasLtGetStatusName(st),
       cublasLtGetStatusString(st));
}

void throw_cudnn_error(int code, const char* call, const char* file, int line) {
  fail("[cudnn] {}:{} {}: {}", base_name(file), line, call,
       cudnnGetErrorString(static_cast<cudnnStatus_t>(code)));
}

void throw_nccl_error(int code, const char* call, const char* file, int line) {
  fail("[nccl] {}:{} {}: {}", base_name(file), line, call,
       ncclGetErrorString(static_cast<ncclResult_t>(code)));
}

}  // namespace detail

// ---- devices
// -------------------------------------------------------------------------------------

int device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // No driver, no device, or a driver too old for this runtime: all mean "no usable GPU".
    // Clear the error so that it does not surface in a later, unrelated check.
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

DeviceInfo device_info(int device) {
  const int n = device_count();
  KILN_CHECK(device >= 0 && device < n, "[cuda] device_info: device {} out of range [0, {})",
             device, n);
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  info.l2_cache_bytes = static_cast<size_t>(prop.l2CacheSize);
  info.bf16_peak_tflops = 0;  // unknown: measured by bench/, never guessed
  return info;
}

int current_device() {
  int d = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int device) { KILN_CUDA_CHECK(cudaSetDevice(device)); }

MemInfo mem_get_info() {
  MemInfo m;
  KILN_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

void device_synchronize() { KILN_CUDA_CHECK(cudaDeviceSynchronize()); }

int runtime_version() {
  int v = 0;
  KILN_CUDA_CHECK(cudaRuntimeGetVersion(&v));
  return v;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

// ---- raw memory
// ------------------------------------------------------------------------------------

void* device_malloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    fail("[cuda] device_malloc: out of memory allocating {} bytes ({} bytes free of {})", bytes,
         free_b, total_b);
  }
  KILN_CUDA_CHECK(err);
  return p;
}

void device_free(void* ptr) {
  if (ptr) KILN_CUDA_CHECK(cudaFree(ptr));
}

void memcpy_h2d(void* dst, const void* src, size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
}

void memcpy_d2h(void* dst, const void* src, size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  // The caller reads dst next; with pinned memory the copy would still be in flight.
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void memcpy_d2d(void* dst, const void* src, size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

void memset_async(void* dst, int byte_value, size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  KILN_CUDA_CHECK(cudaMemsetAsync(dst, byte_value, bytes, stream));
}

// ---- streams
// ---------------------------------------------------------------------------------------

Stream::Stream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  // Destructors must not throw; a failure here means the context is already gone.
  if (stream_) (void)cudaStreamDestroy(stream_);
}

Stream::Stream(Stream&& other) noexcept : stream_(other.stream_) { other.stream_ = nullptr; }

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_) (void)cudaStreamDestroy(stream_);
    stream_ = other.stream_;
    other.stream_ = nullptr;
  }
  return *this;
}

void Stream::synchronize() const { stream_synchronize(stream_); }

void stream_synchronize(StreamHandle stream) { KILN_CUDA_CHECK(cudaStreamSynchronize(stream)); }

// ---- library handles
// -------------------------------------------------------------------------------

namespace {

constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;
constexpr int kMaxDevices = 64;

struct DeviceHandles {
  cublasLtHandle_t cublaslt = nullptr;
  Workspace workspace;
  cudnnHandle_t cudnn = nullptr;
};

// Handles are created once per device and deliberately never destroyed: destroying them from a
// static destructor races with the CUDA runtime's own teardown at exit.
std::mutex g_handles_mutex;
std::array<DeviceHandles, kMaxDevices> g_handles;

DeviceHandles& handles_for_current_device() {
  const int d = current_device();
  KILN_CHECK(d >= 0 && d < kMaxDevices, "[cuda] device index {} exceeds {}", d, kMaxDevices);
  return g_handles[static_cast<size_t>(d)];
}

}  // namespace

cublasLtContext* cublaslt_handle() {
  std::lock_guard lock(g_handles_mutex);
  DeviceHandles& h = handles_for_current_device();
  if (!h.cublaslt) {
    void* ws = device_malloc(kCublasLtWorkspaceBytes);
    cublasLtHandle_t handle = nullptr;
    const cublasStatus_t st = cublasLtCreate(&handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
      device_free(ws);
      KILN_CUBLAS_CHECK(st);
    }
    h.cublaslt = handle;
    h.workspace = Workspace{ws, kCublasLtWorkspaceBytes};
  }
  return h.cublaslt;
}

Workspace cublaslt_workspace() {
  (void)cublaslt_handle();
  std::lock_guard lock(g_handles_mutex);
  return handles_for_current_device().workspace;
}

cudnnContext* cudnn_handle() {
  std::lock_guard lock(g_handles_mutex);
  DeviceHandles& h = handles_for_current_device();
  if (!h.cudnn) KILN_CUDNN_CHECK(cudnnCreate(&h.cudnn));
  return h.cudnn;
}

size_t runtime_reserved_bytes() {
  std::lock_guard lock(g_handles_mutex);
  return handles_for_current_device().workspace.bytes;
}

// ---- versions
// --------------------------------------------------------------------------------------

int cublaslt_version() { return static_cast<int>(cublasLtGetVersion()); }
int cudnn_version() { return static_cast<int>(cudnnGetVersion()); }

int nccl_version() {
  int v = 0;
  KILN_NCCL_CHECK(ncclGetVersion(&v));
  return v;
}

// ---- toolchain probe ---------------------------------------------------------------------------

namespace {
__global__ void fill_iota_u32_kernel(unsigned* dst, size_t n, unsigned start) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = start + static_cast<unsigned>(i);
}
}  // namespace

void fill_iota_u32(unsigned* dst, size_t n, unsigned start, StreamHandle stream) {
  if (n == 0) return;
  constexpr unsigned kThreads = 256;
  const size_t blocks = (n + kThreads - 1) / kThreads;
  KILN_CHECK(blocks <= 0x7fffffffu, "[cuda] fill_iota_u32: n = {} too large", n);
  fill_iota_u32_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dst, n, start);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::cuda
