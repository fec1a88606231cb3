// The probe: every checkpoint is read once in a forked child before kiln's own process lets HDF5
// touch it (docs/robustness.md, "HDF5 checkpoints are probed first").
//
// Debian 12's libhdf5 (1.10.8) is not memory-safe on corrupt or crafted metadata: it can
// segfault, overflow its stack, malloc 16 GiB or loop forever while it parses object headers,
// before kiln sees any value it could check. kiln cannot validate HDF5's internal structures from
// outside, so it lets a throw-away child do everything the load will do (open, every group,
// dataset shape, dtype, checksum attribute and the data, every root attribute) under a memory
// limit (RLIMIT_AS) and a wall-clock limit, and reports a crash, an exhaustion or a hang of the
// child as a clean kiln::Error. Only a file the child read completely is opened in this process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::io {

struct CheckpointProbeLimits {
  // Wall clock for the child: base + one second per `bytes_per_second` of file.
  double timeout_s = 30.0;
  double bytes_per_second = 50.0 * (1 << 20);
  // Address space the child may add to what it inherited: base + 2 x the file size.
  size_t memory_bytes = size_t{1} << 30;
};

// Process-wide limits (the fuzz target shortens the timeout so that a hang costs seconds).
void set_checkpoint_probe_limits(const CheckpointProbeLimits& limits);
CheckpointProbeLimits checkpoint_probe_limits();

// What identifies one version of a file: a file replaced (rename) or rewritten in place after it
// was probed differs in inode, size or times.
struct FileIdentity {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};
// Of an open descriptor; throws on fstat failure.
FileIdentity file_identity(int fd, const std::string& path);

// Reads the checkpoint at `path` completely in a forked child. Returns when the child read every
// group, dataset and root attribute without an error; throws kiln::Error
// "[checkpoint] <path>: ..." otherwise: the child's own error (the same one an in-process load
// would give), or "HDF5 crashed reading the file (signal 11)", "... ran out of memory ...",
// "... did not finish ...". A file whose identity (device, inode, size, times) was already
// probed by this process is not probed again. Called by CheckpointReader::open; callers need not
// call it themselves.
// Returns the identity of the file that was probed: CheckpointReader::open checks that the file
// it then opens is that same file.
FileIdentity probe_checkpoint(const std::string& path);

// Forgets which files were probed (tests).
void forget_probed_checkpoints();

namespace detail {
// What the child does (checkpoint_h5.cpp): opens `path` in-process, checks that it is the file
// `expect` identifies, and reads everything a load reads. Throws kiln::Error on the first
// refusal; crashes where HDF5 crashes.
void probe_read_all(const std::string& path, const FileIdentity& expect);
}  // namespace detail

}  // namespace kiln::io
