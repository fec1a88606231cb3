// HDF5 training checkpoints on raw buffers (no Tensor type needed).
//
// File layout (kiln_checkpoint_version 1):
//   /                      attrs: kiln_checkpoint_version (i64 = 1) + user attrs (set_attr_*)
//   /model/<name>          weights, one dataset per tensor, <name> is the HF name
//   /optim_m/<name>, /optim_v/<name>   AdamW moments (any other section name works too)
//   /meta/<name>           byte blobs from add_bytes (RNG state, tokenizer, data position)
// Every dataset carries two attributes:
//   dtype   (string: "f32", "f64", "bf16", "f16", "i32", "i64", "u8"); bf16 and f16 are stored
//           as uint16 datasets, so standard tools read them as raw bits.
//   fnv1a64 (uint64): FNV-1a 64-bit hash of the tensor's raw little-endian bytes, checked on
//           read so silent corruption of data bytes is caught.
// Writes are atomic: the file is written to `path + ".tmp"`, fsync'ed, renamed over `path`, and
// the directory is fsync'ed. A crash leaves either the old file or the new one, never a mix.
//
// Errors (HDF5 failures, malformed or corrupt files) throw kiln::Error "[checkpoint] ...". HDF5's
// automatic error printing is switched off process-wide; its messages are folded into ours.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "models/io/checkpoint_probe.h"

namespace kiln::io {

// FNV-1a 64-bit over raw bytes; `seed` lets a caller hash in pieces.
uint64_t fnv1a64(const void* data, size_t nbytes, uint64_t seed = 0xcbf29ce484222325ull);

// Bytes per element of a checkpoint dtype ("F32", "BF16", ...); throws on unknown names.
size_t checkpoint_dtype_size(const std::string& dtype);

struct TensorInfo {
  std::string dtype;           // "F32", "F64", "BF16", "F16", "I32", "I64", "U8"
  std::vector<int64_t> shape;  // empty for a scalar
  size_t nbytes = 0;           // numel * element size (overflow-checked)
};

struct TensorData {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // raw little-endian element bytes
};

class CheckpointWriter {
 public:
  // path: "<section>/<name>", e.g. "model/model.layers.0.mlp.up_proj.weight". <name> may hold
  // dots and further '/' (those become subgroups). The data is borrowed, not copied: it must
  // stay valid until write() returns.
  void add_tensor(const std::string& path, const std::string& dtype,
                  const std::vector<int64_t>& shape, const void* data);
  // Root-level scalar attributes (step, lr, config JSON, ...). Setting a name twice overwrites.
  void set_attr_i64(const std::string& name, int64_t value);
  void set_attr_f64(const std::string& name, double value);
  void set_attr_string(const std::string& name, const std::string& value);
  // A byte blob (copied). `name` without '/' goes to "meta/<name>"; with '/', used as the path.
  void add_bytes(const std::string& name, std::vector<uint8_t> data);

  // Writes everything atomically (see the top of this file). Can be called more than once.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string path, dtype;
    std::vector<int64_t> shape;
    const void* data = nullptr;
    size_t nbytes = 0;
    int blob = -1;  // index into blobs_ for add_bytes entries
  };
  struct Attr {
    std::string name;
    int kind = 0;  // 0 = i64, 1 = f64, 2 = string
    int64_t i = 0;
    double f = 0;
    std::string s;
  };
  std::vector<Entry> entries_;
  std::vector<Attr> attrs_;
  std::vector<std::vector<uint8_t>> blobs_;
  void set_attr(Attr a);
};

class CheckpointReader {
 public:
  CheckpointReader() = default;
  explicit CheckpointReader(const std::string& path) { open(path); }
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // Validates: the file exists, is HDF5, has kiln_checkpoint_version == 1 and the "model" and
  // "meta" groups. Throws kiln::Error otherwise (and closes any previously opened file first).
  // Before HDF5 touches the file in this process, a forked child reads all of it
  // (checkpoint_probe.h): a file that crashes, exhausts or hangs HDF5 is a kiln::Error here.
  void open(const std::string& path);
  void close();
  bool is_open() const { return file_ >= 0; }
  const std::string& path() const { return path_; }

  bool has_group(const std::string& group) const;
  // Dataset names under `group`, relative to it, sorted (e.g. "model.embed_tokens.weight").
  std::vector<std::string> list_tensors(const std::string& group) const;
  bool has_tensor(const std::string& path) const;

  // path: "<section>/<name>". Shape and size are validated; the checksum is verified on read.
  TensorInfo tensor_info(const std::string& path) const;
  TensorData read_tensor(const std::string& path) const;
  // Reads into caller memory of exactly info.nbytes bytes (no extra copy for large weights).
  void read_tensor_into(const std::string& path, void* dst, size_t nbytes) const;
  // Blob written by add_bytes (same naming rule). Verified like a tensor.
  std::vector<uint8_t> read_bytes(const std::string& name) const;

  // Root-level groups and attribute names, sorted.
  std::vector<std::string> list_groups() const;
  std::vector<std::string> list_attrs() const;
  // The kind of a root attribute: 'i' integer, 'f' float, 's' string, '?' anything else.
  char attr_kind(const std::string& name) const;

  bool has_attr(const std::string& name) const;
  int64_t get_attr_i64(const std::string& name) const;
  double get_attr_f64(const std::string& name) const;
  std::string get_attr_string(const std::string& name) const;

 private:
  friend void detail::probe_read_all(const std::string& path, const FileIdentity& expect);
  // open() without the probe, for the probe's child; returns the identity of the opened file.
  FileIdentity open_unprobed(const std::string& path);
  std::vector<std::string> walk_metadata();
  int64_t file_ = -1;  // hid_t
  std::string path_;
};

}  // namespace kiln::io
