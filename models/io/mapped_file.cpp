#include "models/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "kernels/common/error.h"

namespace kiln::io {

namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

int open_regular_file(const std::string& path, std::string_view who, std::uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait forever for a writer. It has no
  // effect on the regular files that pass the check below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("[{}] {}: cannot open: {}", who, path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("[{}] {}: cannot stat: {}", who, path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("[{}] {}: is {}, not a regular file (kiln reads regular files only)", who, path,
         file_kind(st.st_mode));
  }
  *size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, std::string_view who,
                              std::uint64_t max_bytes) {
  std::uint64_t size = 0;
  int fd = open_regular_file(path, who, &size);
  if (size > max_bytes) {
    ::close(fd);
    fail("[{}] {}: is {} bytes, more than the {} this reader accepts", who, path, size, max_bytes);
  }
  std::string out(size, '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t r = ::read(fd, out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      ::close(fd);
      fail("[{}] {}: read failed: {}", who, path, std::strerror(e));
    }
    if (r == 0) break;  // shrank while we read: keep what is there
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  int fd = open_regular_file(path_, "mmap", &size_);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("[mmap] {}: mmap of {} bytes failed: {}", path_, size_, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

bool prefault_mapping(const void* p, std::size_t n) {
  if (n == 0) return true;
#if defined(__linux__)
#ifdef MADV_POPULATE_READ
  constexpr int kPopulateRead = MADV_POPULATE_READ;
#else
  constexpr int kPopulateRead = 22;  // Linux 5.14's value; older kernels answer EINVAL
#endif
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const auto end = reinterpret_cast<std::uintptr_t>(p) + n;
  return ::madvise(reinterpret_cast<void*>(begin), end - begin, kPopulateRead) == 0;
#else
  (void)p;
  return false;
#endif
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---- reads of a mapping whose file may shrink ------------------------------------------
// A mapped page past the end of a file that was truncated after mmap raises SIGBUS on access.
// Checking the size before copying leaves a window (the file can shrink during the copy), so
// the copy itself runs under a SIGBUS handler: when the fault happens inside a guarded copy on
// this thread, the handler jumps back out of memcpy and the copy fails with the file's name.
// Any other SIGBUS keeps its default action (the handler re-raises it).
namespace {

// volatile, with signal fences around the copy: memcpy does not read it, so the compiler would
// otherwise drop the store before the copy as dead.
thread_local sigjmp_buf* volatile t_bus_jump = nullptr;

void on_sigbus(int sig, siginfo_t*, void*) {
  if (t_bus_jump) siglongjmp(*t_bus_jump, 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_sigbus_handler() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    return ::sigaction(SIGBUS, &sa, nullptr) == 0;
  }();
  (void)installed;
}

}  // namespace

void copy_from_mapping(void* dst, const void* src, std::size_t n, std::string_view what) {
  if (n == 0) return;
  install_sigbus_handler();
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {
    t_bus_jump = nullptr;
    fail(
        "[mmap] {}: the file shrank while kiln read it (SIGBUS): it was truncated or replaced "
        "while mapped; nothing was loaded from it",
        what);
  }
  t_bus_jump = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_bus_jump = nullptr;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

bool checked_add(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

namespace {

void write_all(int fd, const uint8_t* p, size_t n, const std::string& tmp) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("[write] {}: write failed: {}", tmp, std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

void write_file_atomically(const std::string& path, std::span<const ByteChunk> chunks) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  // The temp file sits beside the target so rename() stays on one filesystem.
  std::string tmp =
      (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("[write] {}: cannot create temp file {}: {}", path, tmp, std::strerror(errno));
  try {
    for (const auto& c : chunks) {
      if (c.data != nullptr || !c.fill) {
        write_all(fd, static_cast<const uint8_t*>(c.data), c.size, tmp);
        continue;
      }
      std::vector<uint8_t> buf(c.size);
      c.fill(buf.data());
      write_all(fd, buf.data(), buf.size(), tmp);
    }
    if (::fsync(fd) != 0) fail("[write] {}: fsync failed: {}", tmp, std::strerror(errno));
    if (::close(fd) != 0) {
      fd = -1;
      fail("[write] {}: close failed: {}", tmp, std::strerror(errno));
    }
    fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail("[write] {}: rename from {} failed: {}", path, tmp, std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable; failure here does not lose data, so it is not fatal.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace kiln::io
