// CUDA runtime wiring: error translation, device queries, raw memory, streams and the per-device
// library handles (cuBLASLt with its workspace, cuDNN). See runtime.h for the contract.
//
// Kernel here: fill_iota_u32, dst[i] = start + i (writes, `=`), a toolchain probe only.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <nccl.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <type_traits>

#include "kernels/cuda/runtime.h"

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

// ---- contexts: created once per device, and measured -------------------------------------------

namespace {

constexpr int kMaxDevices = 64;

struct ContextRecord {
  std::once_flag once;
  size_t context = 0;
  size_t other_processes = 0;
  bool measured = false;
  std::atomic<bool> created{false};  // set last (release): the fields above are then final
};
std::array<ContextRecord, kMaxDevices> g_contexts;

// NVML, loaded at run time (it ships with the driver, not the toolkit, so nothing links it):
// device memory in use before our context exists, which cudaMemGetInfo cannot tell without
// creating one. The declarations follow nvml.h (NVML 11+); nvmlMemory_v2 keeps the driver's
// reserved memory apart from `used`, as cudaMemGetInfo's total leaves it out.
struct NvmlMemoryV2 {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
using NvmlDevice = struct NvmlDeviceOpaque*;
using NvmlInitFn = int (*)();
using NvmlShutdownFn = int (*)();
using NvmlByBusIdFn = int (*)(const char*, NvmlDevice*);
using NvmlMemoryV2Fn = int (*)(NvmlDevice, NvmlMemoryV2*);

// Bytes in use on `device` as NVML reports them (allocations of every process, not the
// driver's reservation); nullopt when NVML or the v2 query is unavailable.
std::optional<size_t> nvml_used_bytes(int device) {
  char bus_id[64] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return std::nullopt;
  auto init = reinterpret_cast<NvmlInitFn>(dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<NvmlShutdownFn>(dlsym(lib, "nvmlShutdown"));
  auto by_bus = reinterpret_cast<NvmlByBusIdFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto mem = reinterpret_cast<NvmlMemoryV2Fn>(dlsym(lib, "nvmlDeviceGetMemoryInfo_v2"));
  std::optional<size_t> used;
  if (init && shutdown && by_bus && mem && init() == 0) {
    NvmlDevice dev = nullptr;
    NvmlMemoryV2 m{};
    // NVML_STRUCT_VERSION(Memory, 2): the struct's size with the version in the top byte.
    m.version = static_cast<unsigned int>(sizeof(NvmlMemoryV2)) | (2u << 24);
    if (by_bus(bus_id, &dev) == 0 && mem(dev, &m) == 0 && m.used <= m.total)
      used = static_cast<size_t>(m.used);
    (void)shutdown();
  }
  dlclose(lib);
  return used;
}

// Creates the primary context of `device` once, measuring it, and leaves `device` current.
void create_context(int device) {
  KILN_CHECK(device >= 0 && device < kMaxDevices, "[cuda] device index {} exceeds {}", device,
             kMaxDevices);
  ContextRecord& r = g_contexts[static_cast<size_t>(device)];
  std::call_once(r.once, [&] {
    const std::optional<size_t> before = nvml_used_bytes(device);
    KILN_CUDA_CHECK(cudaSetDevice(device));  // creates the primary context (CUDA 12+)
    KILN_CUDA_CHECK(cudaFree(nullptr));      // and so does this, on any version
    size_t free_b = 0, total_b = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t used_after = total_b - free_b;
    if (before && *before <= used_after) {
      r.context = used_after - *before;
      r.other_processes = *before;
      r.measured = true;
    } else {
      r.context = used_after;  // everything in use: ours, and anyone else's
      r.other_processes = 0;
      r.measured = false;
    }
    r.created.store(true, std::memory_order_release);
  });
  KILN_CUDA_CHECK(cudaSetDevice(device));
}

// The current device, with its context created.
int ensure_context() {
  int d = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&d));  // creates nothing
  if (d < 0 || d >= kMaxDevices ||
      !g_contexts[static_cast<size_t>(d)].created.load(std::memory_order_acquire))
    create_context(d);
  return d;
}

size_t driver_free_bytes() {
  size_t free_b = 0, total_b = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

}  // namespace

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

void set_device(int device) {
  const int n = device_count();
  KILN_CHECK(device >= 0 && device < n, "[cuda] set_device: device {} out of range [0, {})", device,
             n);
  create_context(device);
}

MemInfo mem_get_info() {
  (void)ensure_context();
  MemInfo m;
  KILN_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

void device_synchronize() {
  (void)ensure_context();
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

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
// ----------------------------------------------------------------------------------

void* device_malloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  (void)ensure_context();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    throw DeviceOutOfMemory(
        fmt::format("[cuda] device_malloc: out of memory allocating {} bytes ({} bytes free of {})",
                    bytes, free_b, total_b));
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
// -------------------------------------------------------------------------------------

Stream::Stream() {
  (void)ensure_context();
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

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

// ---- library handles ---------------------------------------------------------------------------

namespace {

constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;

struct DeviceHandles {
  cublasLtHandle_t cublaslt = nullptr;
  Workspace workspace;
  cudnnHandle_t cudnn = nullptr;
  size_t cublaslt_bytes = 0;  // measured around cublasLtCreate
  size_t cudnn_bytes = 0;     // measured around cudnnCreate
};

// Handles are created once per device and deliberately never destroyed: destroying them from a
// static destructor races with the CUDA runtime's own teardown at exit.
std::mutex g_handles_mutex;
std::array<DeviceHandles, kMaxDevices> g_handles;

DeviceHandles& handles_for_current_device() {
  const int d = ensure_context();
  KILN_CHECK(d >= 0 && d < kMaxDevices, "[cuda] device index {} exceeds {}", d, kMaxDevices);
  return g_handles[static_cast<size_t>(d)];
}

// What a creation cost: the driver's free memory before minus after (0 if it grew).
size_t freed_between(size_t before, size_t after) { return before > after ? before - after : 0; }

}  // namespace

cublasLtContext* cublaslt_handle() {
  std::lock_guard lock(g_handles_mutex);
  DeviceHandles& h = handles_for_current_device();
  if (!h.cublaslt) {
    const size_t f0 = driver_free_bytes();
    cublasLtHandle_t handle = nullptr;
    KILN_CUBLAS_CHECK(cublasLtCreate(&handle));
    const size_t f1 = driver_free_bytes();
    void* ws = nullptr;
    try {
      ws = device_malloc(kCublasLtWorkspaceBytes);
    } catch (...) {
      (void)cublasLtDestroy(handle);
      throw;
    }
    h.cublaslt = handle;
    h.workspace = Workspace{ws, kCublasLtWorkspaceBytes};
    h.cublaslt_bytes = freed_between(f0, f1);
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
  if (!h.cudnn) {
    const size_t f0 = driver_free_bytes();
    KILN_CUDNN_CHECK(cudnnCreate(&h.cudnn));
    h.cudnn_bytes = freed_between(f0, driver_free_bytes());
  }
  return h.cudnn;
}

RuntimeBytes runtime_bytes() {
  RuntimeBytes r;
  int d = 0;
  // Reading the figures creates nothing, and without a driver or device they are all zero.
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return r;
  }
  if (d < 0 || d >= kMaxDevices) return r;
  const ContextRecord& c = g_contexts[static_cast<size_t>(d)];
  std::lock_guard lock(g_handles_mutex);
  if (c.created.load(std::memory_order_acquire)) {
    r.context = c.context;
    r.other_processes = c.other_processes;
    r.context_created = true;
    r.context_measured = c.measured;
  }
  const DeviceHandles& h = g_handles[static_cast<size_t>(d)];
  r.cublaslt_handle = h.cublaslt_bytes;
  r.cublaslt_workspace = h.workspace.bytes;
  r.cudnn_handle = h.cudnn_bytes;
  return r;
}

size_t runtime_reserved_bytes() { return runtime_bytes().libraries(); }

// ---- versions
// ------------------------------------------------------------------------------------

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
