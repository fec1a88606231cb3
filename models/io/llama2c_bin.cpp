// llama2.c .bin reader. See llama2c_bin.h for both layouts. Every header
// number is range-checked, and the file size must equal the byte count the
// header implies (computed with overflow checks), before any pointer is formed.
#include "models/io/llama2c_bin.h"

#include <bit>
#include <cstring>

#include "kernels/common/error.h"

namespace kiln::io {

static_assert(std::endian::native == std::endian::little, "kiln assumes a little-endian host");

namespace {

constexpr uint32_t kMagicV1 = 0x616b3432;
constexpr uint64_t kHeaderLegacy = 7 * 4;
constexpr uint64_t kHeaderV1 = 256;

struct Segment {
  std::string name;  // empty: present in the file but skipped
  std::vector<int64_t> shape;
};

int32_t read_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void check_sane(const Llama2cConfig& c, const std::string& path) {
  auto in_range = [&](const char* what, int64_t v, int64_t hi) {
    KILN_CHECK(
        v >= 1 && v <= hi,
        "[llama2c] {}: {} = {} is out of range [1, {}] (corrupt or not a llama2.c checkpoint?)",
        path, what, v, hi);
  };
  in_range("dim", c.dim, 65536);
  in_range("hidden_dim", c.hidden_dim, 1 << 20);
  in_range("n_layers", c.n_layers, 1024);
  in_range("n_heads", c.n_heads, c.dim);
  in_range("n_kv_heads", c.n_kv_heads, c.n_heads);
  in_range("vocab_size", c.vocab_size, 10'000'000);
  in_range("seq_len", c.seq_len, 1 << 20);
  KILN_CHECK(c.dim % c.n_heads == 0, "[llama2c] {}: n_heads = {} does not divide dim = {}", path,
             c.n_heads, c.dim);
  KILN_CHECK(c.n_heads % c.n_kv_heads == 0,
             "[llama2c] {}: n_kv_heads = {} does not divide n_heads = {}", path, c.n_kv_heads,
             c.n_heads);
  KILN_CHECK(c.head_size() % 2 == 0, "[llama2c] {}: head size {} is odd; RoPE needs pairs", path,
             c.head_size());
}

// The float32 segments of the file, in file order.
std::vector<Segment> layout(const Llama2cConfig& c) {
  const int64_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(), L = c.n_layers;
  auto layer = [](int64_t l, const char* rest) {
    return "model.layers." + std::to_string(l) + "." + rest;
  };
  std::vector<Segment> s;
  auto per_layer = [&](const char* rest, std::vector<int64_t> shape) {
    for (int64_t l = 0; l < L; ++l) s.push_back({layer(l, rest), shape});
  };
  if (c.version == 0) {
    s.push_back({"model.embed_tokens.weight", {V, D}});
    per_layer("input_layernorm.weight", {D});
    per_layer("self_attn.q_proj.weight", {D, D});
    per_layer("self_attn.k_proj.weight", {KV, D});
    per_layer("self_attn.v_proj.weight", {KV, D});
    per_layer("self_attn.o_proj.weight", {D, D});
    per_layer("post_attention_layernorm.weight", {D});
    per_layer("mlp.gate_proj.weight", {H, D});
    per_layer("mlp.down_proj.weight", {D, H});
    per_layer("mlp.up_proj.weight", {H, D});
    s.push_back({"model.norm.weight", {D}});
    s.push_back({"", {c.seq_len, c.head_size() / 2}});  // freq_cis_real
    s.push_back({"", {c.seq_len, c.head_size() / 2}});  // freq_cis_imag
  } else {
    per_layer("input_layernorm.weight", {D});
    per_layer("post_attention_layernorm.weight", {D});
    s.push_back({"model.norm.weight", {D}});
    s.push_back({"model.embed_tokens.weight", {V, D}});
    per_layer("self_attn.q_proj.weight", {D, D});
    per_layer("self_attn.k_proj.weight", {KV, D});
    per_layer("self_attn.v_proj.weight", {KV, D});
    per_layer("self_attn.o_proj.weight", {D, D});
    per_layer("mlp.gate_proj.weight", {H, D});
    per_layer("mlp.down_proj.weight", {D, H});
    per_layer("mlp.up_proj.weight", {H, D});
  }
  if (!c.shared_classifier) s.push_back({"lm_head.weight", {V, D}});
  return s;
}

uint64_t segment_bytes(const Segment& s, const std::string& path) {
  uint64_t n = 4;
  for (int64_t d : s.shape)
    KILN_CHECK(checked_mul(n, static_cast<uint64_t>(d), &n), "[llama2c] {}: tensor size overflows",
               path);
  return n;
}

struct Parsed {
  Llama2cConfig config;
  uint64_t header_bytes = 0;
  std::vector<Segment> segments;
};

Parsed parse(const MappedFile& f) {
  const std::string& path = f.path();
  const uint64_t fsize = f.size();
  KILN_CHECK(fsize >= kHeaderLegacy, "[llama2c] {}: file is {} bytes, too small for a header", path,
             fsize);
  Parsed p;
  Llama2cConfig& c = p.config;
  const uint8_t* b = f.data();
  uint32_t magic;
  std::memcpy(&magic, b, 4);
  const uint8_t* h;
  int32_t vocab_raw;
  if (magic == kMagicV1) {
    KILN_CHECK(fsize >= kHeaderV1,
               "[llama2c] {}: file is {} bytes, too small for a version-1 header", path, fsize);
    int32_t version = read_i32(b + 4);
    KILN_CHECK(version == 1,
               "[llama2c] {}: version {} is not supported (only legacy and version 1 float32; "
               "version 2 is int8-quantized)",
               path, version);
    c.version = 1;
    h = b + 8;
    vocab_raw = read_i32(h + 20);
    uint8_t shared = b[8 + 28];
    KILN_CHECK(shared <= 1, "[llama2c] {}: shared_classifier flag is {}, expected 0 or 1", path,
               shared);
    c.shared_classifier = shared == 1;
    KILN_CHECK(vocab_raw > 0, "[llama2c] {}: vocab_size = {} must be positive in version 1", path,
               vocab_raw);
    p.header_bytes = kHeaderV1;
  } else {
    c.version = 0;
    h = b;
    vocab_raw = read_i32(h + 20);
    KILN_CHECK(vocab_raw != INT32_MIN, "[llama2c] {}: vocab_size = {} is out of range", path,
               vocab_raw);
    c.shared_classifier = vocab_raw > 0;
    p.header_bytes = kHeaderLegacy;
  }
  c.dim = read_i32(h);
  c.hidden_dim = read_i32(h + 4);
  c.n_layers = read_i32(h + 8);
  c.n_heads = read_i32(h + 12);
  c.n_kv_heads = read_i32(h + 16);
  c.vocab_size = vocab_raw < 0 ? -vocab_raw : vocab_raw;
  c.seq_len = read_i32(h + 24);
  check_sane(c, path);

  p.segments = layout(c);
  uint64_t total = p.header_bytes;
  for (const Segment& s : p.segments)
    KILN_CHECK(checked_add(total, segment_bytes(s, path), &total),
               "[llama2c] {}: total size overflows", path);
  KILN_CHECK(
      fsize == total,
      "[llama2c] {}: file is {} bytes but a {} checkpoint with dim={} hidden_dim={} n_layers={} "
      "n_heads={} n_kv_heads={} vocab_size={} seq_len={} {} classifier needs exactly {} bytes{}",
      path, fsize, c.version == 0 ? "legacy" : "version-1", c.dim, c.hidden_dim, c.n_layers,
      c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len, c.shared_classifier ? "shared" : "unshared",
      total, fsize < total ? " (truncated?)" : "");
  return p;
}

}  // namespace

uint64_t Llama2cTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

const Llama2cTensor& Llama2cCheckpoint::at(const std::string& name) const {
  auto it = tensors.find(name);
  KILN_CHECK(it != tensors.end(), "[llama2c] {}: no tensor named '{}'", file ? file->path() : "",
             name);
  return it->second;
}

Llama2cConfig read_llama2c_config(const std::string& path) {
  MappedFile f(path);
  return parse(f).config;
}

Llama2cCheckpoint load_llama2c_bin(const std::string& path) {
  auto f = std::make_shared<MappedFile>(path);
  Parsed p = parse(*f);
  Llama2cCheckpoint ck;
  ck.config = p.config;
  ck.file = f;
  uint64_t off = p.header_bytes;  // multiple of 4, so the float pointers are aligned
  for (Segment& s : p.segments) {
    uint64_t nb = segment_bytes(s, path);
    if (!s.name.empty())
      ck.tensors.emplace(
          std::move(s.name),
          Llama2cTensor{std::move(s.shape), reinterpret_cast<const float*>(f->data() + off)});
    off += nb;
  }
  return ck;
}

}  // namespace kiln::io
