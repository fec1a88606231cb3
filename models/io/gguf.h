// GGUF (llama.cpp's model file, versions 2 and 3): reading, validated, and writing.
//
// File layout (little-endian throughout):
//   u32 magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x     { string key | u32 value type | value }
//   tensor_count x { string name | u32 n_dims (1..4) | u64 dims[n_dims], innermost first |
//                    u32 ggml type | u64 offset (from the data section, a multiple of the
//                    alignment) }
//   padding to `general.alignment` (u32, default 32) | data section
// string: u64 length | bytes (no terminator). array: u32 element type | u64 count | elements.
//
// Every number read is checked against the file before it sizes or places anything, and each
// bug class that peers' loaders have had is refused by name ("[gguf] <path>: ..."): integer
// overflow in size products, n_dims > 4, offsets past the end of the file, overlapping tensors,
// string and array lengths larger than the file, unknown (or nested) array element types, and an
// alignment that is not a power of two in [8, 65536]. Also refused: unknown value and tensor
// types, duplicate keys and tensor names, zero-sized dims, a quantized row that is not whole
// blocks, and big-endian files.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/io/mapped_file.h"

namespace kiln::io {

// GGUF's metadata value types (gguf.md).
enum class GgufType : std::uint32_t {
  Uint8 = 0,
  Int8 = 1,
  Uint16 = 2,
  Int16 = 3,
  Uint32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  Uint64 = 10,
  Int64 = 11,
  Float64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// A metadata value: its GGUF type (for an array, also its element type) and its value as JSON
// (numbers, bools, strings, or an array of them), so that a writer keeps the exact type.
struct GgufValue {
  GgufType type = GgufType::Uint32;
  GgufType elem = GgufType::Uint8;  // arrays only
  nlohmann::json value;
};
using GgufMetadata = std::map<std::string, GgufValue, std::less<>>;

// The ggml tensor types kiln knows: the element (or block) layout of each.
struct GgmlTypeInfo {
  std::uint32_t id;
  std::string_view name;
  std::int64_t block_size;   // elements per block (1 for plain types)
  std::int64_t block_bytes;  // bytes per block
};
// nullptr for an id kiln does not know.
const GgmlTypeInfo* ggml_type_info(std::uint32_t id);
const GgmlTypeInfo* ggml_type_by_name(std::string_view name);  // "f32", "q8_0", ...

struct GgufTensor {
  std::string name;
  std::vector<std::int64_t> dims;  // GGUF order: innermost (contiguous) first
  std::uint32_t type = 0;
  std::uint64_t offset = 0;  // in the data section
  std::uint64_t nbytes = 0;
  // Row-major shape, outermost first (dims reversed), as kiln and PyTorch write it.
  std::vector<std::int64_t> shape() const { return {dims.rbegin(), dims.rend()}; }
  std::int64_t numel() const;
};

// Largest counts and lengths accepted, before the file-size checks: sanity bounds, far above
// any real model (Qwen3's vocabulary is 151,936 strings).
inline constexpr std::uint64_t kGgufMaxTensors = 1u << 20;
inline constexpr std::uint64_t kGgufMaxKeys = 1u << 20;
inline constexpr std::uint64_t kGgufMaxStringBytes = 1u << 30;
inline constexpr std::uint64_t kGgufMaxKeyBytes = 65535;  // gguf.md: keys are at most 2^16 - 1
// Metadata arrays become JSON values (16+ bytes each), so their elements are capped, per array
// and in all: far above a real vocabulary, far below what a crafted file could ask for.
inline constexpr std::uint64_t kGgufMaxArrayElements = 1u << 24;
inline constexpr std::uint64_t kGgufMaxMetadataElements = 1u << 26;

// A name or value from a file, for a message: non-printable bytes escaped (\xNN), cut to about
// `max` bytes. Untrusted text never reaches a terminal raw or unbounded.
std::string gguf_printable(std::string_view s, std::size_t max = 80);
// A metadata value for a message: strings as gguf_printable, anything else as JSON, cut.
std::string gguf_shown(const nlohmann::json& v);

class GgufFile {
 public:
  // Maps and validates `path`; throws kiln::Error "[gguf] <path>: ..." on bad input.
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }
  const GgufMetadata& metadata() const { return metadata_; }
  // Tensors in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find(std::string_view name) const;
  // The tensor's first byte inside the mapping (valid while this object lives).
  const std::uint8_t* data(const GgufTensor& t) const;

  // A metadata value by key, checked for its type: "[gguf] <path>: qwen3.block_count is i32,
  // expected u32 or i32 or ...". nullopt when absent.
  std::optional<std::int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;

 private:
  void parse();
  MappedFile file_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  GgufMetadata metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

// Writes a GGUF v3 file atomically. Tensors are laid out in the order added, each at a multiple
// of `general.alignment` (from the metadata, else 32). `data` is NOT copied: it must stay valid
// until write(). nbytes must match dims and type.
class GgufWriter {
 public:
  void add_tensor(std::string name, std::vector<std::int64_t> dims, std::uint32_t type,
                  const void* data, std::uint64_t nbytes);
  // The same, with the bytes made by fill(out) only when write() reaches the tensor: one
  // tensor's bytes in memory at a time.
  void add_tensor(std::string name, std::vector<std::int64_t> dims, std::uint32_t type,
                  std::uint64_t nbytes, std::function<void(std::uint8_t*)> fill);
  void write(const std::string& path, const GgufMetadata& metadata) const;

 private:
  struct Pending {
    GgufTensor info;
    const void* data;
    std::function<void(std::uint8_t*)> fill;
  };
  std::vector<Pending> tensors_;
};

}  // namespace kiln::io
