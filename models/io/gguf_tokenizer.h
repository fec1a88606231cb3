// The tokenizer a GGUF file carries (llama.cpp's tokenizer.ggml.* keys), read and written.
//
//   tokenizer.ggml.model       "gpt2" (byte-level BPE; the only model kiln reads)
//   tokenizer.ggml.pre         "qwen2" (the pre-tokenizer split: kiln implements Qwen's only)
//   tokenizer.ggml.tokens      [string] by id, in vocab.json spelling ("Ġthe")
//   tokenizer.ggml.token_type  [i32] by id: 1 normal, 3 control (HF "special" added tokens),
//                              4 user-defined (other added tokens), 5 unused (padding ids)
//   tokenizer.ggml.merges      [string] "left right", in rank order
//   tokenizer.ggml.eos_token_id, .bos_token_id, .padding_token_id (u32)
#pragma once

#include <memory>

#include "models/io/gguf.h"
#include "models/io/qwen_tokenizer.h"

namespace kiln::io {

// The file's tokenizer, or null when it has none (no tokenizer.ggml.model). Other models and
// pre-tokenizers, and malformed lists, are refused by name: "[gguf] <path>: ...".
std::unique_ptr<QwenTokenizer> gguf_tokenizer(const GgufFile& f);

// Adds t's tokenizer.ggml.* keys to md, with `vocab_size` token ids (the model's embedding rows:
// ids past the tokenizer's are "[PAD<id>]", unused, as llama.cpp's converter writes them).
void add_gguf_tokenizer_metadata(const QwenTokenizer& t, std::int64_t vocab_size, GgufMetadata& md);

}  // namespace kiln::io
