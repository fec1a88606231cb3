// Tokenizers behind one small interface: byte-level (vocab 256), char-level
// (nanoGPT shakespeare_char style) and llama2.c's tokenizer.bin (SentencePiece
// Llama-2 vocabulary, encoded exactly as run.c does). A Qwen byte-level BPE
// tokenizer will sit behind the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids for `text`. bos/eos add those tokens; ignored when the tokenizer has none.
  virtual std::vector<int32_t> encode(std::string_view text, bool bos = false,
                                      bool eos = false) const = 0;
  // The text piece of `id` when it follows `prev` (-1 at the start): for streaming output.
  virtual std::string decode(int32_t prev, int32_t id) const = 0;
  // A whole sequence, the inverse of encode(): BOS/EOS ids are dropped.
  virtual std::string decode(std::span<const int32_t> ids) const;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const { return -1; }  // -1: none
  virtual int32_t eos_id() const { return -1; }
  virtual std::string name() const = 0;

 protected:
  // Throws "[tokenizer] <name>: token id X out of range [0, V)".
  void check_id(int32_t id) const;
};

// ids are bytes.
class ByteTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;
  std::vector<int32_t> encode(std::string_view text, bool bos = false,
                              bool eos = false) const override;
  std::string decode(int32_t prev, int32_t id) const override;
  int32_t vocab_size() const override { return 256; }
  std::string name() const override { return "byte"; }
};

// ids index the sorted set of distinct bytes of a training text (tinyshakespeare
// gives 65). Works on bytes, which equals nanoGPT's characters for ASCII text.
class CharTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;
  // Throws on empty text.
  static CharTokenizer from_text(std::string_view training_text);
  // `chars` as returned by serialize(): distinct bytes in increasing order.
  static CharTokenizer from_serialized(std::string_view chars);
  // The vocabulary as a string: byte of id i at position i.
  std::string serialize() const { return chars_; }

  // Throws kiln::Error naming the first character not in the vocabulary.
  std::vector<int32_t> encode(std::string_view text, bool bos = false,
                              bool eos = false) const override;
  std::string decode(int32_t prev, int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(chars_.size()); }
  std::string name() const override { return "char"; }

 private:
  explicit CharTokenizer(std::string chars);
  std::string chars_;
  int32_t id_of_[256];
};

// llama2.c tokenizer.bin: int32 max_token_length, then per token: float32
// score, int32 byte length, bytes (no terminator). Pieces use ' ' where
// SentencePiece uses U+2581; ids 3..258 are the byte pieces "<0x00>".."<0xFF>".
class Llama2cTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;
  // expected_vocab > 0 requires exactly that many tokens; otherwise all tokens to EOF are read.
  explicit Llama2cTokenizer(const std::string& path, int32_t expected_vocab = -1);
  // The same tokenizer from its pieces and scores, as a GGUF file's "llama" (SentencePiece)
  // tokenizer carries them (models/io/gguf_tokenizer.h). `source` names it in error messages.
  // The same checks as a file's: ids 3..258 are the byte pieces, " " is a piece.
  static std::unique_ptr<Llama2cTokenizer> from_pieces(std::vector<std::string> pieces,
                                                       std::vector<float> scores,
                                                       const std::string& source);

  // run.c encode(): [BOS] + dummy-prefix " " (if text is non-empty) + one token per UTF-8
  // codepoint (byte fallback id = byte + 3 when the codepoint has no token), then
  // repeatedly merge the adjacent pair whose concatenation is the highest-scoring token
  // (leftmost on ties) + [EOS]. Unlike C strings, a NUL byte does not end the text.
  std::vector<int32_t> encode(std::string_view text, bool bos = false,
                              bool eos = false) const override;
  // run.c decode(): drops the leading space after BOS; "<0xXX>" gives the raw byte.
  std::string decode(int32_t prev, int32_t id) const override;
  // SentencePiece-style: drops BOS/EOS and the dummy-prefix space of the first piece.
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  std::string name() const override { return "llama2c"; }

  const std::string& piece(int32_t id) const;  // raw piece as stored
  float score(int32_t id) const;
  int32_t max_token_length() const { return max_token_length_; }
  int32_t lookup(std::string_view piece) const;  // -1 when absent

 private:
  Llama2cTokenizer() = default;
  void index_pieces();  // the checks and tables after pieces_ and scores_ are read

  std::string path_;
  int32_t max_token_length_ = 0;
  std::vector<std::string> pieces_;
  std::vector<std::string> decoded_;  // piece with "<0xXX>" turned into its byte
  std::vector<float> scores_;
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // First id of each piece; transparent so lookups take string_views without copies.
  std::unordered_map<std::string, int32_t, PieceHash, std::equal_to<>> ids_;
  int32_t space_id_ = -1;
};

// "byte", "char" (vocabulary from training_text), "llama2c:PATH".
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view spec,
                                          std::string_view training_text = {});

}  // namespace kiln::io
