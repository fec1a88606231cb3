#include "models/io/gguf_tokenizer.h"

#include <fmt/format.h>

#include "kernels/common/error.h"

namespace kiln::io {

namespace {

constexpr int kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// The array at key, checked for its element type.
const nlohmann::json& array_of(const GgufFile& f, const std::string& key, GgufType elem) {
  auto it = f.metadata().find(key);
  KILN_CHECK(it != f.metadata().end(), "[gguf] {}: {} is missing", f.path(), key);
  KILN_CHECK(it->second.type == GgufType::Array && it->second.elem == elem,
             "[gguf] {}: {} is {} (of {}), expected an array of {}", f.path(), key,
             gguf_type_name(it->second.type), gguf_type_name(it->second.elem),
             gguf_type_name(elem));
  return it->second.value;
}

}  // namespace

std::unique_ptr<QwenTokenizer> gguf_tokenizer(const GgufFile& f) {
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) return nullptr;
  KILN_CHECK(*model == "gpt2",
             "[gguf] {}: tokenizer.ggml.model = {} is not supported (kiln reads gpt2, Qwen's "
             "byte-level BPE); give --tokenizer",
             f.path(), gguf_printable(*model));
  const auto pre = f.get_string("tokenizer.ggml.pre");
  KILN_CHECK(pre && *pre == "qwen2",
             "[gguf] {}: tokenizer.ggml.pre = {} is not supported (kiln implements Qwen's "
             "pre-tokenizer, qwen2); give --tokenizer",
             f.path(), pre ? gguf_printable(*pre) : std::string("(missing)"));
  const nlohmann::json& tokens = array_of(f, "tokenizer.ggml.tokens", GgufType::String);
  const nlohmann::json& types = array_of(f, "tokenizer.ggml.token_type", GgufType::Int32);
  const nlohmann::json& merges = array_of(f, "tokenizer.ggml.merges", GgufType::String);
  KILN_CHECK(types.size() == tokens.size(), "[gguf] {}: {} token types for {} tokens", f.path(),
             types.size(), tokens.size());
  std::vector<std::pair<std::string, std::int32_t>> vocab;
  std::vector<AddedToken> added;
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    const std::string& tok = tokens[id].get_ref<const std::string&>();
    const std::int64_t type = types[id].get<std::int64_t>();
    const auto i = static_cast<std::int32_t>(id);
    if (type == kNormal)
      vocab.emplace_back(tok, i);
    else if (type == kControl || type == kUserDefined)
      added.push_back({i, tok, type == kControl});
    else
      KILN_CHECK(type == kUnused, "[gguf] {}: token {} ({}) has type {}; kiln reads 1, 3, 4, 5",
                 f.path(), id, gguf_printable(tok), type);
  }
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(merges.size());
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r].get_ref<const std::string&>();
    const std::size_t sp = m.find(' ');
    KILN_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < m.size() &&
                   m.find(' ', sp + 1) == std::string::npos,
               "[gguf] {}: merge {} '{}' is not two tokens separated by a space", f.path(), r,
               gguf_printable(m));
    pairs.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  std::int32_t eos = -1;
  if (auto e = f.get_int("tokenizer.ggml.eos_token_id")) {
    KILN_CHECK(*e >= 0 && static_cast<std::size_t>(*e) < tokens.size(),
               "[gguf] {}: tokenizer.ggml.eos_token_id {} is not a token id (0..{})", f.path(), *e,
               tokens.size());
    eos = static_cast<std::int32_t>(*e);
  }
  return QwenTokenizer::from_parts(vocab, std::move(pairs), std::move(added), eos,
                                   f.path() + " (tokenizer.ggml.*)");
}

void add_gguf_tokenizer_metadata(const QwenTokenizer& t, std::int64_t vocab_size,
                                 GgufMetadata& md) {
  KILN_CHECK(vocab_size >= t.vocab_size(),
             "[gguf] the tokenizer's {} ids do not fit the model's vocab_size {}", t.vocab_size(),
             vocab_size);
  nlohmann::json tokens = nlohmann::json::array(), types = nlohmann::json::array();
  for (std::int32_t id = 0; id < vocab_size; ++id) {
    const std::string tok = id < t.vocab_size() ? t.token(id) : std::string();
    if (tok.empty()) {
      tokens.push_back(fmt::format("[PAD{}]", id));
      types.push_back(kUnused);
      continue;
    }
    tokens.push_back(tok);
    bool is_added = false;
    for (const AddedToken& a : t.added_tokens())
      if (a.id == id) is_added = true;
    types.push_back(!is_added ? kNormal : t.is_special(id) ? kControl : kUserDefined);
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : t.merge_list()) merges.push_back(a + " " + b);
  md["tokenizer.ggml.model"] = {GgufType::String, GgufType::Uint8, "gpt2"};
  md["tokenizer.ggml.pre"] = {GgufType::String, GgufType::Uint8, "qwen2"};
  md["tokenizer.ggml.tokens"] = {GgufType::Array, GgufType::String, std::move(tokens)};
  md["tokenizer.ggml.token_type"] = {GgufType::Array, GgufType::Int32, std::move(types)};
  md["tokenizer.ggml.merges"] = {GgufType::Array, GgufType::String, std::move(merges)};
  if (t.eos_id() >= 0)
    md["tokenizer.ggml.eos_token_id"] = {GgufType::Uint32, GgufType::Uint8, t.eos_id()};
}

}  // namespace kiln::io
