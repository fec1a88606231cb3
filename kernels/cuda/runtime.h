// CUDA runtime wiring for kiln: error checks for every CUDA library we link, device queries,
// raw device memory, copies, streams and the lazily created library handles.
//
// This header is plain C++: it is included by .cpp files compiled with g++, so it names CUDA
// types only through forward declarations that match the CUDA headers exactly
// (cudaStream_t == CUstream_st*, cublasLtHandle_t == cublasLtContext*, ...). It can be included
// in a CPU-only build (KILN_CUDA undefined) too: there device_count() is 0 and every other call
// throws kiln::Error, so device-agnostic code needs no #if.
//
// The caching allocator (tensor/) sits on top of device_malloc/device_free; nothing here caches.
#pragma once

#include <cstddef>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "kernels/common/error.h"

struct CUstream_st;      // cudaStream_t
struct cublasLtContext;  // cublasLtHandle_t
struct cudnnContext;     // cudnnHandle_t

namespace kiln::cuda {

// What device_malloc throws when the device has no room (cudaErrorMemoryAllocation), and only
// then: the caching allocator releases its cache and retries on this error alone; any other
// error (an illegal address left by an earlier kernel, a lost device) is a plain kiln::Error and
// propagates with its own message. Declared in CPU-only builds too, so tests can throw it.
struct DeviceOutOfMemory : Error {
  using Error::Error;
};

// The shared libraries mapped into this process now (/proc/self/maps), whose file name contains
// one of `parts` (all of them when empty), sorted: which copies of cudart, cuBLAS(Lt), cuDNN,
// NCCL, OpenBLAS... the loader actually picked, for gpu_check's smoke stage. Empty where
// /proc is absent.
inline std::vector<std::string> loaded_libraries(const std::vector<std::string>& parts = {}) {
  std::set<std::string> found;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos || line.find(".so", slash) == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string file = path.substr(path.rfind('/') + 1);
    bool want = parts.empty();
    for (const std::string& p : parts) want = want || file.find(p) != std::string::npos;
    if (want) found.insert(path);
  }
  return {found.begin(), found.end()};
}

// Same type as cudaStream_t; nullptr is the legacy default stream.
using StreamHandle = CUstream_st*;

struct DeviceInfo {
  int index = 0;
  std::string name;  // "NVIDIA H100 80GB HBM3"
  int sm_major = 0;  // compute capability, 9.0 on Hopper
  int sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;  // bytes
  size_t l2_cache_bytes = 0;
  double bf16_peak_tflops = 0;  // 0 = unknown; measured by bench/, not guessed from the name
};

struct MemInfo {
  size_t free_bytes = 0;  // as the driver reports them (cudaMemGetInfo) on the current device
  size_t total_bytes = 0;
};

// Workspace handed to cuBLASLt matmuls. It is charged to the memory report's Runtime row.
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// Device memory that the CUDA runtime and the libraries hold on one device: the memory report's
// Runtime row. Each figure is the driver's free memory (cudaMemGetInfo) just before the thing
// was created minus just after, so it is what the creation cost, whatever the driver rounds to.
//   context   the primary context (cudaSetDevice + cudaFree(0), made by kiln::cuda the first
//             time the device is used through this file). Before the context exists, only NVML
//             (libnvidia-ml, loaded at run time) can say how much memory is in use; with it,
//             context = (total - free after) - (NVML's used before), and other_processes is
//             NVML's used before. Without NVML, context_measured is false, other_processes 0,
//             and context is everything in use right after the creation.
//   cuBLASLt  the handle (cublasLtCreate) and our 32 MiB workspace, made together on first use.
//   cuDNN     the handle (cudnnCreate), made on first use.
// What the libraries load later (lazily loaded kernels, cuDNN engines) is not in here: the
// report's Unattributed row (driver used - kiln's reserved - runtime) catches it.
struct RuntimeBytes {
  size_t context = 0;
  size_t cublaslt_handle = 0;
  size_t cublaslt_workspace = 0;
  size_t cudnn_handle = 0;
  size_t other_processes = 0;
  bool context_created = false;   // the context exists (made through this file)
  bool context_measured = false;  // NVML gave the use before the context (see above)
  size_t libraries() const { return cublaslt_handle + cublaslt_workspace + cudnn_handle; }
  size_t total() const { return context + libraries(); }
};

#if defined(KILN_CUDA)

namespace detail {
// Throw kiln::Error("[lib] file:line call: name: description"). Codes are the libraries' own
// enums as int; 0 is success in all four.
[[noreturn]] void throw_cuda_error(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_cudnn_error(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(int code, const char* call, const char* file, int line);
}  // namespace detail

// Each check evaluates its argument once and throws kiln::Error on any non-success status.
#define KILN_CUDA_CHECK(call)                                                          \
  do {                                                                                 \
    const int kiln_status_ = static_cast<int>(call);                                   \
    if (kiln_status_ != 0)                                                             \
      ::kiln::cuda::detail::throw_cuda_error(kiln_status_, #call, __FILE__, __LINE__); \
  } while (0)
#define KILN_CUBLAS_CHECK(call)                                                          \
  do {                                                                                   \
    const int kiln_status_ = static_cast<int>(call);                                     \
    if (kiln_status_ != 0)                                                               \
      ::kiln::cuda::detail::throw_cublas_error(kiln_status_, #call, __FILE__, __LINE__); \
  } while (0)
#define KILN_CUDNN_CHECK(call)                                                          \
  do {                                                                                  \
    const int kiln_status_ = static_cast<int>(call);                                    \
    if (kiln_status_ != 0)                                                              \
      ::kiln::cuda::detail::throw_cudnn_error(kiln_status_, #call, __FILE__, __LINE__); \
  } while (0)
#define KILN_NCCL_CHECK(call)                                                          \
  do {                                                                                 \
    const int kiln_status_ = static_cast<int>(call);                                   \
    if (kiln_status_ != 0)                                                             \
      ::kiln::cuda::detail::throw_nccl_error(kiln_status_, #call, __FILE__, __LINE__); \
  } while (0)

constexpr bool compiled_with_cuda() { return true; }

// ---- devices
// ------------------------------------------------------------------------------------- Number of
// visible CUDA devices; 0 (never an exception) when there is no driver or no GPU. Creates no
// context.
int device_count();
DeviceInfo device_info(int device);
int current_device();
// Makes `device` current, creating (and measuring, see RuntimeBytes) its context first.
void set_device(int device);
MemInfo mem_get_info();  // current device
void device_synchronize();
int runtime_version();  // CUDART_VERSION style, 13000 = 13.0
int driver_version();   // 0 when no driver is installed

// ---- raw memory
// ---------------------------------------------------------------------------------- cudaMalloc /
// cudaFree. bytes == 0 gives nullptr; device_free(nullptr) is a no-op. Out of memory throws
// kiln::Error naming the size and the free/total memory.
void* device_malloc(size_t bytes);
void device_free(void* ptr);

// Copies are cudaMemcpyAsync on `stream`. h2d returns once the host source may be reused;
// d2h synchronizes the stream so the host destination is ready on return; d2d is asynchronous.
void memcpy_h2d(void* dst, const void* src, size_t bytes, StreamHandle stream = nullptr);
void memcpy_d2h(void* dst, const void* src, size_t bytes, StreamHandle stream = nullptr);
void memcpy_d2d(void* dst, const void* src, size_t bytes, StreamHandle stream = nullptr);
void memset_async(void* dst, int byte_value, size_t bytes, StreamHandle stream = nullptr);

// ---- streams
// ------------------------------------------------------------------------------------- Owning,
// non-blocking stream (cudaStreamNonBlocking) on the current device.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;

  StreamHandle get() const { return stream_; }
  void synchronize() const;

 private:
  StreamHandle stream_ = nullptr;
};
void stream_synchronize(StreamHandle stream);

// ---- library handles (per device, created on first use, live until process exit) --------------
cublasLtContext* cublaslt_handle();
Workspace
cublaslt_workspace();  // 32 MiB (cuBLAS's recommendation for Hopper), made with the handle
cudnnContext* cudnn_handle();
// The current device's RuntimeBytes (zeros for what was not created yet).
RuntimeBytes runtime_bytes();
// The libraries' part of it (handles and workspaces, not the context).
size_t runtime_reserved_bytes();

// ---- versions (for logs and gpu_check results) --------------------------------------------------
int cublaslt_version();
int cudnn_version();  // e.g. 91300 = 9.13.0
int nccl_version();   // e.g. 22803 = 2.28.3

// Toolchain probe: runs a tiny nvcc-built kernel, dst[i] = start + i for i < n (writes, `=`).
// Proves that code compiled for sm_90 loads and runs on the device.
void fill_iota_u32(unsigned* dst, size_t n, unsigned start, StreamHandle stream = nullptr);

#else  // CPU-only build: the same names, so callers need no #if.

constexpr bool compiled_with_cuda() { return false; }

[[noreturn]] inline void no_cuda(const char* what) {
  fail("[cuda] {}: kiln was built without CUDA (configure with -DKILN_CUDA=ON)", what);
}
inline int device_count() { return 0; }
inline DeviceInfo device_info(int) { no_cuda("device_info"); }
inline int current_device() { no_cuda("current_device"); }
inline void set_device(int) { no_cuda("set_device"); }
inline MemInfo mem_get_info() { no_cuda("mem_get_info"); }
inline void device_synchronize() { no_cuda("device_synchronize"); }
inline int runtime_version() { return 0; }
inline int driver_version() { return 0; }
inline void* device_malloc(size_t) { no_cuda("device_malloc"); }
inline void device_free(void* ptr) {
  if (ptr) no_cuda("device_free");
}
inline void memcpy_h2d(void*, const void*, size_t, StreamHandle = nullptr) {
  no_cuda("memcpy_h2d");
}
inline void memcpy_d2h(void*, const void*, size_t, StreamHandle = nullptr) {
  no_cuda("memcpy_d2h");
}
inline void memcpy_d2d(void*, const void*, size_t, StreamHandle = nullptr) {
  no_cuda("memcpy_d2d");
}
inline void memset_async(void*, int, size_t, StreamHandle = nullptr) { no_cuda("memset_async"); }
inline void stream_synchronize(StreamHandle) { no_cuda("stream_synchronize"); }
inline RuntimeBytes runtime_bytes() { return {}; }
inline size_t runtime_reserved_bytes() { return 0; }
inline int cublaslt_version() { return 0; }
inline int cudnn_version() { return 0; }
inline int nccl_version() { return 0; }

#endif  // KILN_CUDA

}  // namespace kiln::cuda
