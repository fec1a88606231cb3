// Hugging Face safetensors: reading (mmap, validated), writing (atomic), and
// sharded folders (model.safetensors.index.json).
//
// File layout:
//   u64 little-endian N | N bytes of JSON header | data section
//   header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "value", ...}}   (metadata optional, strings only)
// Offsets are relative to the start of the data section. Every number in the
// header is validated before use: the entries must tile the data section
// exactly (sorted by offset: contiguous from 0 to its end, no gaps or overlaps).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/io/dtype_names.h"
#include "models/io/mapped_file.h"

namespace kiln::io {

struct TensorEntry {
  std::string name;
  std::string dtype;            // safetensors name, see dtype_names.h
  std::vector<int64_t> shape;   // empty for a scalar
  uint64_t begin = 0, end = 0;  // byte offsets in the data section

  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

using Metadata = std::map<std::string, std::string>;

// Largest header accepted, as in the HF library.
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws kiln::Error "[safetensors] <path>: ..." on bad input.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  // All tensors, sorted by name.
  const std::vector<TensorEntry>& entries() const { return entries_; }
  // nullptr when absent.
  const TensorEntry* find(std::string_view name) const;
  // Throws when absent.
  const TensorEntry& at(std::string_view name) const;
  // Pointer to the entry's first byte inside the mapping (valid while this object lives).
  const uint8_t* data(const TensorEntry& e) const;
  const Metadata& metadata() const { return metadata_; }
  // Byte offset of the data section in the file (8 + header length).
  uint64_t data_offset() const { return data_offset_; }

 private:
  MappedFile file_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
  Metadata metadata_;
  uint64_t data_offset_ = 0;
};

class SafetensorsWriter {
 public:
  // Registers a tensor. `data` is NOT copied: it must stay valid until write().
  // nbytes must equal numel(shape) * dtype_size(dtype).
  void add(std::string name, std::string dtype, std::vector<int64_t> shape, const void* data,
           uint64_t nbytes);
  // Writes the file atomically (temp file, fsync, rename). Tensors are laid out
  // by element size (largest first), then name, so each is aligned to its
  // element size; the header is padded with spaces to a multiple of 8 bytes.
  void write(const std::string& path, const Metadata& metadata = {}) const;
  size_t size() const { return tensors_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  struct Pending {
    TensorEntry entry;
    const void* data;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, size_t, std::less<>> names_;
  uint64_t total_bytes_ = 0;
};

// A sharded checkpoint: model.safetensors.index.json plus its shard files,
// opened on first use. Also covers a folder with a single model.safetensors.
class SafetensorsIndex {
 public:
  // Reads an index file {"metadata": {...}, "weight_map": {name: shard file}}.
  // Shard names must be relative paths that stay inside the index's folder.
  explicit SafetensorsIndex(const std::string& index_path);
  // A model folder: uses model.safetensors.index.json when present, else model.safetensors.
  static SafetensorsIndex open_dir(const std::string& dir);

  struct Found {
    const SafetensorsFile* file;
    const TensorEntry* entry;
    const uint8_t* data() const { return file->data(*entry); }
  };
  // Opens the shard holding `name` if needed. nullopt when the name is not in
  // the weight map; throws when the shard lacks a tensor the map promises.
  std::optional<Found> find(std::string_view name) const;
  Found at(std::string_view name) const;

  // All tensor names (sorted) and distinct shard file names (sorted).
  std::vector<std::string> names() const;
  std::vector<std::string> shard_files() const;
  const std::string& dir() const { return dir_; }
  // The index's "metadata" object; non-string values are kept as their JSON text.
  const Metadata& metadata() const { return metadata_; }
  // Number of shards opened so far (for tests of the lazy behaviour).
  size_t shards_open() const;

 private:
  SafetensorsIndex() = default;
  const SafetensorsFile& shard(const std::string& file) const;

  std::string dir_;
  std::string index_path_;
  std::map<std::string, std::string, std::less<>> weight_map_;
  Metadata metadata_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
  mutable std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
};

// Writes model.safetensors.index.json content atomically.
void write_safetensors_index(const std::string& path, const Metadata& metadata,
                             const std::map<std::string, std::string>& weight_map);

}  // namespace kiln::io
