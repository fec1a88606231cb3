// Qwen2 / Qwen2.5 / Qwen3 byte-level BPE tokenizer (the Hugging Face "tokenizers" pipeline these
// models ship): added tokens are cut out of the raw text first (leftmost, then longest), each
// remaining span is NFC-normalised, split by the Qwen pre-tokenizer regex (PCRE2, UTF + UCP), its
// bytes mapped to GPT-2's byte-to-unicode alphabet, and merged by BPE in merge-rank order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "models/io/tokenizer.h"

namespace kiln::io {

// Turns a stream of token ids into text that never ends inside a UTF-8 character: the bytes of an
// incomplete but so-far valid trailing sequence are held back until a later token completes them.
// Invalid bytes pass through unchanged, and BOS/EOS ids print nothing, so the concatenation of all
// push() results and flush() equals tok.decode(ids). Works with any Tokenizer.
class Utf8StreamDecoder {
 public:
  explicit Utf8StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  // Text that is complete after `id` (may be empty). Throws on an id out of range.
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete sequence at the very end), then resets.
  std::string flush();
  // Bytes currently held back (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  int32_t prev_ = -1;
  std::string pending_;
};

// Token ids at or above this are refused in every Qwen tokenizer file: the tables are sized by
// the largest id, and Qwen's vocabulary has 151,669.
inline constexpr int64_t kQwenMaxVocab = 10'000'000;

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;  // "special" in HF terms (e.g. <|im_end|>); <think> is added but not special
};

class QwenTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;
  using StreamDecoder = Utf8StreamDecoder;

  // A folder with tokenizer.json, or with vocab.json + merges.txt [+ tokenizer_config.json].
  // tokenizer.json wins when both are there; tokenizer_config.json's eos_token is used either way.
  static std::unique_ptr<QwenTokenizer> from_dir(const std::string& dir);
  // HF tokenizer.json: "model": {"vocab": {...}, "merges": ["a b", ...] or [["a", "b"], ...]},
  // "added_tokens": [{"id", "content", "special"}, ...].
  static std::unique_ptr<QwenTokenizer> from_tokenizer_json(const std::string& path,
                                                            const std::string& config_path = {});
  // vocab.json + merges.txt (optional "#version" first line). Added tokens come from
  // tokenizer_config.json's "added_tokens_decoder" when config_path is given, otherwise from the
  // built-in Qwen2.5/Qwen3 table (<|endoftext|> ... </think>, numbered from the vocabulary's end,
  // i.e. 151643..151668 for Qwen's own vocab.json).
  static std::unique_ptr<QwenTokenizer> from_vocab_merges(const std::string& vocab_path,
                                                          const std::string& merges_path,
                                                          const std::string& config_path = {});
  // From its parts, as GGUF's tokenizer.ggml.* lists hold them (models/io/gguf_tokenizer.h):
  // vocabulary (spelling, id) pairs, merges in rank order, added tokens, the EOS id (-1:
  // <|endoftext|>'s), and the ids listed as unused (the [PAD...] slots of a padded vocabulary).
  // Unused ids inside the id range, and the EOS id when it names one, are ids without text: they
  // decode to nothing, as in llama.cpp. (llama.cpp's converter, given a folder without
  // tokenizer.json, writes <|im_end|>'s id 151645 as EOS and that slot as [PAD151645].)
  // `source` names the origin in messages.
  static std::unique_ptr<QwenTokenizer> from_parts(
      const std::vector<std::pair<std::string, int32_t>>& vocab,
      std::vector<std::pair<std::string, std::string>> merges, std::vector<AddedToken> added,
      int32_t eos_id, const std::vector<int32_t>& unused_ids, const std::string& source);
  ~QwenTokenizer() override;

  // No BOS exists, so `bos` is ignored; `eos` appends eos_id() when there is one.
  std::vector<int32_t> encode(std::string_view text, bool bos = false,
                              bool eos = false) const override;
  // The raw bytes of `id` (added tokens give their content). A multi-byte character may be split
  // across tokens, so print through a StreamDecoder.
  std::string decode(int32_t prev, int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(bytes_.size()); }
  int32_t eos_id() const override { return eos_id_; }
  std::string name() const override { return "qwen"; }

  // Id of a token in its vocab.json spelling ("Ġthe") or of an added token's content; -1 if none.
  int32_t token_to_id(std::string_view token) const;
  // vocab.json spelling of `id` (added tokens: their content).
  const std::string& token(int32_t id) const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  size_t num_merges() const { return merges_.size(); }
  // The merges in rank order, in vocab.json spelling (for writers).
  std::vector<std::pair<std::string, std::string>> merge_list() const;

  // Ids of one pre-token (already NFC-normalised and split), by BPE alone. Exposed for tests.
  std::vector<int32_t> bpe(std::string_view word) const;

 private:
  struct Regex;
  struct Cache;
  QwenTokenizer();
  // Shared tail of the loaders: checks merges, builds lookup tables.
  void finish(const std::string& source, std::vector<std::pair<std::string, std::string>> merges,
              std::vector<AddedToken> added, const std::string& config_path, bool builtin_added);
  void encode_span(std::string_view text, std::vector<int32_t>& out) const;

  std::string source_;               // file name(s), for messages
  std::vector<std::string> tokens_;  // id -> vocab.json spelling ("" for gaps)
  std::vector<std::string> bytes_;   // id -> decoded bytes
  // id -> 0 none, 1 vocab, 2 added, 3 added special, 4 unused (an id without text)
  std::vector<uint8_t> kind_;
  std::unordered_map<std::string, int32_t> ids_;  // vocab.json spelling -> id
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  int32_t byte_id_[256];               // id of each single byte's token
  std::vector<AddedToken> added_;      // by id
  std::vector<int32_t> added_by_len_;  // indices into added_, longest content first
  int32_t eos_id_ = -1;
  bool ignore_merges_ = false;  // tokenizer.json model.ignore_merges: whole-word lookup first
  std::unique_ptr<Regex> regex_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace kiln::io
