// The checkpoint probe: see checkpoint_probe.h.
#include "models/io/checkpoint_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "kernels/common/error.h"
#include "models/io/checkpoint_h5.h"

// Present only in sanitizer builds (ASan/UBSan runtimes); null otherwise.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace kiln::io {
namespace {

// The child's exit code after a sanitizer report (ASan/UBSan found a memory error in it).
constexpr int kSanitizerExit = 86;
// What the child writes to the pipe before it exits: one status byte, then a message.
constexpr char kOk = 'O', kError = 'E', kOutOfMemory = 'M', kOther = 'X';
constexpr const char* kVerdict = "the file is corrupt or not a kiln checkpoint";

std::mutex g_mutex;
CheckpointProbeLimits g_limits;
std::vector<FileIdentity> g_probed;  // files this process probed successfully

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent is gone; nothing to report to
    off += static_cast<size_t>(n);
  }
}

void sanitizer_died() { _exit(kSanitizerExit); }

// Address space this process has mapped now, in bytes (0 if /proc is not there). No stdio: the
// child must not allocate before its read, so that its heap is the parent's (checkpoint_h5.cpp,
// CheckpointReader::walk_metadata).
size_t mapped_bytes() {
  int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[64] = {};
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  unsigned long pages = std::strtoul(buf, nullptr, 10);
  return pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// The child: runs the read, reports over `fd`, and leaves with _exit so that no atexit handler
// (HDF5's, libFuzzer's, the sanitizers' leak check) and no stdio flush of the parent's buffers
// runs in it.
[[noreturn]] void child_main(int fd, const std::string& path, const FileIdentity& id,
                             size_t memory_bytes) {
  // A crash kills the child by its signal: no handler inherited from the parent (libFuzzer's,
  // the sanitizers', a debugger's) may run in it, and no core is dumped.
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP, SIGINT, SIGTERM,
                  SIGALRM, SIGXCPU, SIGXFSZ, SIGUSR1, SIGUSR2, SIGPIPE})
    ::signal(sig, SIG_DFL);
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(sanitizer_died);
  int devnull = ::open("/dev/null", O_WRONLY);
  if (devnull >= 0) {  // HDF5 or glibc ("malloc(): corrupted ...") may print; the parent reports
    ::dup2(devnull, STDOUT_FILENO);
    ::dup2(devnull, STDERR_FILENO);
  }
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  if (size_t now = mapped_bytes(); now > 0) {
    rlimit as{now + memory_bytes, now + memory_bytes};
    setrlimit(RLIMIT_AS, &as);
  }
  std::string report;
  try {
    detail::probe_read_all(path, id);
    report = std::string(1, kOk);
  } catch (const kiln::Error& e) {
    report = kError + std::string(e.what());
  } catch (const std::bad_alloc&) {
    report = std::string(1, kOutOfMemory);
  } catch (const std::exception& e) {
    report = kOther + std::string(e.what());
  } catch (...) {
    report = kOther + std::string("unknown exception");
  }
  write_all(fd, report);
  _exit(0);
}

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

// Runs the child and turns every way it can end into "return" (read cleanly) or a kiln::Error.
void run_probe(const std::string& path, const FileIdentity& id) {
  const uint64_t file_size = id.size;
  const CheckpointProbeLimits lim = checkpoint_probe_limits();
  const double timeout = lim.timeout_s + static_cast<double>(file_size) / lim.bytes_per_second;
  const size_t memory = lim.memory_bytes + 2 * static_cast<size_t>(file_size);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    fail("[checkpoint] {}: cannot start the probe process (pipe: {})", path, std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered may be written twice (the child never flushes)
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    fail("[checkpoint] {}: cannot start the probe process (fork: {})", path, std::strerror(err));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], path, id, memory);
  }
  ::close(fds[1]);
  std::string msg;
  bool timed_out = false;
  const double deadline = now_s() + timeout;
  char buf[4096];
  while (true) {
    double left = deadline - now_s();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) continue;  // the loop re-checks the deadline
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child exited (or died)
    msg.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  const int status = wait_child(pid);
  if (timed_out)
    fail("[checkpoint] {}: HDF5 did not finish reading the file in {:.0f} s (it hangs on it): {}",
         path, timeout, kVerdict);
  if (status != -1 && WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    if (sig == SIGKILL)  // nothing here sends it: the kernel's out-of-memory killer
      fail("[checkpoint] {}: HDF5 was killed reading the file (signal 9, out of memory?): {}", path,
           kVerdict);
    fail("[checkpoint] {}: HDF5 crashed reading the file (signal {}): {}", path, sig, kVerdict);
  }
  if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == kSanitizerExit)
    fail("[checkpoint] {}: HDF5 crashed reading the file (memory error found by the sanitizer): {}",
         path, kVerdict);
  if (msg.empty())
    fail("[checkpoint] {}: HDF5 crashed reading the file (exit status {}): {}", path, status,
         kVerdict);
  const std::string text = msg.substr(1);
  switch (msg[0]) {
    case kOk:
      return;
    case kError: {  // the child's own refusal, as an in-process load gives it, naming the file
      const std::string tag = "[checkpoint] ";
      if (text.find(path) != std::string::npos || text.rfind(tag, 0) != 0) fail("{}", text);
      fail("{}{}: {}", tag, path, text.substr(tag.size()));
    }
    case kOutOfMemory:
      fail("[checkpoint] {}: reading the file ran out of memory (over {} MiB): {}", path,
           memory >> 20, kVerdict);
    default:
      fail("[checkpoint] {}: reading the file failed: {}: {}", path, text, kVerdict);
  }
}

}  // namespace

void set_checkpoint_probe_limits(const CheckpointProbeLimits& limits) {
  KILN_CHECK(limits.timeout_s > 0 && limits.bytes_per_second > 0 && limits.memory_bytes > 0,
             "[checkpoint] probe limits must be positive");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_limits = limits;
}

CheckpointProbeLimits checkpoint_probe_limits() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_limits;
}

FileIdentity file_identity(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("[checkpoint] {}: fstat failed: {}", path, std::strerror(errno));
  FileIdentity id;
  id.dev = static_cast<uint64_t>(st.st_dev);
  id.ino = static_cast<uint64_t>(st.st_ino);
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  id.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return id;
}

FileIdentity probe_checkpoint(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail("[checkpoint] {}: cannot open: {}", path, std::strerror(errno));
  FileIdentity id;
  try {
    id = file_identity(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const FileIdentity& p : g_probed)
      if (p == id) return id;
  }
  run_probe(path, id);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_probed.push_back(id);
  return id;
}

void forget_probed_checkpoints() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_probed.clear();
}

}  // namespace kiln::io
