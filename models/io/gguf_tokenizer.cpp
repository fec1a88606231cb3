#include "models/io/gguf_tokenizer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "kernels/common/error.h"

namespace kiln::io {

namespace {

constexpr int kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

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

// The file's tokenizer.ggml.model, checked to be one kiln reads ("gpt2" or "llama").
std::optional<std::string> tokenizer_model(const GgufFile& f) {
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) return std::nullopt;
  KILN_CHECK(*model == "gpt2" || *model == "llama",
             "[gguf] {}: tokenizer.ggml.model = {} is not supported (kiln reads gpt2, Qwen's "
             "byte-level BPE, and llama, SentencePiece); give --tokenizer",
             f.path(), gguf_printable(*model));
  return model;
}

// Every `from` in s replaced by `to` ("▁", SentencePiece's space, and " ").
std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}
constexpr std::string_view kSpmSpace = "\xe2\x96\x81";  // U+2581

}  // namespace

std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f) {
  const auto model = tokenizer_model(f);
  if (!model) return nullptr;
  if (*model == "llama") return gguf_spm_tokenizer(f);
  return gguf_bpe_tokenizer(f);
}

std::unique_ptr<Llama2cTokenizer> gguf_spm_tokenizer(const GgufFile& f) {
  const auto model = tokenizer_model(f);
  KILN_CHECK(model && *model == "llama", "[gguf] {}: tokenizer.ggml.model is {}, not llama",
             f.path(), model ? gguf_printable(*model) : std::string("missing"));
  const nlohmann::json& tokens = array_of(f, "tokenizer.ggml.tokens", GgufType::String);
  const nlohmann::json& scores = array_of(f, "tokenizer.ggml.scores", GgufType::Float32);
  const nlohmann::json& types = array_of(f, "tokenizer.ggml.token_type", GgufType::Int32);
  KILN_CHECK(scores.size() == tokens.size() && types.size() == tokens.size(),
             "[gguf] {}: {} scores and {} token types for {} tokens", f.path(), scores.size(),
             types.size(), tokens.size());
  // kiln's SentencePiece encoder (llama2.c's run.c) has these ids built in.
  for (const auto& [key, want] : {std::pair<const char*, std::int64_t>{"bos_token_id", 1},
                                  {"eos_token_id", 2},
                                  {"unknown_token_id", 0}}) {
    const auto v = f.get_int(std::string("tokenizer.ggml.") + key);
    KILN_CHECK(!v || *v == want,
               "[gguf] {}: tokenizer.ggml.{} is {}; kiln's SentencePiece tokenizer takes {}",
               f.path(), key, v ? *v : 0, want);
  }
  std::vector<std::string> pieces;
  std::vector<float> sc;
  pieces.reserve(tokens.size());
  sc.reserve(tokens.size());
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    const std::string& tok = tokens[id].get_ref<const std::string&>();
    const std::int64_t type = types[id].get<std::int64_t>();
    KILN_CHECK(type >= kNormal && type <= kByte,
               "[gguf] {}: token {} ({}) has type {}; kiln reads 1 to 6", f.path(), id,
               gguf_printable(tok), type);
    // Control tokens as llama2.c's exporter spells them: no text merges into "\n<s>\n".
    pieces.push_back(type == kControl ? "\n" + tok + "\n" : replace_all(tok, kSpmSpace, " "));
    sc.push_back(scores[id].get<float>());
  }
  return Llama2cTokenizer::from_pieces(std::move(pieces), std::move(sc),
                                       f.path() + " (tokenizer.ggml.*)");
}

std::unique_ptr<QwenTokenizer> gguf_bpe_tokenizer(const GgufFile& f) {
  const auto model = tokenizer_model(f);
  KILN_CHECK(model && *model == "gpt2", "[gguf] {}: tokenizer.ggml.model is {}, not gpt2", f.path(),
             model ? gguf_printable(*model) : std::string("missing"));

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
  std::vector<std::int32_t> unused;
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    const std::string& tok = tokens[id].get_ref<const std::string&>();
    const std::int64_t type = types[id].get<std::int64_t>();
    const auto i = static_cast<std::int32_t>(id);
    if (type == kNormal)
      vocab.emplace_back(tok, i);
    else if (type == kControl || type == kUserDefined)
      added.push_back({i, tok, type == kControl});
    else if (type == kUnused)
      unused.push_back(i);
    else
      KILN_CHECK(false, "[gguf] {}: token {} ({}) has type {}; kiln reads 1, 3, 4, 5", f.path(), id,
                 gguf_printable(tok), type);
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
  return QwenTokenizer::from_parts(vocab, std::move(pairs), std::move(added), eos, unused,
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

namespace kiln::io {

void add_gguf_tokenizer_metadata(const Llama2cTokenizer& t, std::int64_t vocab_size,
                                 GgufMetadata& md) {
  KILN_CHECK(vocab_size == t.vocab_size(),
             "[gguf] the SentencePiece tokenizer has {} ids, the model's vocab_size is {}",
             t.vocab_size(), vocab_size);
  nlohmann::json tokens = nlohmann::json::array(), scores = nlohmann::json::array(),
                 types = nlohmann::json::array();
  for (std::int32_t id = 0; id < t.vocab_size(); ++id) {
    std::string piece = t.piece(id);
    int type = kNormal;
    if (id == 0) {
      type = kUnknown;
    } else if (id == t.bos_id() || id == t.eos_id()) {
      type = kControl;  // llama2.c spells them "\n<s>\n": back to SentencePiece's "<s>"
      if (piece.size() >= 2 && piece.front() == '\n' && piece.back() == '\n')
        piece = piece.substr(1, piece.size() - 2);
    } else if (id >= 3 && id < 259) {
      type = kByte;
    } else {
      piece = replace_all(piece, " ", kSpmSpace);
    }
    tokens.push_back(piece);
    scores.push_back(t.score(id));
    types.push_back(type);
  }
  md["tokenizer.ggml.model"] = {GgufType::String, GgufType::Uint8, "llama"};
  md["tokenizer.ggml.tokens"] = {GgufType::Array, GgufType::String, std::move(tokens)};
  md["tokenizer.ggml.scores"] = {GgufType::Array, GgufType::Float32, std::move(scores)};
  md["tokenizer.ggml.token_type"] = {GgufType::Array, GgufType::Int32, std::move(types)};
  md["tokenizer.ggml.bos_token_id"] = {GgufType::Uint32, GgufType::Uint8, 1};
  md["tokenizer.ggml.eos_token_id"] = {GgufType::Uint32, GgufType::Uint8, 2};
  md["tokenizer.ggml.unknown_token_id"] = {GgufType::Uint32, GgufType::Uint8, 0};
}

bool add_gguf_tokenizer_metadata(const Tokenizer& t, std::int64_t vocab_size, GgufMetadata& md) {
  if (const auto* q = dynamic_cast<const QwenTokenizer*>(&t)) {
    add_gguf_tokenizer_metadata(*q, vocab_size, md);
    return true;
  }
  if (const auto* l = dynamic_cast<const Llama2cTokenizer*>(&t)) {
    add_gguf_tokenizer_metadata(*l, vocab_size, md);
    return true;
  }
  return false;
}

}  // namespace kiln::io
