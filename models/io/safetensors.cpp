// Safetensors reader/writer/index. See safetensors.h for the format. The reader
// never trusts a number from the file until it has been range- and
// overflow-checked against the mapped size.
#include "models/io/safetensors.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "kernels/common/error.h"
#include "models/io/json_limits.h"

namespace kiln::io {

static_assert(std::endian::native == std::endian::little, "kiln assumes a little-endian host");

using nlohmann::json;
namespace fs = std::filesystem;

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// Reads a non-negative integer that fits in int64 from a JSON value.
bool json_to_u64(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

std::string describe_json(const json& v) { return json_excerpt(v, 60); }

}  // namespace

// ---- reader -----------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const uint64_t fsize = file_.size();
  const std::string& p = file_.path();
  KILN_CHECK(fsize >= 8,
             "[safetensors] {}: file is {} bytes, too small to hold the 8-byte header length", p,
             fsize);
  uint64_t n = 0;
  std::memcpy(&n, file_.data(), 8);  // little-endian u64 (host checked above)
  KILN_CHECK(n <= fsize - 8, "[safetensors] {}: header length {} exceeds file size {}", p, n,
             fsize);
  KILN_CHECK(n <= kSafetensorsMaxHeader,
             "[safetensors] {}: header length {} exceeds the {}-byte limit", p, n,
             kSafetensorsMaxHeader);
  KILN_CHECK(n >= 2, "[safetensors] {}: header length {} is too small for a JSON object", p, n);
  data_offset_ = 8 + n;
  const uint64_t data_size = fsize - data_offset_;

  const char* hdr = reinterpret_cast<const char*>(file_.data() + 8);
  KILN_CHECK(hdr[0] == '{', "[safetensors] {}: header does not start with '{{'", p);
  const json j =
      parse_json_limited(std::string_view(hdr, n), fmt::format("safetensors header of {}", p),
                         {.max_bytes = kSafetensorsMaxHeader});
  KILN_CHECK(j.is_object(), "[safetensors] {}: header is not a JSON object", p);

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      KILN_CHECK(v.is_object(), "[safetensors] {}: __metadata__ is not an object", p);
      for (auto m = v.begin(); m != v.end(); ++m) {
        KILN_CHECK(m.value().is_string(),
                   "[safetensors] {}: __metadata__ value for '{}' is not a string", p, m.key());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    KILN_CHECK(v.is_object(), "[safetensors] {}: entry '{}' is not an object", p, name);
    KILN_CHECK(v.contains("dtype") && v["dtype"].is_string(),
               "[safetensors] {}: entry '{}' has no dtype string", p, name);
    KILN_CHECK(v.contains("shape") && v["shape"].is_array(),
               "[safetensors] {}: entry '{}' has no shape array", p, name);
    KILN_CHECK(
        v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
        "[safetensors] {}: entry '{}' needs data_offsets [begin, end]", p, name);
    TensorEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    auto esize = try_dtype_size(e.dtype);
    KILN_CHECK(esize.has_value(), "[safetensors] {}: entry '{}' has unknown dtype '{}'", p, name,
               e.dtype);

    uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      uint64_t dim = 0;
      KILN_CHECK(
          json_to_u64(d, &dim),
          "[safetensors] {}: entry '{}' has shape dimension {} that is not a non-negative integer",
          p, name, describe_json(d));
      KILN_CHECK(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "[safetensors] {}: entry '{}' has shape dimension {} that is too large", p, name,
                 dim);
      KILN_CHECK(checked_mul(numel, dim, &numel) &&
                     numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "[safetensors] {}: entry '{}' shape {} overflows the element count", p, name,
                 describe_json(v["shape"]));
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    KILN_CHECK(checked_mul(numel, *esize, &nbytes),
               "[safetensors] {}: entry '{}' shape {} overflows the byte count", p, name,
               describe_json(v["shape"]));

    const json& offs = v["data_offsets"];
    KILN_CHECK(
        json_to_u64(offs[0], &e.begin) && json_to_u64(offs[1], &e.end),
        "[safetensors] {}: entry '{}' has data_offsets {} that are not non-negative integers", p,
        name, describe_json(offs));
    KILN_CHECK(e.begin <= e.end, "[safetensors] {}: entry '{}' has data_offsets begin {} > end {}",
               p, name, e.begin, e.end);
    KILN_CHECK(
        e.end <= data_size,
        "[safetensors] {}: entry '{}' has data_offsets end {} past the end of the data section "
        "({} bytes)",
        p, name, e.end, data_size);
    KILN_CHECK(
        e.end - e.begin == nbytes,
        "[safetensors] {}: entry '{}' spans {} bytes but shape {} x {} ({} bytes each) needs {}", p,
        name, e.end - e.begin, describe_json(v["shape"]), e.dtype, *esize, nbytes);
    entries_.push_back(std::move(e));
  }

  // The entries must tile the data section: sorted by offset, each begins where
  // the previous one ended, the first at 0 and the last at the end.
  std::vector<const TensorEntry*> by_off;
  for (const auto& e : entries_) by_off.push_back(&e);
  std::sort(by_off.begin(), by_off.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry* e : by_off) {
    if (e->begin < pos)
      fail("[safetensors] {}: entry '{}' (bytes {}..{}) overlaps '{}' (bytes {}..{})", p, e->name,
           e->begin, e->end, prev->name, prev->begin, prev->end);
    if (e->begin > pos) {
      if (prev)
        fail("[safetensors] {}: gap of {} bytes between '{}' (ends at {}) and '{}' (begins at {})",
             p, e->begin - pos, prev->name, pos, e->name, e->begin);
      fail("[safetensors] {}: gap of {} bytes before the first entry '{}'", p, e->begin, e->name);
    }
    pos = e->end;
    prev = e;
  }
  KILN_CHECK(pos == data_size,
             "[safetensors] {}: entries cover {} bytes but the data section has {} (trailing gap)",
             p, pos, data_size);

  // nlohmann::json keeps object keys sorted, so entries_ is sorted by name.
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const TensorEntry& SafetensorsFile::at(std::string_view name) const {
  const TensorEntry* e = find(name);
  KILN_CHECK(e, "[safetensors] {}: no tensor named '{}'", path(), name);
  return *e;
}

const uint8_t* SafetensorsFile::data(const TensorEntry& e) const {
  return file_.data() + data_offset_ + e.begin;
}

// ---- writer -----------------------------------------------------------------

void SafetensorsWriter::add(std::string name, std::string dtype, std::vector<int64_t> shape,
                            const void* data, uint64_t nbytes) {
  KILN_CHECK(!name.empty(), "[safetensors] writer: empty tensor name");
  KILN_CHECK(name != "__metadata__", "[safetensors] writer: '__metadata__' is reserved");
  KILN_CHECK(!names_.count(name), "[safetensors] writer: duplicate tensor name '{}'", name);
  auto esize = try_dtype_size(dtype);
  KILN_CHECK(esize.has_value(), "[safetensors] writer: tensor '{}' has unknown dtype '{}'", name,
             dtype);
  uint64_t numel = 1;
  for (int64_t d : shape) {
    KILN_CHECK(d >= 0, "[safetensors] writer: tensor '{}' has negative dimension {}", name, d);
    KILN_CHECK(checked_mul(numel, static_cast<uint64_t>(d), &numel),
               "[safetensors] writer: tensor '{}' shape overflows", name);
  }
  uint64_t expect = 0;
  KILN_CHECK(checked_mul(numel, *esize, &expect),
             "[safetensors] writer: tensor '{}' shape overflows", name);
  KILN_CHECK(expect == nbytes,
             "[safetensors] writer: tensor '{}' of shape {} x {} needs {} bytes, got {}", name,
             fmt::join(shape, "x"), dtype, expect, nbytes);
  KILN_CHECK(data != nullptr || nbytes == 0, "[safetensors] writer: tensor '{}' has null data",
             name);
  KILN_CHECK(checked_add(total_bytes_, nbytes, &total_bytes_),
             "[safetensors] writer: total size overflows");
  TensorEntry e;
  e.name = std::move(name);
  e.dtype = std::move(dtype);
  e.shape = std::move(shape);
  e.end = nbytes;  // begin/end are assigned in write()
  names_.emplace(e.name, tensors_.size());
  tensors_.push_back({std::move(e), data});
}

void SafetensorsWriter::write(const std::string& path, const Metadata& metadata) const {
  // Largest elements first, then by name: with an 8-aligned data section every
  // tensor then starts at a multiple of its element size.
  std::vector<const Pending*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const Pending* a, const Pending* b) {
    size_t sa = dtype_size(a->entry.dtype), sb = dtype_size(b->entry.dtype);
    return sa != sb ? sa > sb : a->entry.name < b->entry.name;
  });
  json hdr = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    hdr["__metadata__"] = m;
  }
  uint64_t off = 0;
  std::vector<ByteChunk> chunks;
  chunks.reserve(order.size() + 2);
  for (const Pending* t : order) {
    uint64_t nb = t->entry.end;
    hdr[t->entry.name] = {
        {"dtype", t->entry.dtype}, {"shape", t->entry.shape}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string text = hdr.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  uint8_t len_bytes[8];
  std::memcpy(len_bytes, &n, 8);
  chunks.push_back({len_bytes, 8});
  chunks.push_back({text.data(), text.size()});
  for (const Pending* t : order)
    if (t->entry.end > 0) chunks.push_back({t->data, static_cast<size_t>(t->entry.end)});
  write_file_atomically(path, chunks);
}

// ---- sharded index ------------------------------------------------------------

namespace {

// A shard name must be a plain relative path with no ".." that stays in the folder.
void check_shard_name(const std::string& index_path, const std::string& tensor,
                      const std::string& file) {
  KILN_CHECK(!file.empty(), "[safetensors] {}: tensor '{}' maps to an empty shard name", index_path,
             tensor);
  fs::path fp(file);
  KILN_CHECK(fp.is_relative() && !fp.has_root_name() && !fp.has_root_directory(),
             "[safetensors] {}: shard '{}' for tensor '{}' is not a relative path", index_path,
             file, tensor);
  for (const auto& part : fp)
    KILN_CHECK(part != "..", "[safetensors] {}: shard '{}' for tensor '{}' leaves the model folder",
               index_path, file, tensor);
  KILN_CHECK(file.find('\0') == std::string::npos, "[safetensors] {}: shard name contains NUL",
             index_path);
}

}  // namespace

SafetensorsIndex::SafetensorsIndex(const std::string& index_path) : index_path_(index_path) {
  fs::path ip(index_path);
  dir_ = ip.parent_path().empty() ? std::string(".") : ip.parent_path().string();
  MappedFile f(index_path);
  KILN_CHECK(f.size() <= kSafetensorsMaxHeader,
             "[safetensors] {}: index file of {} bytes is too large", index_path, f.size());
  const char* b = reinterpret_cast<const char*>(f.data());
  const json j = parse_json_limited(std::string_view(b, f.size()),
                                    fmt::format("safetensors index {}", index_path),
                                    {.max_bytes = kSafetensorsMaxHeader});
  KILN_CHECK(j.is_object(), "[safetensors] {}: index is not a JSON object", index_path);
  KILN_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
             "[safetensors] {}: index has no weight_map object", index_path);
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    KILN_CHECK(it.value().is_string(),
               "[safetensors] {}: weight_map value for '{}' is not a string", index_path, it.key());
    std::string file = it.value().get<std::string>();
    check_shard_name(index_path, it.key(), file);
    weight_map_.emplace(it.key(), std::move(file));
  }
  if (j.contains("metadata")) {
    KILN_CHECK(j["metadata"].is_object(), "[safetensors] {}: index metadata is not an object",
               index_path);
    for (auto it = j["metadata"].begin(); it != j["metadata"].end(); ++it)
      metadata_[it.key()] =
          it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
  }
}

SafetensorsIndex SafetensorsIndex::open_dir(const std::string& dir) {
  fs::path d(dir);
  if (fs::exists(d / "model.safetensors.index.json"))
    return SafetensorsIndex((d / "model.safetensors.index.json").string());
  fs::path single = d / "model.safetensors";
  KILN_CHECK(fs::exists(single),
             "[safetensors] {}: neither model.safetensors.index.json nor model.safetensors found",
             dir);
  SafetensorsIndex idx;
  idx.dir_ = dir;
  idx.index_path_ = single.string();
  auto file = std::make_unique<SafetensorsFile>(single.string());
  for (const auto& e : file->entries()) idx.weight_map_.emplace(e.name, "model.safetensors");
  idx.metadata_ = file->metadata();
  idx.shards_.emplace("model.safetensors", std::move(file));
  return idx;
}

const SafetensorsFile& SafetensorsIndex::shard(const std::string& file) const {
  std::lock_guard<std::mutex> lock(*mu_);
  auto it = shards_.find(file);
  if (it == shards_.end())
    it = shards_.emplace(file, std::make_unique<SafetensorsFile>((fs::path(dir_) / file).string()))
             .first;
  return *it->second;
}

std::optional<SafetensorsIndex::Found> SafetensorsIndex::find(std::string_view name) const {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) return std::nullopt;
  const SafetensorsFile& f = shard(it->second);
  const TensorEntry* e = f.find(name);
  KILN_CHECK(e, "[safetensors] {}: index maps '{}' to shard {}, which does not contain it",
             index_path_, name, it->second);
  return Found{&f, e};
}

SafetensorsIndex::Found SafetensorsIndex::at(std::string_view name) const {
  auto f = find(name);
  KILN_CHECK(f.has_value(), "[safetensors] {}: no tensor named '{}' in the weight map", index_path_,
             name);
  return *f;
}

std::vector<std::string> SafetensorsIndex::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : weight_map_) out.push_back(k);
  return out;
}

std::vector<std::string> SafetensorsIndex::shard_files() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : weight_map_) out.push_back(v);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

size_t SafetensorsIndex::shards_open() const {
  std::lock_guard<std::mutex> lock(*mu_);
  return shards_.size();
}

void write_safetensors_index(const std::string& path, const Metadata& metadata,
                             const std::map<std::string, std::string>& weight_map) {
  json j = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (const auto& [k, v] : metadata) j["metadata"][k] = v;
  for (const auto& [k, v] : weight_map) {
    check_shard_name(path, k, v);
    j["weight_map"][k] = v;
  }
  std::string text = j.dump(2) + "\n";
  ByteChunk c{text.data(), text.size()};
  write_file_atomically(path, std::span<const ByteChunk>(&c, 1));
}

}  // namespace kiln::io
