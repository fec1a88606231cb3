// Hugging Face tokenizer_config.json: the fields that say how a tokenizer.json / vocab.json
// tokenizer is used (its special tokens, whether BOS/EOS are added, the added tokens of a
// vocab.json + merges.txt folder, the chat template). Every one is type-checked, so a wrongly
// typed field is refused with the file and field named instead of nlohmann's bare type_error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "models/io/qwen_tokenizer.h"

namespace kiln::io {

struct TokenizerConfig {
  // "eos_token" etc.: a token's content, given as "<|im_end|>" or {"content": "<|im_end|>", ...};
  // absent or null: none named.
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;  // absent or null: the tokenizer's default
  std::vector<AddedToken> added;  // "added_tokens_decoder" {"151643": {"content", "special"}}
};

// Reads and checks the tokenizer_config.json at `path`: a regular file, size and nesting bounded
// by JsonLimits' defaults. Errors start "[tokenizer] tokenizer_config.json at <path>: ", or
// "[json] tokenizer_config.json at <path>: " for text that is not JSON, too large or too deep.
TokenizerConfig read_tokenizer_config(const std::string& path);

}  // namespace kiln::io
