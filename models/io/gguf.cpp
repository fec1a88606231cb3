#include "models/io/gguf.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "kernels/common/error.h"

namespace kiln::io {

namespace {

static_assert(std::endian::native == std::endian::little,
              "[gguf] kiln reads GGUF on little-endian hosts");

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr std::uint64_t kMaxTensorName = 64;  // ggml's GGML_MAX_NAME
constexpr std::uint64_t kDefaultAlignment = 32;

// ggml's types (ggml.h), with llama.cpp's block layouts (ggml-common.h).
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "f32", 1, 4},       {1, "f16", 1, 2},       {2, "q4_0", 32, 18},    {3, "q4_1", 32, 20},
    {6, "q5_0", 32, 22},    {7, "q5_1", 32, 24},    {8, "q8_0", 32, 34},    {9, "q8_1", 32, 36},
    {10, "q2_k", 256, 84},  {11, "q3_k", 256, 110}, {12, "q4_k", 256, 144}, {13, "q5_k", 256, 176},
    {14, "q6_k", 256, 210}, {15, "q8_k", 256, 292}, {24, "i8", 1, 1},       {25, "i16", 1, 2},
    {26, "i32", 1, 4},      {27, "i64", 1, 8},      {28, "f64", 1, 8},      {30, "bf16", 1, 2},
};

// Bytes of a scalar value type; 0 for string and array.
std::uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::Uint8:
    case GgufType::Int8:
    case GgufType::Bool:
      return 1;
    case GgufType::Uint16:
    case GgufType::Int16:
      return 2;
    case GgufType::Uint32:
    case GgufType::Int32:
    case GgufType::Float32:
      return 4;
    case GgufType::Uint64:
    case GgufType::Int64:
    case GgufType::Float64:
      return 8;
    case GgufType::String:
    case GgufType::Array:
      return 0;
  }
  return 0;
}

bool known_type(std::uint32_t t) { return t <= static_cast<std::uint32_t>(GgufType::Float64); }

// A bounds-checked little-endian reader over the mapping.
class Cursor {
 public:
  Cursor(const std::uint8_t* data, std::uint64_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("[gguf] {}: {} (at byte {} of {})", path_, what, pos_, size_));
  }
  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return size_ - pos_; }

  void need(std::uint64_t n, std::string_view what) {
    if (n > left())
      fail(fmt::format("{} needs {} bytes but the file has {} left", what, n, left()));
  }
  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A string of at most `max_len` bytes: the length is checked before anything is copied.
  std::string read_string(std::string_view what, std::uint64_t max_len = kGgufMaxStringBytes) {
    const auto n = read<std::uint64_t>(what);
    if (n > max_len && n <= left())
      fail(fmt::format("{}: string length {} is longer than the {} bytes allowed", what, n,
                       max_len));
    if (n > kGgufMaxStringBytes || n > left())
      fail(fmt::format("{}: string length {} is larger than the file's {} bytes left", what, n,
                       left()));
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const std::uint8_t* data_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  const std::string& path_;
};

nlohmann::json read_scalar(Cursor& c, GgufType t, std::string_view what) {
  switch (t) {
    case GgufType::Uint8:
      return c.read<std::uint8_t>(what);
    case GgufType::Int8:
      return c.read<std::int8_t>(what);
    case GgufType::Uint16:
      return c.read<std::uint16_t>(what);
    case GgufType::Int16:
      return c.read<std::int16_t>(what);
    case GgufType::Uint32:
      return c.read<std::uint32_t>(what);
    case GgufType::Int32:
      return c.read<std::int32_t>(what);
    case GgufType::Float32:
      return c.read<float>(what);
    case GgufType::Bool: {
      const auto b = c.read<std::uint8_t>(what);
      if (b > 1) c.fail(fmt::format("{}: bool value {} is neither 0 nor 1", what, b));
      return b == 1;
    }
    case GgufType::String:
      return c.read_string(what);
    case GgufType::Uint64:
      return c.read<std::uint64_t>(what);
    case GgufType::Int64:
      return c.read<std::int64_t>(what);
    case GgufType::Float64:
      return c.read<double>(what);
    case GgufType::Array:
      break;
  }
  c.fail(fmt::format("{}: an array inside an array is not supported", what));
}

// `elements`: the array elements read so far in the whole file (kGgufMaxMetadataElements).
GgufValue read_value(Cursor& c, const std::string& raw_key, std::uint64_t& elements) {
  const std::string key = gguf_printable(raw_key);
  GgufValue v;
  const auto t = c.read<std::uint32_t>(key);
  if (!known_type(t)) c.fail(fmt::format("{}: unknown value type {}", key, t));
  v.type = static_cast<GgufType>(t);
  if (v.type != GgufType::Array) {
    v.value = read_scalar(c, v.type, key);
    return v;
  }
  const auto e = c.read<std::uint32_t>(key);
  if (!known_type(e) || static_cast<GgufType>(e) == GgufType::Array)
    c.fail(fmt::format("{}: array element type {} is {}", key, e,
                       known_type(e) ? "an array (nested arrays are not supported)" : "unknown"));
  v.elem = static_cast<GgufType>(e);
  const auto n = c.read<std::uint64_t>(key);
  // Each element takes at least its scalar size, or 8 bytes (the length) for a string.
  const std::uint64_t least = v.elem == GgufType::String ? 8 : scalar_size(v.elem);
  std::uint64_t bytes = 0;
  if (!checked_mul(n, least, &bytes) || bytes > c.left())
    c.fail(fmt::format("{}: array of {} {} is larger than the file's {} bytes left", key, n,
                       gguf_type_name(v.elem), c.left()));
  if (n > kGgufMaxArrayElements || n > kGgufMaxMetadataElements - elements)
    c.fail(
        fmt::format("{}: array of {} elements is more than kiln reads ({} per array, {} in all "
                    "the metadata)",
                    key, n, kGgufMaxArrayElements, kGgufMaxMetadataElements));
  elements += n;
  v.value = nlohmann::json::array();
  v.value.get_ref<nlohmann::json::array_t&>().reserve(n);
  for (std::uint64_t i = 0; i < n; ++i) v.value.push_back(read_scalar(c, v.elem, key));
  return v;
}

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

// A metadata value's integer, or nullopt when it is not an integer type.
bool is_int_type(GgufType t) {
  return t != GgufType::Float32 && t != GgufType::Float64 && t != GgufType::Bool &&
         t != GgufType::String && t != GgufType::Array;
}

}  // namespace

std::string gguf_printable(std::string_view s, std::size_t max) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max) {
      out += fmt::format("... ({} bytes)", s.size());
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

std::string gguf_shown(const nlohmann::json& v) {
  if (v.is_string()) return gguf_printable(v.get_ref<const std::string&>());
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  return s.size() > 120 ? s.substr(0, 117) + "..." : s;
}

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view names[] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                               "i32", "f32", "bool", "string", "array",
                                               "u64", "i64", "f64"};
  const auto i = static_cast<std::uint32_t>(t);
  return i < std::size(names) ? names[i] : "?";
}

const GgmlTypeInfo* ggml_type_info(std::uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (t.id == id) return &t;
  return nullptr;
}

const GgmlTypeInfo* ggml_type_by_name(std::string_view name) {
  for (const auto& t : kGgmlTypes)
    if (t.name == name) return &t;
  return nullptr;
}

std::int64_t GgufTensor::numel() const {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

GgufFile::GgufFile(const std::string& path) : file_(path) {
  try {
    parse();
  } catch (const std::bad_alloc&) {
    fail("[gguf] {}: out of memory while reading the metadata", file_.path());
  }
}

void GgufFile::parse() {
  Cursor c(file_.data(), file_.size(), file_.path());
  const auto magic = c.read<std::uint32_t>("the magic");
  if (magic != kMagic) c.fail(fmt::format("not a GGUF file (magic {:#010x})", magic));
  version_ = c.read<std::uint32_t>("the version");
  if (version_ == 0x03000000 || version_ == 0x02000000)
    c.fail("a big-endian GGUF file; kiln reads little-endian ones");
  if (version_ != 2 && version_ != 3)
    c.fail(fmt::format("GGUF version {} is not supported (kiln reads 2 and 3)", version_));
  const auto n_tensors = c.read<std::uint64_t>("the tensor count");
  const auto n_kv = c.read<std::uint64_t>("the metadata count");
  // A key takes at least 12 bytes (length and type), a tensor info at least 28.
  if (n_kv > kGgufMaxKeys || n_kv > c.left() / 12)
    c.fail(
        fmt::format("{} metadata entries cannot fit in the file's {} bytes left", n_kv, c.left()));
  if (n_tensors > kGgufMaxTensors || n_tensors > c.left() / 28)
    c.fail(fmt::format("{} tensors cannot fit in the file's {} bytes left", n_tensors, c.left()));

  std::uint64_t elements = 0;
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("a metadata key", kGgufMaxKeyBytes);
    if (metadata_.count(key))
      c.fail(fmt::format("metadata key {} appears twice", gguf_printable(key)));
    GgufValue v = read_value(c, key, elements);
    metadata_.emplace(std::move(key), std::move(v));
  }
  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) {
    const GgufValue& a = it->second;
    if (a.type != GgufType::Uint32)
      c.fail(fmt::format("general.alignment is {}, expected u32", gguf_type_name(a.type)));
    alignment_ = a.value.get<std::uint64_t>();
    if (alignment_ < 8 || alignment_ > 65536 || !std::has_single_bit(alignment_))
      c.fail(fmt::format("general.alignment {} is not a power of two in [8, 65536]", alignment_));
  }

  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.read_string("a tensor name", kMaxTensorName);
    const std::string name = gguf_printable(t.name);  // for messages
    if (index_.count(t.name)) c.fail(fmt::format("tensor {} appears twice", name));
    const auto n_dims = c.read<std::uint32_t>(name);
    if (n_dims < 1 || n_dims > 4)
      c.fail(fmt::format("tensor {} has {} dims; GGUF allows 1 to 4", name, n_dims));
    std::uint64_t numel = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = c.read<std::uint64_t>(name);
      if (dim == 0 || dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        c.fail(fmt::format("tensor {} has dim {} of size {}", name, d, dim));
      if (!checked_mul(numel, dim, &numel) ||
          numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        c.fail(fmt::format("tensor {}: the element count overflows", name));
      t.dims.push_back(static_cast<std::int64_t>(dim));
    }
    t.type = c.read<std::uint32_t>(name);
    const GgmlTypeInfo* info = ggml_type_info(t.type);
    if (!info) c.fail(fmt::format("tensor {} has unknown ggml type {}", name, t.type));
    if (t.dims[0] % info->block_size != 0)
      c.fail(fmt::format("tensor {}: rows of {} are not whole {} blocks of {}", name, t.dims[0],
                         info->name, info->block_size));
    if (!checked_mul(numel / static_cast<std::uint64_t>(info->block_size),
                     static_cast<std::uint64_t>(info->block_bytes), &t.nbytes))
      c.fail(fmt::format("tensor {}: the byte size overflows", name));
    t.offset = c.read<std::uint64_t>(name);
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  data_offset_ = align_up(c.pos(), alignment_);
  // The data section starts after the padding, inside the file (a file of no tensors may end
  // with its metadata).
  if (!tensors_.empty() && data_offset_ > file_.size())
    c.fail(fmt::format("the data section would start at {}, past the end", data_offset_));
  std::vector<const GgufTensor*> by_offset;
  for (const GgufTensor& t : tensors_) {
    if (t.offset % alignment_ != 0)
      c.fail(fmt::format("tensor {} at offset {} is not aligned to {}", gguf_printable(t.name),
                         t.offset, alignment_));
    std::uint64_t begin = 0, end = 0;
    if (!checked_add(data_offset_, t.offset, &begin) || !checked_add(begin, t.nbytes, &end) ||
        end > file_.size())
      c.fail(fmt::format("tensor {} ({} bytes at data offset {}) runs past the end of the file",
                         gguf_printable(t.name), t.nbytes, t.offset));
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& a = *by_offset[i - 1];
    const GgufTensor& b = *by_offset[i];
    if (a.offset + a.nbytes > b.offset)
      c.fail(
          fmt::format("tensors {} and {} overlap", gguf_printable(a.name), gguf_printable(b.name)));
  }
}

const GgufTensor* GgufFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const std::uint8_t* GgufFile::data(const GgufTensor& t) const {
  return file_.data() + data_offset_ + t.offset;
}

std::optional<std::int64_t> GgufFile::get_int(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  const GgufValue& v = it->second;
  KILN_CHECK(is_int_type(v.type), "[gguf] {}: {} is {}, expected an integer", path(), key,
             gguf_type_name(v.type));
  if (v.type == GgufType::Uint64) {
    const auto u = v.value.get<std::uint64_t>();
    KILN_CHECK(u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
               "[gguf] {}: {} = {} does not fit in an int64", path(), key, u);
    return static_cast<std::int64_t>(u);
  }
  return v.value.get<std::int64_t>();
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  const GgufValue& v = it->second;
  KILN_CHECK(v.type == GgufType::Float32 || v.type == GgufType::Float64 || is_int_type(v.type),
             "[gguf] {}: {} is {}, expected a number", path(), key, gguf_type_name(v.type));
  return v.value.get<double>();
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  const GgufValue& v = it->second;
  KILN_CHECK(v.type == GgufType::String, "[gguf] {}: {} is {}, expected a string", path(), key,
             gguf_type_name(v.type));
  return v.value.get<std::string>();
}

// ---- writing --------------------------------------------------------------------------------

namespace {

class Bytes {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void pad_to(std::uint64_t a) { out_.resize(align_up(out_.size(), a), 0); }
  std::vector<std::uint8_t>& bytes() { return out_; }

 private:
  std::vector<std::uint8_t> out_;
};

void put_scalar(Bytes& b, GgufType t, const nlohmann::json& v, std::string_view key) {
  try {
    switch (t) {
      case GgufType::Uint8:
        return b.put(v.get<std::uint8_t>());
      case GgufType::Int8:
        return b.put(v.get<std::int8_t>());
      case GgufType::Uint16:
        return b.put(v.get<std::uint16_t>());
      case GgufType::Int16:
        return b.put(v.get<std::int16_t>());
      case GgufType::Uint32:
        return b.put(v.get<std::uint32_t>());
      case GgufType::Int32:
        return b.put(v.get<std::int32_t>());
      case GgufType::Float32:
        return b.put(v.get<float>());
      case GgufType::Bool:
        return b.put(static_cast<std::uint8_t>(v.get<bool>() ? 1 : 0));
      case GgufType::String:
        return b.put_string(v.get<std::string>());
      case GgufType::Uint64:
        return b.put(v.get<std::uint64_t>());
      case GgufType::Int64:
        return b.put(v.get<std::int64_t>());
      case GgufType::Float64:
        return b.put(v.get<double>());
      case GgufType::Array:
        break;
    }
  } catch (const nlohmann::json::exception& e) {
    fail("[gguf] writing {}: {} is not a {} ({})", key, gguf_shown(v), gguf_type_name(t), e.what());
  }
  fail("[gguf] writing {}: nested arrays are not supported", key);
}

}  // namespace

void GgufWriter::add_tensor(std::string name, std::vector<std::int64_t> dims, std::uint32_t type,
                            const void* data, std::uint64_t nbytes) {
  KILN_CHECK(data != nullptr || nbytes == 0, "[gguf] writing {}: no bytes given", name);
  add_tensor(std::move(name), std::move(dims), type, nbytes, {});
  tensors_.back().data = data;
}

void GgufWriter::add_tensor(std::string name, std::vector<std::int64_t> dims, std::uint32_t type,
                            std::uint64_t nbytes, std::function<void(std::uint8_t*)> fill) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  KILN_CHECK(info, "[gguf] writing {}: unknown ggml type {}", name, type);
  KILN_CHECK(!dims.empty() && dims.size() <= 4, "[gguf] writing {}: {} dims (1 to 4)", name,
             dims.size());
  KILN_CHECK(name.size() <= kMaxTensorName, "[gguf] writing {}: name longer than {} bytes", name,
             kMaxTensorName);
  for (const Pending& p : tensors_)
    KILN_CHECK(p.info.name != name, "[gguf] writing {}: added twice", name);
  GgufTensor t;
  t.name = std::move(name);
  t.dims = std::move(dims);
  t.type = type;
  for (auto d : t.dims) KILN_CHECK(d > 0, "[gguf] writing {}: dim of size {}", t.name, d);
  KILN_CHECK(t.dims[0] % info->block_size == 0,
             "[gguf] writing {}: rows of {} are not whole {} blocks", t.name, t.dims[0],
             info->name);
  t.nbytes = static_cast<std::uint64_t>(t.numel() / info->block_size * info->block_bytes);
  KILN_CHECK(t.nbytes == nbytes, "[gguf] writing {}: {} bytes given, {} {} elements take {}",
             t.name, nbytes, t.numel(), info->name, t.nbytes);
  tensors_.push_back({std::move(t), nullptr, std::move(fill)});
}

void GgufWriter::write(const std::string& path, const GgufMetadata& metadata) const {
  std::uint64_t alignment = kDefaultAlignment;
  if (auto it = metadata.find("general.alignment"); it != metadata.end()) {
    KILN_CHECK(it->second.type == GgufType::Uint32,
               "[gguf] writing: general.alignment must be u32");
    alignment = it->second.value.get<std::uint64_t>();
    KILN_CHECK(alignment >= 8 && alignment <= 65536 && std::has_single_bit(alignment),
               "[gguf] writing: general.alignment {} is not a power of two in [8, 65536]",
               alignment);
  }
  Bytes b;
  b.put<std::uint32_t>(kMagic);
  b.put<std::uint32_t>(3);
  b.put<std::uint64_t>(tensors_.size());
  b.put<std::uint64_t>(metadata.size());
  for (const auto& [key, v] : metadata) {
    b.put_string(key);
    b.put<std::uint32_t>(static_cast<std::uint32_t>(v.type));
    if (v.type != GgufType::Array) {
      put_scalar(b, v.type, v.value, key);
      continue;
    }
    KILN_CHECK(v.value.is_array(), "[gguf] writing {}: an array value must be a JSON array", key);
    b.put<std::uint32_t>(static_cast<std::uint32_t>(v.elem));
    b.put<std::uint64_t>(v.value.size());
    for (const auto& e : v.value) put_scalar(b, v.elem, e, key);
  }
  std::uint64_t offset = 0;
  for (const Pending& p : tensors_) {
    b.put_string(p.info.name);
    b.put<std::uint32_t>(static_cast<std::uint32_t>(p.info.dims.size()));
    for (auto d : p.info.dims) b.put<std::uint64_t>(static_cast<std::uint64_t>(d));
    b.put<std::uint32_t>(p.info.type);
    b.put<std::uint64_t>(offset);
    offset = align_up(offset + p.info.nbytes, alignment);
  }
  b.pad_to(alignment);
  static const std::vector<std::uint8_t> zeros(65536, 0);
  std::vector<ByteChunk> chunks{{b.bytes().data(), b.bytes().size()}};
  for (const Pending& p : tensors_) {
    chunks.push_back({p.data, p.info.nbytes, p.fill});
    const std::uint64_t pad = align_up(p.info.nbytes, alignment) - p.info.nbytes;
    if (pad) chunks.push_back({zeros.data(), pad});
  }
  write_file_atomically(path, chunks);
}

}  // namespace kiln::io
