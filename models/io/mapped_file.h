// A read-only memory map of a whole file, shared by the safetensors and
// llama2.c readers. The mapping lives as long as the MappedFile does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

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

// Overflow-checked arithmetic for sizes read from files.
bool checked_mul(uint64_t a, uint64_t b, uint64_t* out);
bool checked_add(uint64_t a, uint64_t b, uint64_t* out);

struct ByteChunk {
  const void* data;
  size_t size;
};

// Writes the chunks, in order, to `path` atomically: a temp file beside it,
// fsync, rename over `path`, fsync of the folder. On any failure the temp file
// is removed, `path` is left untouched, and kiln::Error is thrown.
void write_file_atomically(const std::string& path, std::span<const ByteChunk> chunks);

}  // namespace kiln::io
