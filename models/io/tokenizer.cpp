// Byte, char and llama2.c tokenizers. The llama2.c encoder gives the same ids
// as run.c's encode() (checked against a literal Python port in the tests),
// but finds merges with a heap instead of a full rescan per merge, so long
// texts cost O(n log n) instead of O(n^2).
#include "models/io/tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <queue>

#include "kernels/common/error.h"
#include "models/io/mapped_file.h"
#include "models/io/qwen_tokenizer.h"

namespace kiln::io {

void Tokenizer::check_id(int32_t id) const {
  KILN_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] {}: token id {} out of range [0, {})",
             name(), id, vocab_size());
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  int32_t prev = -1;
  for (int32_t id : ids) {
    if (id >= 0 && (id == bos_id() || id == eos_id())) {
      check_id(id);
      prev = id;
      continue;
    }
    out += decode(prev, id);
    prev = id;
  }
  return out;
}

// ---- byte -------------------------------------------------------------------

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool, bool) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(int32_t, int32_t id) const {
  check_id(id);
  return std::string(1, static_cast<char>(id));
}

// ---- char -------------------------------------------------------------------

CharTokenizer::CharTokenizer(std::string chars) : chars_(std::move(chars)) {
  std::fill(std::begin(id_of_), std::end(id_of_), -1);
  for (size_t i = 0; i < chars_.size(); ++i)
    id_of_[static_cast<unsigned char>(chars_[i])] = static_cast<int32_t>(i);
}

CharTokenizer CharTokenizer::from_text(std::string_view training_text) {
  KILN_CHECK(!training_text.empty(),
             "[tokenizer] char: empty training text, no vocabulary to build");
  bool seen[256] = {};
  for (char c : training_text) seen[static_cast<unsigned char>(c)] = true;
  std::string chars;
  for (int b = 0; b < 256; ++b)
    if (seen[b]) chars.push_back(static_cast<char>(b));
  return CharTokenizer(std::move(chars));
}

CharTokenizer CharTokenizer::from_serialized(std::string_view chars) {
  KILN_CHECK(!chars.empty(), "[tokenizer] char: empty serialized vocabulary");
  for (size_t i = 1; i < chars.size(); ++i)
    KILN_CHECK(static_cast<unsigned char>(chars[i - 1]) < static_cast<unsigned char>(chars[i]),
               "[tokenizer] char: serialized vocabulary is not strictly increasing at position {}",
               i);
  return CharTokenizer(std::string(chars));
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text, bool, bool) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    int32_t id = id_of_[c];
    if (id < 0) {
      bool printable = c >= 0x20 && c < 0x7f;
      fail(
          "[tokenizer] char: character {}(0x{:02x}) at byte {} is not in the {}-character "
          "vocabulary",
          printable ? fmt::format("'{}' ", static_cast<char>(c)) : std::string(), c, i,
          chars_.size());
    }
    ids[i] = id;
  }
  return ids;
}

std::string CharTokenizer::decode(int32_t, int32_t id) const {
  check_id(id);
  return std::string(1, chars_[static_cast<size_t>(id)]);
}

// ---- llama2.c -----------------------------------------------------------------

namespace {

// "<0xXX>" -> byte value, or -1.
int parse_byte_piece(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

constexpr int32_t kMaxVocab = 10'000'000;
constexpr int32_t kMaxTokenLen = 1024;

}  // namespace

Llama2cTokenizer::Llama2cTokenizer(const std::string& path, int32_t expected_vocab) : path_(path) {
  MappedFile f(path);
  const uint8_t* b = f.data();
  const uint64_t n = f.size();
  KILN_CHECK(n >= 4, "[llama2c_tokenizer] {}: file is {} bytes, too small for a header", path, n);
  std::memcpy(&max_token_length_, b, 4);
  KILN_CHECK(max_token_length_ >= 1 && max_token_length_ <= kMaxTokenLen,
             "[llama2c_tokenizer] {}: max_token_length = {} is out of range [1, {}]", path,
             max_token_length_, kMaxTokenLen);
  KILN_CHECK(expected_vocab <= kMaxVocab, "[llama2c_tokenizer] {}: expected vocab {} is too large",
             path, expected_vocab);
  uint64_t off = 4;
  while (expected_vocab > 0 ? pieces_.size() < static_cast<size_t>(expected_vocab) : off < n) {
    const size_t id = pieces_.size();
    KILN_CHECK(id < static_cast<size_t>(kMaxVocab), "[llama2c_tokenizer] {}: more than {} tokens",
               path, kMaxVocab);
    KILN_CHECK(n - off >= 8, "[llama2c_tokenizer] {}: truncated at token {} (byte {} of {})", path,
               id, off, n);
    float score;
    int32_t len;
    std::memcpy(&score, b + off, 4);
    std::memcpy(&len, b + off + 4, 4);
    off += 8;
    KILN_CHECK(std::isfinite(score), "[llama2c_tokenizer] {}: token {} has non-finite score", path,
               id);
    KILN_CHECK(len >= 0 && len <= max_token_length_,
               "[llama2c_tokenizer] {}: token {} has length {} outside [0, max_token_length = {}]",
               path, id, len, max_token_length_);
    KILN_CHECK(
        n - off >= static_cast<uint64_t>(len),
        "[llama2c_tokenizer] {}: truncated inside token {} (needs {} bytes at byte {} of {})", path,
        id, len, off, n);
    pieces_.emplace_back(reinterpret_cast<const char*>(b + off), static_cast<size_t>(len));
    scores_.push_back(score);
    off += static_cast<uint64_t>(len);
  }
  KILN_CHECK(off == n, "[llama2c_tokenizer] {}: {} trailing bytes after {} tokens", path, n - off,
             pieces_.size());
  index_pieces();
}

std::unique_ptr<Llama2cTokenizer> Llama2cTokenizer::from_pieces(std::vector<std::string> pieces,
                                                                std::vector<float> scores,
                                                                const std::string& source) {
  KILN_CHECK(pieces.size() == scores.size(), "[llama2c_tokenizer] {}: {} pieces but {} scores",
             source, pieces.size(), scores.size());
  KILN_CHECK(pieces.size() <= static_cast<size_t>(kMaxVocab),
             "[llama2c_tokenizer] {}: more than {} tokens", source, kMaxVocab);
  std::unique_ptr<Llama2cTokenizer> t(new Llama2cTokenizer());
  t->path_ = source;
  t->max_token_length_ = 1;
  for (size_t id = 0; id < pieces.size(); ++id) {
    KILN_CHECK(std::isfinite(scores[id]), "[llama2c_tokenizer] {}: token {} has non-finite score",
               source, id);
    KILN_CHECK(pieces[id].size() <= static_cast<size_t>(kMaxTokenLen),
               "[llama2c_tokenizer] {}: token {} is {} bytes, more than {}", source, id,
               pieces[id].size(), kMaxTokenLen);
    t->max_token_length_ = std::max(t->max_token_length_, static_cast<int32_t>(pieces[id].size()));
  }
  t->pieces_ = std::move(pieces);
  t->scores_ = std::move(scores);
  t->index_pieces();
  return t;
}

void Llama2cTokenizer::index_pieces() {
  const std::string& path = path_;
  // Ids 0..2 are <unk>, <s>, </s>; 3..258 the byte pieces that encode() falls back to.
  KILN_CHECK(pieces_.size() >= 259, "[llama2c_tokenizer] {}: {} tokens, need at least 259", path,
             pieces_.size());
  decoded_.resize(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    ids_.emplace(pieces_[i], static_cast<int32_t>(i));  // keeps the first id of a repeated piece
    int byte = parse_byte_piece(pieces_[i]);
    decoded_[i] = byte >= 0 ? std::string(1, static_cast<char>(byte)) : pieces_[i];
  }
  for (int byte = 0; byte < 256; ++byte)
    KILN_CHECK(parse_byte_piece(pieces_[byte + 3]) == byte,
               "[llama2c_tokenizer] {}: token {} is '{}', expected the byte piece <0x{:02X}>", path,
               byte + 3, pieces_[byte + 3], byte);
  space_id_ = lookup(" ");
  KILN_CHECK(space_id_ >= 0, "[llama2c_tokenizer] {}: no token for \" \" (the dummy prefix)", path);
}

const std::string& Llama2cTokenizer::piece(int32_t id) const {
  check_id(id);
  return pieces_[static_cast<size_t>(id)];
}

float Llama2cTokenizer::score(int32_t id) const {
  check_id(id);
  return scores_[static_cast<size_t>(id)];
}

int32_t Llama2cTokenizer::lookup(std::string_view p) const {
  auto it = ids_.find(p);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> Llama2cTokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<int32_t> tok;
  tok.reserve(text.size() + 3);
  if (bos) tok.push_back(1);
  if (!text.empty()) tok.push_back(space_id_);  // SentencePiece's add_dummy_prefix

  // One token per UTF-8 codepoint: gather a lead byte and up to 3 continuation
  // bytes (run.c caps the buffer at 4 bytes), then look the bytes up as a piece.
  std::string cp;
  for (size_t i = 0; i < text.size(); ++i) {
    cp.push_back(text[i]);
    bool next_is_cont =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_is_cont && cp.size() < 4) continue;
    int32_t id = lookup(cp);
    if (id >= 0) {
      tok.push_back(id);
    } else {
      for (char c : cp) tok.push_back(static_cast<unsigned char>(c) + 3);
    }
    cp.clear();
  }

  // Greedy merges. run.c rescans all pairs and merges the best-scoring one
  // (score > -1e10, leftmost on ties) until none is left. Here: a doubly linked
  // list over the tokens and a max-heap of candidate pairs keyed by (score, left
  // position); entries made stale by a merge are skipped via per-node versions.
  const int n = static_cast<int>(tok.size());
  if (n >= 2) {
    std::vector<int> prev(n), next(n), ver(n, 0);
    std::vector<char> alive(n, 1);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      float score;
      int left, right, lver, rver;
      int32_t id;
    };
    auto worse = [](const Cand& a, const Cand& b) {
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    std::string buf;
    auto consider = [&](int l) {
      if (l < 0) return;
      int r = next[l];
      if (r < 0) return;
      buf = pieces_[tok[l]];
      buf += pieces_[tok[r]];
      int32_t id = lookup(buf);
      if (id < 0 || !(scores_[id] > -1e10f)) return;
      heap.push({scores_[id], l, r, ver[l], ver[r], id});
    };
    for (int i = 0; i < n; ++i) consider(i);
    while (!heap.empty()) {
      Cand c = heap.top();
      heap.pop();
      if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || ver[c.left] != c.lver ||
          ver[c.right] != c.rver)
        continue;
      tok[c.left] = c.id;
      ++ver[c.left];
      alive[c.right] = 0;
      ++ver[c.right];
      next[c.left] = next[c.right];
      if (next[c.right] >= 0) prev[next[c.right]] = c.left;
      consider(prev[c.left]);
      consider(c.left);
    }
    std::vector<int32_t> merged;
    merged.reserve(n);
    for (int i = 0; i >= 0; i = next[i]) merged.push_back(tok[i]);
    tok = std::move(merged);
  }
  if (eos) tok.push_back(2);
  return tok;
}

std::string Llama2cTokenizer::decode(int32_t prev, int32_t id) const {
  check_id(id);
  const std::string& p = decoded_[static_cast<size_t>(id)];
  // Byte pieces never start with a space, so stripping before the byte lookup (as run.c does) is
  // the same.
  if (prev == 1 && !p.empty() && p[0] == ' ' && parse_byte_piece(pieces_[id]) < 0)
    return p.substr(1);
  return p;
}

std::string Llama2cTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    check_id(id);
    if (id == 1 || id == 2) continue;
    const std::string& p = decoded_[static_cast<size_t>(id)];
    if (first && !p.empty() && p[0] == ' ' && parse_byte_piece(pieces_[id]) < 0)
      out.append(p, 1, std::string::npos);
    else
      out += p;
    first = false;
  }
  return out;
}

// ---- factory ------------------------------------------------------------------

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view spec, std::string_view training_text) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (spec == "char")
    return std::make_unique<CharTokenizer>(CharTokenizer::from_text(training_text));
  constexpr std::string_view kLlama = "llama2c:";
  if (spec.substr(0, kLlama.size()) == kLlama) {
    std::string path(spec.substr(kLlama.size()));
    KILN_CHECK(!path.empty(), "[tokenizer] spec 'llama2c:' needs a path to tokenizer.bin");
    return std::make_unique<Llama2cTokenizer>(path);
  }
  constexpr std::string_view kQwen = "qwen:";
  if (spec.substr(0, kQwen.size()) == kQwen) {
    std::string dir(spec.substr(kQwen.size()));
    KILN_CHECK(!dir.empty(), "[tokenizer] spec 'qwen:' needs a model folder");
    return QwenTokenizer::from_dir(dir);
  }
  fail("[tokenizer] unknown tokenizer spec '{}' (expected byte, char, llama2c:PATH or qwen:DIR)",
       spec);
}

}  // namespace kiln::io
