// Qwen byte-level BPE. Encoding: added tokens (leftmost, then longest) -> NFC -> pre-tokenizer
// regex -> bytes as GPT-2 byte-to-unicode symbols -> BPE. BPE works on ids: each byte starts as
// the id of its one-symbol token, and a pair (left id, right id) merges into the id of their
// concatenation at the pair's merge rank. The lowest rank merges first, the leftmost on ties,
// found with a min-heap over a linked list of symbols (O(n log n) per word); results are cached
// per pre-token word.
#include "models/io/qwen_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>

#include "kernels/common/error.h"
#include "models/io/json_limits.h"
#include "models/io/mapped_file.h"
#include "models/io/tokenizer_config.h"
#include "models/io/unicode_nfc.h"

namespace kiln::io {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kCacheMax = 100'000;  // cached words before the cache is cleared

// The Qwen2/Qwen3 pre-tokenizer. `\s` is spelled out as Unicode White_Space (what HF's Oniguruma
// and Rust regex use): PCRE2's UCP \s leaves out U+0085.
constexpr const char* kWs =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
std::string qwen_pattern() {
  const std::string ws = kWs;
  return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" + ws +
         "\\p{L}\\p{N}]+[\\r\\n]*|[" + ws + "]*[\\r\\n]+|[" + ws + "]+(?![^" + ws + "])|[" + ws +
         "]+";
}

// GPT-2's byte -> unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes
// take code points 256, 257, ... in byte order.
const std::array<char32_t, 256>& byte_to_cp() {
  static const std::array<char32_t, 256> map = [] {
    std::array<char32_t, 256> m{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      m[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return m;
  }();
  return map;
}

// Inverse of byte_to_cp over code points 0..323; -1 where no byte maps.
const std::array<int16_t, 324>& cp_to_byte() {
  static const std::array<int16_t, 324> inv = [] {
    std::array<int16_t, 324> m;
    m.fill(-1);
    for (int b = 0; b < 256; ++b) m[byte_to_cp()[b]] = static_cast<int16_t>(b);
    return m;
  }();
  return inv;
}

// vocab.json spelling -> raw bytes. Characters outside the byte alphabet are kept as UTF-8.
std::string spelling_to_bytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    int n = unicode::utf8_decode(s, i, cp);
    if (n == 0) {
      out.push_back(s[i++]);
      continue;
    }
    if (cp < 324 && cp_to_byte()[cp] >= 0)
      out.push_back(static_cast<char>(cp_to_byte()[cp]));
    else
      out.append(s.substr(i, static_cast<size_t>(n)));
    i += static_cast<size_t>(n);
  }
  return out;
}

std::string bytes_to_spelling(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) unicode::utf8_append(out, byte_to_cp()[b]);
  return out;
}

// The built-in Qwen2.5/Qwen3 added tokens, in id order after the vocabulary (151643 onwards).
struct BuiltinToken {
  const char* content;
  bool special;
};
constexpr BuiltinToken kQwenAdded[] = {
    {"<|endoftext|>", true},      {"<|im_start|>", true},
    {"<|im_end|>", true},         {"<|object_ref_start|>", true},
    {"<|object_ref_end|>", true}, {"<|box_start|>", true},
    {"<|box_end|>", true},        {"<|quad_start|>", true},
    {"<|quad_end|>", true},       {"<|vision_start|>", true},
    {"<|vision_end|>", true},     {"<|vision_pad|>", true},
    {"<|image_pad|>", true},      {"<|video_pad|>", true},
    {"<tool_call>", false},       {"</tool_call>", false},
    {"<|fim_prefix|>", false},    {"<|fim_middle|>", false},
    {"<|fim_suffix|>", false},    {"<|fim_pad|>", false},
    {"<|repo_name|>", false},     {"<|file_sep|>", false},
    {"<tool_response>", false},   {"</tool_response>", false},
    {"<think>", false},           {"</think>", false},
};

// Streams vocab.json or tokenizer.json with nlohmann's SAX interface, keeping only what the BPE
// needs. A DOM of the 151k-entry vocabulary and merge list costs more than all the rest of
// loading; here vocabulary entries and merges go straight into vectors, and everything else in
// tokenizer.json (normalizer, pre_tokenizer, decoder, ...) is skipped.
class BpeJsonReader final : public nlohmann::json_sax<json> {
 public:
  enum class Mode { kVocab, kTokenizerJson };
  BpeJsonReader(Mode mode, std::string source) : mode_(mode), source_(std::move(source)) {}

  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added;
  bool has_model = false, has_vocab = false, has_merges = false, ignore_merges = false;
  std::string model_type;

  // Parses [data, data + n); throws kiln::Error on malformed JSON or a misplaced value.
  void run(const uint8_t* data, size_t n) {
    bool ok =
        n > 0 ? json::sax_parse(data, data + n, this) : json::sax_parse(std::string_view{}, this);
    if (!error_.empty()) fail("[qwen_tokenizer] {}: {}", source_, error_);
    KILN_CHECK(ok, "[qwen_tokenizer] {}: malformed JSON", source_);
  }

  bool null() override { return scalar(Kind::kNull); }
  bool boolean(bool v) override { return scalar(Kind::kBool, 0, v); }
  bool number_integer(number_integer_t v) override { return scalar(Kind::kInt, v); }
  bool number_unsigned(number_unsigned_t v) override {
    return scalar(Kind::kInt,
                  v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v));
  }
  bool number_float(number_float_t, const string_t&) override { return scalar(Kind::kFloat); }
  bool string(string_t& v) override { return scalar(Kind::kString, 0, false, &v); }
  bool binary(binary_t&) override { return scalar(Kind::kFloat); }
  bool key(string_t& k) override {
    frames_.back().key = std::move(k);
    return true;
  }
  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    if (error_.empty()) error_ = fmt::format("malformed JSON: {}", e.what());
    return false;
  }

 private:
  enum class Kind { kNull, kBool, kInt, kFloat, kString };
  struct Frame {
    bool array;
    std::string key;  // objects: the current member's key
  };
  // Key of frame i, "" for arrays.
  std::string_view k(size_t i) const {
    return frames_[i].array ? std::string_view() : frames_[i].key;
  }
  size_t depth() const { return frames_.size(); }
  bool in_vocab() const {
    return mode_ == Mode::kVocab
               ? depth() == 1 && !frames_[0].array
               : depth() == 3 && k(0) == "model" && k(1) == "vocab" && !frames_[2].array;
  }
  bool in_merges() const {
    return mode_ == Mode::kTokenizerJson && depth() == 3 && k(0) == "model" && k(1) == "merges";
  }
  bool in_merge_pair() const {
    return mode_ == Mode::kTokenizerJson && depth() == 4 && k(0) == "model" && k(1) == "merges" &&
           frames_[3].array;
  }
  bool in_added() const {
    return mode_ == Mode::kTokenizerJson && depth() == 3 && k(0) == "added_tokens" &&
           frames_[1].array && !frames_[2].array;
  }
  bool err(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return false;
  }

  bool scalar(Kind kind, int64_t i = 0, bool b = false, std::string* s = nullptr) {
    if (depth() == 0)
      return err(mode_ == Mode::kVocab ? "the vocabulary is not a JSON object"
                                       : "no \"model\" object");
    if (in_vocab()) {
      const std::string& tok = frames_.back().key;
      if (kind != Kind::kInt) return err(fmt::format("id of token '{}' is not an integer", tok));
      if (i < 0 || i >= kQwenMaxVocab)
        return err(fmt::format("id {} of token '{}' is outside [0, {})", i, tok, kQwenMaxVocab));
      vocab.emplace_back(tok, static_cast<int32_t>(i));
    } else if (in_merges()) {
      if (kind != Kind::kString) return bad_merge();
      const size_t sp = s->find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s->size() ||
          s->find(' ', sp + 1) != std::string::npos)
        return err(fmt::format("merge {} '{}' is not two tokens separated by a space",
                               merges.size() + 1, *s));
      merges.emplace_back(s->substr(0, sp), s->substr(sp + 1));
    } else if (in_merge_pair()) {
      if (kind != Kind::kString) return bad_merge();
      pair_.push_back(std::move(*s));
    } else if (in_added()) {
      const std::string& f = frames_.back().key;
      if (f == "id") {
        if (kind != Kind::kInt || i < 0 || i >= kQwenMaxVocab)
          return err(fmt::format("added token {}: 'id' is not an integer in [0, {})",
                                 added.size() + 1, kQwenMaxVocab));
        added_.id = static_cast<int32_t>(i);
      } else if (f == "content") {
        if (kind != Kind::kString)
          return err(fmt::format("added token {}: 'content' is not a string", added.size() + 1));
        added_.content = std::move(*s);
        has_content_ = true;
      } else if (f == "special") {
        added_.special = kind == Kind::kBool && b;
      }
    } else if (mode_ == Mode::kTokenizerJson && depth() == 2 && k(0) == "model") {
      if (k(1) == "type" && kind == Kind::kString) model_type = *s;
      if (k(1) == "ignore_merges" && kind == Kind::kBool) ignore_merges = b;
    }
    return true;
  }
  bool bad_merge() {
    return err(fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", merges.size() + 1));
  }

  bool open(bool array) {
    // The frames live on the heap, so depth cannot overflow the stack here; the bound keeps a
    // file of a million "[" from costing a frame each, and matches parse_json_limited's.
    if (depth() >= static_cast<size_t>(JsonLimits{}.max_depth))
      return err(fmt::format("nested deeper than {} levels of arrays and objects",
                             JsonLimits{}.max_depth));
    if (depth() == 0 && mode_ == Mode::kVocab && array)
      return err("the vocabulary is not a JSON object");
    if (depth() == 0 && mode_ == Mode::kTokenizerJson && array) return err("no \"model\" object");
    if (in_vocab())
      return err(fmt::format("id of token '{}' is not an integer", frames_.back().key));
    if (in_merge_pair()) return bad_merge();
    if (in_merges()) {
      if (!array) return bad_merge();
      pair_.clear();
    }
    if (mode_ == Mode::kTokenizerJson) {
      if (depth() == 1 && k(0) == "model" && !array) has_model = true;
      if (depth() == 2 && k(0) == "model" && k(1) == "vocab" && !array) has_vocab = true;
      if (depth() == 2 && k(0) == "model" && k(1) == "merges" && array) has_merges = true;
      if (depth() == 2 && k(0) == "added_tokens" && frames_[1].array && !array) {
        added_ = AddedToken{-1, {}, false};
        has_content_ = false;
      }
    }
    frames_.push_back({array, {}});
    return true;
  }

  bool close() {
    if (in_merge_pair()) {
      if (pair_.size() != 2) return bad_merge();
      merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
    }
    if (in_added()) {
      if (added_.id < 0 || !has_content_)
        return err(fmt::format("added token {} needs 'id' and 'content'", added.size() + 1));
      added.push_back(std::move(added_));
    }
    frames_.pop_back();
    return true;
  }

  Mode mode_;
  std::string source_;
  std::vector<Frame> frames_;
  std::vector<std::string> pair_;
  AddedToken added_{-1, {}, false};
  bool has_content_ = false;
  std::string error_;
};

void read_bpe_json(BpeJsonReader& r, const std::string& path, const char* what) {
  KILN_CHECK(fs::exists(path), "[qwen_tokenizer] {} '{}' does not exist", what, path);
  MappedFile f(path);
  r.run(f.data(), f.size());
}

}  // namespace

// ---- regex and cache --------------------------------------------------------------------------

struct QwenTokenizer::Regex {
  pcre2_code* code = nullptr;
  Regex() {
    const std::string pat = qwen_pattern();
    int err = 0;
    PCRE2_SIZE off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.c_str()), pat.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("[qwen_tokenizer] pre-tokenizer regex does not compile at {}: {}", off,
           reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
  }
  ~Regex() { pcre2_code_free(code); }
};

struct QwenTokenizer::Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

// ---- loading ----------------------------------------------------------------------------------

QwenTokenizer::QwenTokenizer()
    : regex_(std::make_unique<Regex>()), cache_(std::make_unique<Cache>()) {
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
}
QwenTokenizer::~QwenTokenizer() = default;

namespace {

// (token, id) pairs -> tokens (spelling by id).
void load_vocab(const std::vector<std::pair<std::string, int32_t>>& vocab,
                const std::string& source, std::vector<std::string>& tokens) {
  KILN_CHECK(!vocab.empty(), "[qwen_tokenizer] {}: the vocabulary is empty", source);
  int32_t max_id = 0;
  for (const auto& [tok, id] : vocab) max_id = std::max(max_id, id);
  tokens.assign(static_cast<size_t>(max_id) + 1, std::string());
  for (const auto& [tok, id] : vocab) {
    KILN_CHECK(tokens[id].empty(), "[qwen_tokenizer] {}: id {} is used by '{}' and '{}'", source,
               id, tokens[id], tok);
    KILN_CHECK(!tok.empty(), "[qwen_tokenizer] {}: empty token for id {}", source, id);
    tokens[id] = tok;
  }
}

}  // namespace

std::unique_ptr<QwenTokenizer> QwenTokenizer::from_dir(const std::string& dir) {
  KILN_CHECK(fs::is_directory(dir), "[qwen_tokenizer] '{}' is not a directory", dir);
  const fs::path d(dir);
  const std::string config = fs::exists(d / "tokenizer_config.json")
                                 ? (d / "tokenizer_config.json").string()
                                 : std::string();
  if (fs::exists(d / "tokenizer.json"))
    return from_tokenizer_json((d / "tokenizer.json").string(), config);
  KILN_CHECK(fs::exists(d / "vocab.json"),
             "[qwen_tokenizer] {}: neither tokenizer.json nor vocab.json is there", dir);
  KILN_CHECK(fs::exists(d / "merges.txt"),
             "[qwen_tokenizer] {}: vocab.json is there but merges.txt is missing", dir);
  return from_vocab_merges((d / "vocab.json").string(), (d / "merges.txt").string(), config);
}

std::unique_ptr<QwenTokenizer> QwenTokenizer::from_tokenizer_json(const std::string& path,
                                                                  const std::string& config_path) {
  std::unique_ptr<QwenTokenizer> t(new QwenTokenizer());
  BpeJsonReader r(BpeJsonReader::Mode::kTokenizerJson, path);
  read_bpe_json(r, path, "tokenizer.json");
  KILN_CHECK(r.has_model, "[qwen_tokenizer] {}: no \"model\" object", path);
  KILN_CHECK(r.model_type.empty() || r.model_type == "BPE",
             "[qwen_tokenizer] {}: model type '{}' is not BPE", path, r.model_type);
  KILN_CHECK(r.has_vocab, "[qwen_tokenizer] {}: model has no vocab object", path);
  KILN_CHECK(r.has_merges, "[qwen_tokenizer] {}: model has no merges array", path);
  load_vocab(r.vocab, path, t->tokens_);
  t->ignore_merges_ = r.ignore_merges;
  std::vector<std::pair<std::string, std::string>> merges = std::move(r.merges);
  std::vector<AddedToken> added = std::move(r.added);
  t->finish(path, std::move(merges), std::move(added), config_path, /*builtin_added=*/false);
  return t;
}

std::unique_ptr<QwenTokenizer> QwenTokenizer::from_vocab_merges(const std::string& vocab_path,
                                                                const std::string& merges_path,
                                                                const std::string& config_path) {
  std::unique_ptr<QwenTokenizer> t(new QwenTokenizer());
  {
    BpeJsonReader r(BpeJsonReader::Mode::kVocab, vocab_path);
    read_bpe_json(r, vocab_path, "vocab.json");
    load_vocab(r.vocab, vocab_path, t->tokens_);
  }

  KILN_CHECK(fs::exists(merges_path), "[qwen_tokenizer] merges.txt '{}' does not exist",
             merges_path);
  MappedFile f(merges_path);
  std::string_view text(reinterpret_cast<const char*>(f.data()), f.size());
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(text.size() / 11);
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF files
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t sp = line.find(' ');
    KILN_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                   line.find(' ', sp + 1) == std::string_view::npos,
               "[qwen_tokenizer] {}: line {} '{}' is not two tokens separated by a space",
               merges_path, line_no, line);
    merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
  }

  // Added tokens: from tokenizer_config.json when it lists them (read in finish()), else built in.
  t->finish(vocab_path + " + " + merges_path, std::move(merges), {}, config_path,
            /*builtin_added=*/true);
  return t;
}

std::unique_ptr<QwenTokenizer> QwenTokenizer::from_parts(
    const std::vector<std::pair<std::string, int32_t>>& vocab,
    std::vector<std::pair<std::string, std::string>> merges, std::vector<AddedToken> added,
    int32_t eos_id, const std::vector<int32_t>& unused_ids, const std::string& source) {
  std::unique_ptr<QwenTokenizer> t(new QwenTokenizer());
  load_vocab(vocab, source, t->tokens_);
  t->finish(source, std::move(merges), std::move(added), {}, /*builtin_added=*/false);
  const auto is_unused = [&](int32_t id) {
    return std::find(unused_ids.begin(), unused_ids.end(), id) != unused_ids.end();
  };
  size_t end = t->bytes_.size();
  if (eos_id >= 0 && static_cast<size_t>(eos_id) >= end && is_unused(eos_id))
    end = static_cast<size_t>(eos_id) + 1;
  t->bytes_.resize(end);
  t->tokens_.resize(end);
  t->kind_.resize(end, 0);
  for (int32_t id : unused_ids)
    if (id >= 0 && static_cast<size_t>(id) < end && t->kind_[static_cast<size_t>(id)] == 0)
      t->kind_[static_cast<size_t>(id)] = 4;
  if (eos_id >= 0) {
    t->check_id(eos_id);
    t->eos_id_ = eos_id;
  }
  return t;
}

std::vector<std::pair<std::string, std::string>> QwenTokenizer::merge_list() const {
  std::vector<std::pair<int32_t, uint64_t>> by_rank;
  by_rank.reserve(merges_.size());
  for (const auto& [key, v] : merges_) by_rank.emplace_back(v.first, key);
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(by_rank.size());
  for (const auto& [rank, key] : by_rank)
    out.emplace_back(tokens_[key >> 32], tokens_[key & 0xffffffffu]);
  return out;
}

void QwenTokenizer::finish(const std::string& source,
                           std::vector<std::pair<std::string, std::string>> merges,
                           std::vector<AddedToken> added, const std::string& config_path,
                           bool builtin_added) {
  source_ = source;
  ids_.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id)
    if (!tokens_[id].empty()) ids_.emplace(tokens_[id], static_cast<int32_t>(id));

  for (int b = 0; b < 256; ++b) {
    std::string sym;
    unicode::utf8_append(sym, byte_to_cp()[b]);
    auto it = ids_.find(sym);
    KILN_CHECK(it != ids_.end(),
               "[qwen_tokenizer] {}: the vocabulary has no token '{}' for byte 0x{:02x}; a "
               "byte-level BPE needs all 256",
               source, sym, b);
    byte_id_[b] = it->second;
  }

  // Merges: both halves and their concatenation must be tokens. A repeated pair keeps its last
  // rank, as HF's loader (a map filled in file order) does.
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = ids_.find(a), ib = ids_.find(b);
    KILN_CHECK(ia != ids_.end(),
               "[qwen_tokenizer] {}: merge {} '{} {}': '{}' is not in the vocabulary", source,
               r + 1, a, b, a);
    KILN_CHECK(ib != ids_.end(),
               "[qwen_tokenizer] {}: merge {} '{} {}': '{}' is not in the vocabulary", source,
               r + 1, a, b, b);
    joined = a;
    joined += b;
    auto ij = ids_.find(joined);
    KILN_CHECK(ij != ids_.end(),
               "[qwen_tokenizer] {}: merge {} '{} {}': the result '{}' is not in the vocabulary",
               source, r + 1, a, b, joined);
    const uint64_t key =
        (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges_.insert_or_assign(key, std::pair{static_cast<int32_t>(r), ij->second});
  }

  TokenizerConfig cfg;
  if (!config_path.empty()) {
    cfg = read_tokenizer_config(config_path);
    if (added.empty()) added = std::move(cfg.added);
  }
  if (added.empty() && builtin_added) {
    const int32_t base = static_cast<int32_t>(tokens_.size());
    for (size_t k = 0; k < std::size(kQwenAdded); ++k)
      added.push_back(
          {base + static_cast<int32_t>(k), kQwenAdded[k].content, kQwenAdded[k].special});
  }

  // Ids -> bytes. Added tokens may extend the id range or take over an existing id.
  bytes_.resize(tokens_.size());
  kind_.assign(tokens_.size(), 0);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].empty()) continue;
    bytes_[id] = spelling_to_bytes(tokens_[id]);
    kind_[id] = 1;
  }
  std::sort(added.begin(), added.end(),
            [](const AddedToken& x, const AddedToken& y) { return x.id < y.id; });
  for (size_t k = 0; k < added.size(); ++k) {
    const AddedToken& a = added[k];
    KILN_CHECK(!a.content.empty(), "[qwen_tokenizer] {}: added token {} is empty", source, a.id);
    KILN_CHECK(k == 0 || added[k - 1].id != a.id,
               "[qwen_tokenizer] {}: added token id {} appears twice", source, a.id);
    const size_t id = static_cast<size_t>(a.id);
    if (id >= bytes_.size()) {
      bytes_.resize(id + 1);
      tokens_.resize(id + 1);
      kind_.resize(id + 1, 0);
    }
    bytes_[id] = a.content;
    tokens_[id] = a.content;
    kind_[id] = a.special ? 3 : 2;
  }
  added_ = std::move(added);
  added_by_len_.resize(added_.size());
  for (size_t k = 0; k < added_.size(); ++k) added_by_len_[k] = static_cast<int32_t>(k);
  std::stable_sort(added_by_len_.begin(), added_by_len_.end(), [&](int32_t x, int32_t y) {
    return added_[x].content.size() > added_[y].content.size();
  });

  if (cfg.eos_token) {
    eos_id_ = token_to_id(*cfg.eos_token);
    KILN_CHECK(eos_id_ >= 0, "[qwen_tokenizer] {}: eos_token '{}' is not a token", config_path,
               *cfg.eos_token);
  } else {
    eos_id_ = token_to_id("<|endoftext|>");
  }
}

// ---- lookups ----------------------------------------------------------------------------------

int32_t QwenTokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  auto it = ids_.find(std::string(token));
  return it == ids_.end() ? -1 : it->second;
}

const std::string& QwenTokenizer::token(int32_t id) const {
  check_id(id);
  return tokens_[static_cast<size_t>(id)];
}

bool QwenTokenizer::is_special(int32_t id) const {
  check_id(id);
  return kind_[static_cast<size_t>(id)] == 3;
}

std::string QwenTokenizer::decode(int32_t, int32_t id) const {
  check_id(id);
  KILN_CHECK(kind_[static_cast<size_t>(id)] != 0, "[tokenizer] qwen: id {} has no token", id);
  return bytes_[static_cast<size_t>(id)];  // empty for an unused id
}

// ---- encoding ---------------------------------------------------------------------------------

std::vector<int32_t> QwenTokenizer::bpe(std::string_view word) const {
  const int n = static_cast<int>(word.size());
  std::vector<int32_t> sym(word.size());
  for (int i = 0; i < n; ++i) sym[i] = byte_id_[static_cast<unsigned char>(word[i])];
  if (ignore_merges_ && n > 1) {
    auto it = ids_.find(bytes_to_spelling(word));
    if (it != ids_.end()) return {it->second};
  }
  if (n < 2) return sym;

  // Symbols form a linked list; the heap holds candidate pairs (rank, left index). A candidate is
  // stale when either side has merged since (version changed) or the pair is no longer adjacent.
  std::vector<int> next(n), prev(n), ver(n, 0);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int left, right, lver, rver;
    int32_t id;
  };
  auto later = [](const Cand& x, const Cand& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.left > y.left;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(later)> heap(later);
  auto consider = [&](int l) {
    if (l < 0 || next[l] < 0) return;
    const int r = next[l];
    auto it = merges_.find((static_cast<uint64_t>(sym[l]) << 32) | static_cast<uint32_t>(sym[r]));
    if (it != merges_.end()) heap.push({it->second.first, l, r, ver[l], ver[r], it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (next[c.left] != c.right || ver[c.left] != c.lver || ver[c.right] != c.rver) continue;
    sym[c.left] = c.id;
    ++ver[c.left];
    ++ver[c.right];
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    next[c.right] = -2;  // dead
    consider(prev[c.left]);
    consider(c.left);
  }
  std::vector<int32_t> out;
  for (int i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
  return out;
}

void QwenTokenizer::encode_span(std::string_view raw, std::vector<int32_t>& out) const {
  if (raw.empty()) return;
  const std::string text = unicode::nfc(raw);
  auto add_word = [&](size_t s, size_t e) {
    const std::string_view w(text.data() + s, e - s);
    {
      std::lock_guard<std::mutex> lock(cache_->mu);
      auto it = cache_->words.find(std::string(w));
      if (it != cache_->words.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids = bpe(w);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->words.size() >= kCacheMax) cache_->words.clear();
    cache_->words.emplace(std::string(w), std::move(ids));
  };

  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(regex_->code, nullptr), &pcre2_match_data_free);
  KILN_CHECK(md, "[qwen_tokenizer] out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t off = 0;
  while (off < text.size()) {
    const int rc = pcre2_match(regex_->code, subject, text.size(), off, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    KILN_CHECK(rc >= 0, "[qwen_tokenizer] pre-tokenizer regex failed with PCRE2 error {}", rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t s = ov[0], e = ov[1];
    KILN_CHECK(e > s && s >= off && e <= text.size(),
               "[qwen_tokenizer] pre-tokenizer regex returned an empty or bad match at {}", s);
    // Only bytes the regex cannot see (invalid UTF-8) fall between matches: a word of their own.
    if (s > off) add_word(off, s);
    add_word(s, e);
    off = e;
  }
  if (off < text.size()) add_word(off, text.size());
}

std::vector<int32_t> QwenTokenizer::encode(std::string_view text, bool, bool eos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  bool first_byte[256] = {};
  for (const AddedToken& a : added_) first_byte[static_cast<unsigned char>(a.content[0])] = true;
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t hit = -1;
    if (first_byte[static_cast<unsigned char>(text[pos])]) {
      for (int32_t k : added_by_len_) {  // longest first
        if (text.substr(pos).starts_with(added_[k].content)) {
          hit = k;
          break;
        }
      }
    }
    if (hit < 0) {
      ++pos;
      continue;
    }
    encode_span(text.substr(start, pos - start), out);
    out.push_back(added_[hit].id);
    pos += added_[hit].content.size();
    start = pos;
  }
  encode_span(text.substr(start), out);
  if (eos && eos_id_ >= 0) out.push_back(eos_id_);
  return out;
}

// ---- streaming --------------------------------------------------------------------------------

namespace {

// Length of the trailing bytes of `s` that start a valid UTF-8 sequence but do not finish it.
size_t incomplete_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[n - k]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    if (b < 0xC2 || b > 0xF4 || need <= k) return 0;  // ASCII, invalid lead, or complete
    if (k >= 2) {  // the second byte's tighter ranges (no overlongs, surrogates, > U+10FFFF)
      const auto c = static_cast<unsigned char>(s[n - k + 1]);
      if ((b == 0xE0 && c < 0xA0) || (b == 0xED && c > 0x9F) || (b == 0xF0 && c < 0x90) ||
          (b == 0xF4 && c > 0x8F))
        return 0;
    }
    return k;
  }
  return 0;
}

}  // namespace

std::string Utf8StreamDecoder::push(int32_t id) {
  if (id >= 0 && (id == tok_.bos_id() || id == tok_.eos_id())) {
    tok_.decode(prev_, id);  // range check only
    prev_ = id;
    return {};
  }
  pending_ += tok_.decode(prev_, id);
  prev_ = id;
  const size_t hold = incomplete_tail(pending_);
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string Utf8StreamDecoder::flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  prev_ = -1;
  return out;
}

}  // namespace kiln::io
