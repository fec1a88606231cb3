// A decoder from a GGUF file (llama.cpp's format: models/io/gguf.h): the config from its
// metadata, the weights by llama.cpp's tensor names. Architectures: qwen3, qwen2 and llama.
// Weights in f32, f16 and bf16 are converted to the model's dtype. Q8_0, Q4_K and Q6_K weights of
// the Linear layers (projections, LM head) and the token embedding stay quantized
// (set_quantized_weight: ops::linear_quant runs them, ops::embedding_quant looks rows up, and a
// tied LM head runs linear_quant on the embedding's blocks) unless keep_quantized is false,
// which dequantizes them (ops::dequantize) into the model's dtype.
//
//   llama.cpp name                  kiln name
//   token_embd.weight               model.embed_tokens.weight
//   blk.N.attn_norm.weight          model.layers.N.input_layernorm.weight
//   blk.N.attn_{q,k,v}.{weight,bias} model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}
//   blk.N.attn_output.weight        model.layers.N.self_attn.o_proj.weight
//   blk.N.attn_{q,k}_norm.weight    model.layers.N.self_attn.{q,k}_norm.weight (qwen3)
//   blk.N.ffn_norm.weight           model.layers.N.post_attention_layernorm.weight
//   blk.N.ffn_{gate,up,down}.weight model.layers.N.mlp.{gate,up,down}_proj.weight
//   output_norm.weight              model.norm.weight
//   output.weight                   lm_head.weight (absent: tied to the embedding)
// llama.cpp's converter permutes a llama's q/k rows for its interleaved ("normal") RoPE, which
// is kiln's RopeStyle::Interleaved; qwen2/qwen3 keep HF's order and rotate halves (NEOX).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kernels/common/quant.h"
#include "models/decoder.h"
#include "models/io/gguf.h"
#include "models/io/qwen_tokenizer.h"

namespace kiln::models {

// The config a GGUF file's metadata describes. Metadata kiln does not implement (RoPE scaling,
// sliding windows, experts) is refused by name with its value: "[gguf] <path>: ...".
ModelConfig gguf_model_config(const io::GgufFile& f);

// Reads `path` into a new model of `dtype` on `device`. Every parameter must be in the file with
// its shape, and the file must hold no other tensor; otherwise one error names them. On the CPU
// the GGML blocks the model keeps quantized are used in place from the file's mapping (no copy:
// the tracker counts them as mapped Weights, and the tensors keep the mapping alive).
std::unique_ptr<DecoderModel> load_gguf_model(const std::string& path, DType dtype, Device device,
                                              bool keep_quantized = true);
// The same from an open file (its metadata parsed once, e.g. for the tokenizer too).
std::unique_ptr<DecoderModel> load_gguf_model(std::shared_ptr<const io::GgufFile> f, DType dtype,
                                              Device device, bool keep_quantized = true);

// kiln's parameter name for a llama.cpp tensor name; empty when there is none.
std::string kiln_name_of_gguf_tensor(const std::string& gguf_name);
// The inverse: llama.cpp's name for a kiln parameter name; empty when there is none.
std::string gguf_name_of_kiln_tensor(const std::string& kiln_name);

// The GGUF metadata (llama.cpp's keys) of a Qwen3 or Qwen2 config; other models are refused.
io::GgufMetadata gguf_metadata_of(const ModelConfig& c);

// How save_gguf_model stores each weight: all f32; every 2-d weight whose rows are whole blocks
// in Q8_0 (as llama.cpp's converter writes q8_0 files); or Q4_K_M, llama.cpp's mix: Q6_K for the
// LM head and for attn_v / ffn_down in the first and last eighth of the layers and every third
// layer between, Q4_K for the other 2-d weights. A weight whose rows are not whole blocks of its
// type falls back to Q8_0, else f32. Norms and biases are f32 in every scheme.
enum class GgufScheme { F32, Q8_0, Q4_K_M };
std::string_view gguf_scheme_name(GgufScheme s);  // "f32", "q8_0", "q4_k_m"
GgufScheme parse_gguf_scheme(std::string_view name);
// The type a scheme gives kiln parameter `name` of `shape` (nullopt: f32).
std::optional<quant::QuantType> gguf_tensor_type(GgufScheme scheme, const std::string& name,
                                                 const Shape& shape, std::int64_t n_layers);

// The scheme whose types a file's Linear weights and token embedding have, as kiln would keep
// them: none quantized, F32; every one Q8_0, Q8_0; any K-quant, Q4_K_M (kiln's rule for the mix;
// a file from another converter may type a few tensors otherwise).
GgufScheme gguf_file_scheme(const io::GgufFile& f);
// The same rule over the types a loaded model's Linear weights kept (F32 when none stayed
// quantized: a float file, or --dequantize).
GgufScheme kept_scheme(const DecoderModel& m);

// A model of config c laid out in memory as load_gguf_model lays out a file that save_gguf_model
// wrote with `scheme` (keep_quantized): the Linear weights and the token embedding that the scheme
// quantizes hold zero blocks of their type (Weights), every other parameter zeros in `dtype`.
// Built on meta and then placed on `device`, as the loader does, so no float copy of a quantized
// weight is ever allocated. The memory budget's what-if (`kiln budget --weights q4_k_m`).
std::unique_ptr<DecoderModel> zero_model_as_stored(const ModelConfig& c, GgufScheme scheme,
                                                   DType dtype, Device device);

// Bytes of the GGML blocks of a rows x k weight of type t (k a multiple of the block size).
std::int64_t quantized_bytes(quant::QuantType t, std::int64_t rows, std::int64_t k);

// Writes m (float weights) as GGUF v3 with llama.cpp's names and metadata, its weights stored as
// `scheme` says (kernels/cpu/quantize.h: Q8_0 byte for byte llama.cpp's). With a Qwen (gpt2) or
// llama2.c (SentencePiece, "llama") tokenizer, its tokenizer.ggml.* keys are written too
// (models/io/gguf_tokenizer.h; other tokenizers write none). Atomic (GgufWriter).
// `progress`, when given, is called after each tensor with (tensors done, tensors in all).
void save_gguf_model(const DecoderModel& m, const std::string& path, GgufScheme scheme,
                     const io::Tokenizer* tokenizer = nullptr,
                     const std::function<void(std::size_t, std::size_t)>& progress = {});

}  // namespace kiln::models
