#include "models/gguf_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "kernels/common/quant.h"
#include "kernels/cpu/quantize.h"
#include "models/io/gguf_tokenizer.h"
#include "models/weights.h"
#include "tensor/host_bytes.h"
#include "tensor/memory.h"

namespace kiln::models {

namespace {

// GGML's type name -> kiln's QuantType; nullopt for a float type or one kiln does not read.
std::optional<quant::QuantType> quant_type_named(std::string_view name) {
  for (const quant::QuantInfo& q : quant::kQuantTypes)
    if (q.name == name) return q.type;
  return std::nullopt;
}

// The scheme a set of quantized weight types follows: none, F32; all Q8_0, Q8_0; any K-quant,
// Q4_K_M.
GgufScheme scheme_of(const std::vector<quant::QuantType>& types) {
  if (types.empty()) return GgufScheme::F32;
  return std::all_of(types.begin(), types.end(),
                     [](quant::QuantType t) { return t == quant::QuantType::Q8_0; })
             ? GgufScheme::Q8_0
             : GgufScheme::Q4_K_M;
}

// Metadata that would change the model if ignored, refused unless it has its neutral value.
void refuse_unimplemented(const io::GgufFile& f, const std::string& arch) {
  // Not a structured binding: clang 14 (the fuzz build) cannot capture one in the lambda below.
  for (const auto& entry : f.metadata()) {
    const std::string& key = entry.first;
    const io::GgufValue& v = entry.second;
    if (key.rfind(arch + ".", 0) != 0) continue;
    const std::string field = key.substr(arch.size() + 1);
    auto refuse = [&](const char* why) {
      fail("[gguf] {}: {} = {} is not supported ({})", f.path(), io::gguf_printable(key),
           io::gguf_shown(v.value), why);
    };
    if (field == "rope.scaling.type" && v.value != "none")
      refuse("kiln implements no RoPE scaling");
    if (field.rfind("rope.scaling.", 0) == 0 && field != "rope.scaling.type" &&
        field != "rope.scaling.factor" && field != "rope.scaling.original_context_length")
      refuse("kiln implements no RoPE scaling");
    if (field == "rope.scaling.factor" && v.value.is_number() && v.value.get<double>() != 1.0 &&
        v.value.get<double>() != 0.0)
      refuse("kiln implements no RoPE scaling");
    if (field == "attention.sliding_window") refuse("kiln implements no sliding windows");
    if ((field == "expert_count" || field == "expert_used_count") && v.value.is_number() &&
        v.value.get<double>() != 0)
      refuse("kiln implements no mixture of experts");
  }
}

std::int64_t need_int(const io::GgufFile& f, const std::string& key) {
  const auto v = f.get_int(key);
  KILN_CHECK(v.has_value(), "[gguf] {}: {} is missing", f.path(), key);
  return *v;
}

}  // namespace

namespace {

// llama.cpp's names for kiln's (HF's): the top-level tensors and those of each block.
const std::map<std::string, std::string, std::less<>> kTopNames = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"}};
const std::map<std::string, std::string, std::less<>> kLayerNames = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"}};

}  // namespace

std::string kiln_name_of_gguf_tensor(const std::string& g) {
  if (auto it = kTopNames.find(g); it != kTopNames.end()) return it->second;
  if (g.rfind("blk.", 0) != 0) return "";
  const std::size_t dot = g.find('.', 4);
  if (dot == std::string::npos || dot == 4) return "";
  const std::string n = g.substr(4, dot - 4);
  if (n.find_first_not_of("0123456789") != std::string::npos) return "";
  auto it = kLayerNames.find(std::string_view(g).substr(dot + 1));
  if (it == kLayerNames.end()) return "";
  return "model.layers." + n + "." + it->second;
}

std::string gguf_name_of_kiln_tensor(const std::string& k) {
  for (const auto& [g, kn] : kTopNames)
    if (kn == k) return g;
  const std::string prefix = "model.layers.";
  if (k.rfind(prefix, 0) != 0) return "";
  const std::size_t dot = k.find('.', prefix.size());
  if (dot == std::string::npos) return "";
  const std::string rest = k.substr(dot + 1);
  for (const auto& [g, kn] : kLayerNames)
    if (kn == rest) return "blk." + k.substr(prefix.size(), dot - prefix.size()) + "." + g;
  return "";
}

ModelConfig gguf_model_config(const io::GgufFile& f) {
  const auto arch = f.get_string("general.architecture");
  KILN_CHECK(arch.has_value(), "[gguf] {}: general.architecture is missing", f.path());
  KILN_CHECK(*arch == "qwen3" || *arch == "qwen2" || *arch == "llama",
             "[gguf] {}: general.architecture {} is not supported (kiln reads qwen3, qwen2 and "
             "llama)",
             f.path(), *arch);
  refuse_unimplemented(f, *arch);
  const std::string a = *arch + ".";
  ModelConfig c;
  c.name = *arch;
  c.n_layers = need_int(f, a + "block_count");
  c.dim = need_int(f, a + "embedding_length");
  c.hidden_dim = need_int(f, a + "feed_forward_length");
  c.n_heads = need_int(f, a + "attention.head_count");
  c.n_kv_heads = f.get_int(a + "attention.head_count_kv").value_or(c.n_heads);
  KILN_CHECK(c.n_heads > 0, "[gguf] {}: {}attention.head_count is {}", f.path(), a, c.n_heads);
  c.head_dim = f.get_int(a + "attention.key_length").value_or(c.dim / c.n_heads);
  if (auto vl = f.get_int(a + "attention.value_length"))
    KILN_CHECK(*vl == c.head_dim, "[gguf] {}: value_length {} differs from key_length {}", f.path(),
               *vl, c.head_dim);
  c.max_seq_len = f.get_int(a + "context_length").value_or(4096);
  c.norm_eps = f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-6);
  c.rope_theta = f.get_float(a + "rope.freq_base").value_or(10000.0);
  c.rope_style = *arch == "llama" ? ops::RopeStyle::Interleaved : ops::RopeStyle::RotateHalf;
  c.qk_norm = *arch == "qwen3";
  c.qkv_bias = *arch == "qwen2";
  const io::GgufTensor* embd = f.find("token_embd.weight");
  KILN_CHECK(embd && embd->dims.size() == 2, "[gguf] {}: no 2-d token_embd.weight", f.path());
  c.vocab_size = embd->dims[1];
  c.tie_embeddings = f.find("output.weight") == nullptr;
  try {
    c.validate();
  } catch (const Error& e) {
    fail("[gguf] {}: {}", f.path(), e.what());
  }
  // Partial rotary embeddings: kiln rotates the whole head (checked on the validated sizes).
  if (auto rot = f.get_int(a + "rope.dimension_count"); rot && *rot != c.head_dim)
    fail(
        "[gguf] {}: {}rope.dimension_count = {} is not supported (kiln rotates the whole head "
        "of {})",
        f.path(), a, *rot, c.head_dim);
  return c;
}

std::unique_ptr<DecoderModel> load_gguf_model(const std::string& path, DType dtype, Device device,
                                              bool keep_quantized) {
  return load_gguf_model(std::make_shared<const io::GgufFile>(path), dtype, device, keep_quantized);
}

std::unique_ptr<DecoderModel> load_gguf_model(std::shared_ptr<const io::GgufFile> file, DType dtype,
                                              Device device, bool keep_quantized) {
  KILN_CHECK(file != nullptr, "[gguf] no file to load");
  const io::GgufFile& f = *file;
  const std::string& path = f.path();
  const ModelConfig cfg = gguf_model_config(f);
  // Names and shapes first, on the meta device: a file that does not match is refused before
  // any memory is taken.
  std::map<std::string, const io::GgufTensor*> by_kiln;
  std::vector<std::string> unexpected, missing, misshaped;
  for (const io::GgufTensor& t : f.tensors()) {
    const std::string k = kiln_name_of_gguf_tensor(t.name);
    if (k.empty())
      unexpected.push_back(io::gguf_printable(t.name));
    else
      by_kiln[k] = &t;
  }
  {
    DecoderModel probe(cfg, 0, dtype, Device::meta());
    std::set<std::string> used;
    for (const auto& [name, p] : probe.named_parameters()) {
      auto it = by_kiln.find(name);
      if (it == by_kiln.end()) {
        missing.push_back(name);
        continue;
      }
      used.insert(name);
      if (it->second->shape() != p.shape())
        misshaped.push_back(fmt::format("{} {} (the model: {})", it->second->name,
                                        shape_str(it->second->shape()), shape_str(p.shape())));
    }
    for (const auto& [k, t] : by_kiln)
      if (!used.count(k)) unexpected.push_back(t->name);
  }
  if (!unexpected.empty() || !missing.empty() || !misshaped.empty()) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (std::size_t i = 0; i < v.size() && i < 12; ++i) s += (i ? ", " : "") + v[i];
      if (v.size() > 12) s += fmt::format(", ... ({} in all)", v.size());
      return s;
    };
    std::string msg = fmt::format("[gguf] {}: the tensors do not match a {} model", path, cfg.name);
    if (!missing.empty()) msg += "\n  missing: " + list(missing);
    if (!unexpected.empty()) msg += "\n  not used by kiln: " + list(unexpected);
    if (!misshaped.empty()) msg += "\n  wrong shape: " + list(misshaped);
    fail("{}", msg);
  }

  // Built on the meta device, then every parameter replaced by its tensor on `device`: no float
  // copy of a weight that stays quantized is ever allocated, so loading peaks at the file's own
  // weights (plus one tensor in flight), not at the float model's.
  auto model = std::make_unique<DecoderModel>(cfg, 0, dtype, Device::meta());
  const std::map<std::string, nn::Linear*> linears = model->linears();
  auto weight_like = [&](const Tensor& p) {
    MemoryScope weights(MemCategory::Weights);
    return Tensor::empty(p.shape(), dtype, device);
  };
  for (auto& [name, p] : model->named_parameters()) {
    const io::GgufTensor& t = *by_kiln.at(name);
    const io::GgmlTypeInfo& info = *io::ggml_type_info(t.type);
    const std::string source = fmt::format("{} (tensor {})", path, t.name);
    MemoryScope scope(MemCategory::Temporaries);
    if (info.name == "f32" || info.name == "f16" || info.name == "bf16") {
      const std::string st = info.name == "f32" ? "F32" : info.name == "f16" ? "F16" : "BF16";
      Tensor w = weight_like(p);
      w.copy_(tensor_from_bytes(st, p.shape(), f.data(t), t.nbytes, source));
      nn::assign_data(p, w);
      continue;
    }
    const std::optional<quant::QuantType> qt = quant_type_named(info.name);
    if (!qt)
      fail("[gguf] {}: tensor {} is {}; kiln reads f32, f16, bf16, q8_0, q4_k and q6_k", path,
           t.name, info.name);
    const quant::QuantType q = *qt;
    // Blocks that stay are Weights; blocks dequantized below are Temporaries.
    auto linear = linears.find(name);
    const bool embed = name == "model.embed_tokens.weight";
    const bool keep = keep_quantized && (linear != linears.end() || embed);
    // In place where the device reads host memory: the file's bytes, read-only (the kernels only
    // read blocks), counted as mapped. Else a copy on the device.
    const std::int64_t nbytes = static_cast<std::int64_t>(t.nbytes);
    Tensor blocks = keep ? host_bytes_in_place(f.data(t), nbytes, {nbytes}, DType::Bool, file,
                                               device, MemCategory::Weights)
                         : Tensor();
    if (blocks.defined()) {
      (void)io::prefault_mapping(f.data(t), t.nbytes);  // best effort: faults now, not in use
    } else {
      MemoryScope cat(keep ? MemCategory::Weights : MemCategory::Temporaries);
      blocks = tensor_from_bytes("U8", {static_cast<std::int64_t>(t.nbytes)}, f.data(t), t.nbytes,
                                 source)
                   .to(device);
    }
    if (keep && embed) {
      // Rows dequantized on lookup; a tied LM head runs the int8 GEMV on the same blocks.
      model->model->embed_tokens->set_quantized_weight(blocks, q, dtype);
      continue;
    }
    if (keep) {
      linear->second->set_quantized_weight(blocks, q);
      continue;
    }
    Tensor w;
    {
      MemoryScope weights(MemCategory::Weights);  // dequantized straight into the weight
      w = ops::dequantize(blocks, q, p.shape(), dtype);
    }
    nn::assign_data(p, w);
  }
  if (cfg.uses_rope())  // the meta model's tables, made again on `device`
    model->rope = std::make_unique<nn::Rope>(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta,
                                             cfg.rope_style, dtype, device);
  return model;
}

GgufScheme gguf_file_scheme(const io::GgufFile& f) {
  std::vector<quant::QuantType> types;
  for (const io::GgufTensor& t : f.tensors())
    if (!kiln_name_of_gguf_tensor(t.name).empty() && t.dims.size() == 2)
      if (const auto q = quant_type_named(io::ggml_type_info(t.type)->name)) types.push_back(*q);
  return scheme_of(types);
}

GgufScheme kept_scheme(const DecoderModel& m) {
  std::vector<quant::QuantType> types;
  for (const auto& [name, linear] : m.linears())
    if (linear->weight_quant) types.push_back(*linear->weight_quant);
  return scheme_of(types);
}

std::int64_t quantized_bytes(quant::QuantType t, std::int64_t rows, std::int64_t k) {
  const quant::QuantInfo& q = quant::quant_info(t);
  KILN_CHECK(rows >= 0 && k >= 0 && k % q.block_size == 0,
             "[gguf] a {} x {} weight is not rows of whole {} blocks", rows, k, q.name);
  return rows * (k / q.block_size) * q.block_bytes;
}

std::unique_ptr<DecoderModel> zero_model_as_stored(const ModelConfig& c, GgufScheme scheme,
                                                   DType dtype, Device device) {
  auto model = std::make_unique<DecoderModel>(c, 0, dtype, Device::meta());
  const std::map<std::string, nn::Linear*> linears = model->linears();
  for (auto& [name, p] : model->named_parameters()) {
    MemoryScope weights(MemCategory::Weights);
    auto linear = linears.find(name);
    const bool embed = name == "model.embed_tokens.weight";
    const std::optional<quant::QuantType> q =
        linear != linears.end() || embed ? gguf_tensor_type(scheme, name, p.shape(), c.n_layers)
                                         : std::nullopt;
    if (!q) {  // stored in float, loaded in dtype
      nn::assign_data(p, ops::zeros(p.shape(), dtype, device));
      continue;
    }
    const Tensor blocks =
        ops::zeros({quantized_bytes(*q, p.size(0), p.size(1))}, DType::Bool, device);
    if (embed)
      model->model->embed_tokens->set_quantized_weight(blocks, *q, dtype);
    else
      linear->second->set_quantized_weight(blocks, *q);
  }
  if (c.uses_rope())  // the meta model's tables, made again on `device`
    model->rope = std::make_unique<nn::Rope>(c.max_seq_len, c.head_dim, c.rope_theta, c.rope_style,
                                             dtype, device);
  return model;
}

io::GgufMetadata gguf_metadata_of(const ModelConfig& c) {
  // The three architectures the reader maps back to this config: qwen3 (QK-norm) and qwen2 (QKV
  // bias) rotate halves; llama rotates interleaved pairs, kiln's llama2.c layout, which is what
  // llama.cpp's converter makes of HF's q/k rows (so kiln's weights need no permutation).
  const bool qwen3 = c.qk_norm && !c.qkv_bias, qwen2 = c.qkv_bias && !c.qk_norm,
             llama = !c.qk_norm && !c.qkv_bias;
  const bool rope_ok = c.uses_rope() && (llama ? c.rope_style == ops::RopeStyle::Interleaved
                                               : c.rope_style == ops::RopeStyle::RotateHalf);
  KILN_CHECK((qwen3 || qwen2 || llama) && rope_ok && c.norm_kind == NormKind::RmsNorm &&
                 c.mlp_kind == MlpKind::Gated && c.hidden_act == MlpActivation::Silu && !c.bias &&
                 c.final_norm,
             "[gguf] kiln writes Qwen3, Qwen2 and LLaMA models (RMSNorm, SiLU-gated MLP, RoPE: "
             "rotate-half with QK-norm or QKV bias, or interleaved without); {} is not one",
             c.name);
  const std::string arch = qwen3 ? "qwen3" : qwen2 ? "qwen2" : "llama", a = arch + ".";
  using io::GgufType;
  auto u32 = [](std::int64_t v) { return io::GgufValue{GgufType::Uint32, GgufType::Uint8, v}; };
  auto f32 = [](double v) { return io::GgufValue{GgufType::Float32, GgufType::Uint8, v}; };
  io::GgufMetadata md;
  md["general.architecture"] = {GgufType::String, GgufType::Uint8, arch};
  md["general.name"] = {GgufType::String, GgufType::Uint8, c.name};
  md[a + "block_count"] = u32(c.n_layers);
  md[a + "embedding_length"] = u32(c.dim);
  md[a + "feed_forward_length"] = u32(c.hidden_dim);
  md[a + "attention.head_count"] = u32(c.n_heads);
  md[a + "attention.head_count_kv"] = u32(c.n_kv_heads);
  md[a + "attention.key_length"] = u32(c.head_dim);
  md[a + "attention.value_length"] = u32(c.head_dim);
  md[a + "context_length"] = u32(c.max_seq_len);
  md[a + "attention.layer_norm_rms_epsilon"] = f32(c.norm_eps);
  md[a + "rope.freq_base"] = f32(c.rope_theta);
  md[a + "rope.dimension_count"] = u32(c.head_dim);
  return md;
}

std::string_view gguf_scheme_name(GgufScheme s) {
  switch (s) {
    case GgufScheme::F32:
      return "f32";
    case GgufScheme::Q8_0:
      return "q8_0";
    case GgufScheme::Q4_K_M:
      break;
  }
  return "q4_k_m";
}

GgufScheme parse_gguf_scheme(std::string_view name) {
  for (GgufScheme s : {GgufScheme::F32, GgufScheme::Q8_0, GgufScheme::Q4_K_M})
    if (gguf_scheme_name(s) == name) return s;
  fail("[gguf] unknown quantization '{}' (expected f32, q8_0 or q4_k_m)", name);
}

std::optional<quant::QuantType> gguf_tensor_type(GgufScheme scheme, const std::string& name,
                                                 const Shape& shape, std::int64_t n_layers) {
  using quant::QuantType;
  if (scheme == GgufScheme::F32 || shape.size() != 2) return std::nullopt;
  const std::int64_t k = shape[1];
  auto fits = [&](QuantType t) { return k % quant::quant_info(t).block_size == 0; };
  auto or_q8_0 = [&](QuantType t) -> std::optional<QuantType> {
    if (fits(t)) return t;
    if (fits(QuantType::Q8_0)) return QuantType::Q8_0;
    return std::nullopt;
  };
  if (scheme == GgufScheme::Q8_0) return or_q8_0(QuantType::Q8_0);
  // Q4_K_M, as llama.cpp's llama_tensor_get_type picks it: Q6_K for the LM head, and for
  // attn_v and ffn_down in the first and last eighth of the layers and every third between.
  if (name == "lm_head.weight") return or_q8_0(QuantType::Q6_K);
  const bool v_or_down =
      name.ends_with("self_attn.v_proj.weight") || name.ends_with("mlp.down_proj.weight");
  if (v_or_down && name.rfind("model.layers.", 0) == 0) {
    const std::int64_t i = std::stoll(name.substr(std::string("model.layers.").size()));
    const std::int64_t n = n_layers;
    if (i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2) return or_q8_0(QuantType::Q6_K);
  }
  return or_q8_0(QuantType::Q4_K);
}

void save_gguf_model(const DecoderModel& m, const std::string& path, GgufScheme scheme,
                     const io::Tokenizer* tokenizer,
                     const std::function<void(std::size_t, std::size_t)>& progress) {
  io::GgufMetadata md = gguf_metadata_of(m.cfg);
  // llama.cpp's general.file_type: 0 all f32, 7 mostly q8_0, 15 mostly q4_k_m.
  md["general.file_type"] = {io::GgufType::Uint32, io::GgufType::Uint8,
                             scheme == GgufScheme::F32    ? 0
                             : scheme == GgufScheme::Q8_0 ? 7
                                                          : 15};
  if (tokenizer) io::add_gguf_tokenizer_metadata(*tokenizer, m.cfg.vocab_size, md);
  const std::map<std::string, nn::Linear*> linears = m.linears();
  io::GgufWriter w;
  // Each tensor is widened to f32 and quantized only when the writer reaches it, so memory holds
  // one tensor's f32 copy and bytes at a time (an 8B model's 5 GB of Q4_K_M bytes were kept
  // until the end before).
  const auto params = m.named_parameters();
  std::size_t done = 0;
  for (const auto& [name, p] : params) {
    const std::string g = gguf_name_of_kiln_tensor(name);
    KILN_CHECK(!g.empty(), "[gguf] {}: no llama.cpp name for {}", path, name);
    auto lin = linears.find(name);
    KILN_CHECK(lin == linears.end() || !lin->second->weight_quant,
               "[gguf] {}: {} is already quantized; write from a float model", path, name);
    std::vector<std::int64_t> dims(p.shape().rbegin(), p.shape().rend());
    const std::optional<quant::QuantType> t =
        gguf_tensor_type(scheme, name, p.shape(), m.cfg.n_layers);
    const std::int64_t numel = p.numel();
    std::uint64_t nbytes = static_cast<std::uint64_t>(numel) * 4;
    std::uint32_t type = io::ggml_type_by_name("f32")->id;
    if (t) {
      const quant::QuantInfo& q = quant::quant_info(*t);
      nbytes = static_cast<std::uint64_t>(numel / q.block_size * q.block_bytes);
      type = io::ggml_type_by_name(q.name)->id;
    }
    const Tensor param = p;
    w.add_tensor(g, dims, type, nbytes, [&, param, t, numel](std::uint8_t* out) {
      const std::vector<float> v = param.to_float_vector();
      if (t)
        kiln::cpu::quantize_blocks(*t, v.data(), numel, out);
      else
        std::memcpy(out, v.data(), v.size() * 4);
      if (progress) progress(++done, params.size());
    });
  }
  w.write(path, md);
}

}  // namespace kiln::models
