#include "models/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "tensor/host_bytes.h"

namespace kiln::models {

namespace fs = std::filesystem;

Tensor tensor_from_bytes(std::string_view st_dtype, const Shape& shape, const void* data,
                         std::size_t nbytes, std::string_view source) {
  DType dt = dtype_from_safetensors(st_dtype);
  KILN_CHECK(io::dtype_size(st_dtype) == dtype_size(dt), "[weights] dtype {} cannot be held as {}",
             st_dtype, dtype_name(dt));
  for (auto d : shape) KILN_CHECK(d >= 0, "[weights] negative dim in shape {}", shape_str(shape));
  std::int64_t n = shape_numel(shape);  // overflow-checked
  KILN_CHECK(static_cast<std::uint64_t>(n) <= SIZE_MAX / dtype_size(dt) &&
                 static_cast<std::size_t>(n) * dtype_size(dt) == nbytes,
             "[weights] {} bytes do not hold a {} tensor of shape {}", nbytes, st_dtype,
             shape_str(shape));
  Tensor t = Tensor::empty(shape, dt, Device::cpu());
  io::copy_from_mapping(t.raw_data(), data, nbytes, source);
  return t;
}

// ---- save ---------------------------------------------------------------------------

void save_safetensors(const nn::Module& m, const std::string& path, DType dtype,
                      io::Metadata metadata) {
  KILN_CHECK(is_floating(dtype),
             "[save_safetensors] {}: weights must be saved as a float dtype, not {}", path,
             dtype_name(dtype));
  std::string st_dtype(dtype_safetensors_name(dtype));
  // The writer does not copy: `keep` owns the converted buffers until write().
  std::vector<Tensor> keep;
  io::SafetensorsWriter w;
  MemoryScope scope(MemCategory::Temporaries);
  for (const auto& [name, p] : m.named_parameters()) {
    KILN_CHECK(!p.device().is_meta(), "[save_safetensors] {}: parameter {} is on meta (no data)",
               path, name);
    Tensor t = p.detach().to(Device::cpu(), dtype).contiguous();
    keep.push_back(t);
    w.add(name, st_dtype, t.shape(), t.raw_data(), t.nbytes());
  }
  metadata.emplace("format", "pt");
  w.write(path, metadata);
}

void save_safetensors(const DecoderModel& m, const std::string& path, DType dtype,
                      io::Metadata metadata) {
  metadata.emplace("kiln_config", m.cfg.to_json().dump());
  save_safetensors(static_cast<const nn::Module&>(m), path, dtype, std::move(metadata));
}

// ---- load ---------------------------------------------------------------------------

namespace {

// One view over a single file or a folder: name -> (entry, bytes).
struct Source {
  std::optional<io::SafetensorsFile> file;
  std::optional<io::SafetensorsIndex> index;

  std::vector<std::string> names() const {
    if (index) return index->names();
    std::vector<std::string> out;
    for (const auto& e : file->entries()) out.push_back(e.name);
    return out;
  }
  // nullopt when absent.
  std::optional<std::pair<const io::TensorEntry*, const std::uint8_t*>> find(
      const std::string& name) const {
    if (index) {
      auto f = index->find(name);
      if (!f) return std::nullopt;
      return std::make_pair(f->entry, f->data());
    }
    const io::TensorEntry* e = file->find(name);
    if (!e) return std::nullopt;
    return std::make_pair(e, file->data(*e));
  }
};

// At most the first 12 names, then how many more: a config with a thousand layers too many
// must not print ten thousand names.
std::string name_list(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 12;
  if (names.size() <= kShown) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, ... and {} more", fmt::join(names.begin(), names.begin() + kShown, ", "),
                     names.size() - kShown);
}

bool is_float_file_dtype(const std::string& d) {
  return d == "F32" || d == "F16" || d == "BF16" || d == "F64";
}

// Gives a meta parameter (as built, contiguous) storage on `device`: the file's bytes in place
// where the device reads host memory and they already hold the parameter's dtype, aligned for
// it (host_bytes_in_place); else memory on the device (Weights) with a converted copy. `owner`
// keeps the file mappings alive as long as a tensor uses them.
void materialize(Tensor& p, const io::TensorEntry& e, const std::uint8_t* bytes,
                 const std::shared_ptr<const void>& owner, const std::string& what, bool prefault,
                 Device device) {
  TensorImpl& impl = *p.impl();
  KILN_CHECK(p.is_contiguous() && p.offset() == 0,
             "[load_safetensors] {}: a parameter to load must be a whole contiguous tensor", what);
  const DType file_dtype = dtype_from_safetensors(e.dtype);
  const Tensor in_place =
      file_dtype == p.dtype()
          ? host_bytes_in_place(bytes, static_cast<std::int64_t>(e.nbytes()), p.shape(), file_dtype,
                                owner, device, MemCategory::Weights)
          : Tensor();
  if (in_place.defined()) {
    impl.storage = in_place.storage();
    impl.offset = 0;
    // Page-table entries now rather than faults in the first forward (io::prefault_mapping);
    // best effort, so a false (an older kernel) changes nothing but when the faults happen.
    if (prefault) (void)io::prefault_mapping(bytes, e.nbytes());
    return;
  }
  Tensor t;
  {
    MemoryScope scope(MemCategory::Temporaries);
    t = tensor_from_bytes(e.dtype, e.shape, bytes, e.nbytes(), what);
  }
  MemoryScope scope(MemCategory::Weights);
  Tensor dst = Tensor::empty(p.shape(), p.dtype(), device);
  dst.copy_(t);  // converts, and moves to the device when it is not the host
  impl.storage = dst.storage();
  impl.offset = 0;
}

}  // namespace

void load_safetensors(nn::Module& m, const std::string& path_or_dir, const LoadOptions& options) {
  // Shared: tensors used in place from the mappings keep them alive after this returns.
  auto shared_src = std::make_shared<Source>();
  Source& src = *shared_src;
  if (fs::is_directory(path_or_dir))
    src.index.emplace(io::SafetensorsIndex::open_dir(path_or_dir));
  else
    src.file.emplace(path_or_dir);

  auto params = m.named_parameters();
  std::set<std::string> known;
  for (const auto& [name, p] : params) known.insert(name);
  std::set<std::string> ignored(options.ignore.begin(), options.ignore.end());
  if (options.ignore_tied_lm_head && !known.count("lm_head.weight"))
    ignored.insert("lm_head.weight");

  // Validate everything before touching any parameter.
  std::vector<std::string> missing, unexpected, mis_shaped, bad_dtype;
  for (const auto& [name, p] : params) {
    auto f = src.find(name);
    if (!f) {
      missing.push_back(name);
      continue;
    }
    const io::TensorEntry& e = *f->first;
    if (e.shape != p.shape())
      mis_shaped.push_back(
          fmt::format("{} (file {}, model {})", name, shape_str(e.shape), shape_str(p.shape())));
    if (!is_float_file_dtype(e.dtype)) bad_dtype.push_back(fmt::format("{} ({})", name, e.dtype));
  }
  for (const auto& name : src.names())
    if (!known.count(name) && !ignored.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !mis_shaped.empty() || !bad_dtype.empty()) {
    std::string msg = fmt::format("[load_safetensors] {} does not match the model:", path_or_dir);
    if (!missing.empty()) msg += fmt::format("\n  missing: {}", name_list(missing));
    if (!unexpected.empty()) msg += fmt::format("\n  unexpected: {}", name_list(unexpected));
    if (!mis_shaped.empty()) msg += fmt::format("\n  wrong shape: {}", name_list(mis_shaped));
    if (!bad_dtype.empty())
      msg += fmt::format("\n  not a float dtype (F32/F16/BF16/F64): {}", name_list(bad_dtype));
    fail("{}", msg);
  }

  const std::shared_ptr<const void> owner = shared_src;
  for (auto& [name, p] : params) {
    if (p.device().is_meta() && !options.materialize_on) continue;
    auto f = src.find(name);
    const io::TensorEntry& e = *f->first;
    if (p.device().is_meta()) {
      const bool by_rows = std::find(options.read_by_rows.begin(), options.read_by_rows.end(),
                                     name) != options.read_by_rows.end();
      materialize(p, e, f->second, owner, fmt::format("{} (tensor {})", path_or_dir, name),
                  !by_rows, *options.materialize_on);
      continue;
    }
    // The mapped bytes may be unaligned for their type: copy into an aligned
    // scratch tensor first, then convert into the parameter in place.
    MemoryScope scope(MemCategory::Temporaries);
    Tensor t = tensor_from_bytes(e.dtype, e.shape, f->second, e.nbytes(),
                                 fmt::format("{} (tensor {})", path_or_dir, name));
    Tensor dst = p.detach();
    dst.copy_(t);  // converts, and moves to the parameter's device when it is not the host
  }
}

// ---- llama2.c -------------------------------------------------------------------------

ModelConfig llama2c_model_config(const io::Llama2cConfig& c) {
  ModelConfig m;
  m.name = "llama2c";
  m.vocab_size = c.vocab_size;
  m.dim = c.dim;
  m.n_layers = c.n_layers;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.n_kv_heads;
  KILN_CHECK(c.n_heads > 0 && c.dim % c.n_heads == 0,
             "[llama2c] dim {} is not a multiple of n_heads {}", c.dim, c.n_heads);
  m.head_dim = c.dim / c.n_heads;
  m.hidden_dim = c.hidden_dim;
  m.max_seq_len = c.seq_len;
  // run.c: rms eps 1e-5, RoPE on (x[2i], x[2i+1]) with freq 1/10000^(2i/hs).
  m.norm_eps = 1e-5;
  m.rope_theta = 10000.0;
  m.rope_style = ops::RopeStyle::Interleaved;
  m.tie_embeddings = c.shared_classifier;
  m.validate();
  return m;
}

std::unique_ptr<DecoderModel> load_llama2c_model(const std::string& bin_path) {
  io::Llama2cCheckpoint ck = io::load_llama2c_bin(bin_path);
  ModelConfig cfg = llama2c_model_config(ck.config);
  auto model = std::make_unique<DecoderModel>(cfg, /*seed=*/0);
  auto params = model->named_parameters();
  std::vector<std::string> missing, mis_shaped, unexpected;
  std::set<std::string> known;
  for (const auto& [name, p] : params) {
    known.insert(name);
    auto it = ck.tensors.find(name);
    if (it == ck.tensors.end())
      missing.push_back(name);
    else if (it->second.shape != p.shape())
      mis_shaped.push_back(fmt::format("{} (file {}, model {})", name, shape_str(it->second.shape),
                                       shape_str(p.shape())));
  }
  for (const auto& [name, t] : ck.tensors)
    if (!known.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !mis_shaped.empty()) {
    std::string msg = fmt::format("[llama2c] {}: tensors do not match the model:", bin_path);
    if (!missing.empty()) msg += fmt::format("\n  missing: {}", fmt::join(missing, ", "));
    if (!unexpected.empty()) msg += fmt::format("\n  unexpected: {}", fmt::join(unexpected, ", "));
    if (!mis_shaped.empty()) msg += fmt::format("\n  wrong shape: {}", fmt::join(mis_shaped, ", "));
    fail("{}", msg);
  }
  for (auto& [name, p] : params) {
    const io::Llama2cTensor& src = ck.tensors.at(name);
    MemoryScope scope(MemCategory::Temporaries);
    Tensor t = tensor_from_bytes("F32", src.shape, src.data, src.numel() * sizeof(float),
                                 fmt::format("{} (tensor {})", bin_path, name));
    Tensor dst = p.detach();
    dst.copy_(t);
  }
  return model;
}

}  // namespace kiln::models
