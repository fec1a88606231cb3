// A read-only memory map of a whole file, shared by the safetensors and
// llama2.c readers. The mapping lives as long as the MappedFile does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace kiln::io {

class MappedFile {
 public:
  // Maps `path` read-only; throws kiln::Error ("[mmap] <path>: ...") on failure.
  // An empty file maps to size() == 0 and data() == nullptr.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Opens `path` read-only if it is a regular file, and returns the descriptor and its size. A FIFO,
// a device (/dev/zero), a socket or a directory is refused with "[who] <path>: is a FIFO, not a
// regular file ..." without blocking or reading: kiln never waits on, or reads without end
// from, something that is not a file.
int open_regular_file(const std::string& path, std::string_view who, std::uint64_t* size);
// The whole of a regular file (open_regular_file's checks), refused when larger than max_bytes.
std::string read_regular_file(const std::string& path, std::string_view who,
                              std::uint64_t max_bytes = UINT64_MAX);

// memcpy from a file mapping, failing with "[mmap] <what>: the file shrank ..." instead of
// dying of SIGBUS when the file was truncated after it was mapped (see mapped_file.cpp).
void copy_from_mapping(void* dst, const void* src, std::size_t n, std::string_view what);

// Maps the pages of [p, p + n), a range of a file mapping, into the page tables now
// (madvise MADV_POPULATE_READ, Linux 5.14+) instead of one fault per 64 KiB on first touch.
// For weights used in place: a Qwen3-0.6B bf16 prefill of 512 tokens took its 1.1 GiB of page
// faults (two threads contending for the page-table lock) inside the prefill, about 0.07 s of
// its 0.47 s; populating at load costs about 0.04 s. Best effort: false where the kernel cannot
// (older kernels, a file truncated since mapping); the pages then fault in on first use as before.
bool prefault_mapping(const void* p, std::size_t n);

// Overflow-checked arithmetic for sizes read from files.
bool checked_mul(uint64_t a, uint64_t b, uint64_t* out);
bool checked_add(uint64_t a, uint64_t b, uint64_t* out);

// size bytes at data; or, with data null, size bytes that fill writes into a buffer when the
// chunk's turn comes (so a large file need not be in memory all at once).
struct ByteChunk {
  const void* data;
  size_t size;
  std::function<void(uint8_t*)> fill = {};
};

// Writes the chunks, in order, to `path` atomically: a temp file beside it,
// fsync, rename over `path`, fsync of the folder. On any failure the temp file
// is removed, `path` is left untouched, and kiln::Error is thrown.
void write_file_atomically(const std::string& path, std::span<const ByteChunk> chunks);

}  // namespace kiln::io
