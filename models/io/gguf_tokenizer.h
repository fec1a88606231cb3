// The tokenizer a GGUF file carries (llama.cpp's tokenizer.ggml.* keys), read and written.
//
// tokenizer.ggml.model "gpt2" (byte-level BPE, Qwen's), read into a QwenTokenizer:
//   tokenizer.ggml.pre         "qwen2" (the pre-tokenizer split: kiln implements Qwen's only)
//   tokenizer.ggml.tokens      [string] by id, in vocab.json spelling ("Ġthe")
//   tokenizer.ggml.token_type  [i32] by id: 1 normal, 3 control (HF "special" added tokens),
//                              4 user-defined (other added tokens), 5 unused (padding ids)
//   tokenizer.ggml.merges      [string] "left right", in rank order
//   tokenizer.ggml.eos_token_id, .bos_token_id, .padding_token_id (u32)
// tokenizer.ggml.model "llama" (SentencePiece BPE, as llama.cpp's converter writes LLaMA's and
// llama2.c's), read into a Llama2cTokenizer, the pieces llama2.c's exporter would have written:
//   tokenizer.ggml.tokens      [string] SentencePiece pieces ("▁the"; "▁" becomes " ")
//   tokenizer.ggml.scores      [f32] the merge scores
//   tokenizer.ggml.token_type  [i32] 1 normal, 2 unknown (<unk>, id 0), 3 control (<s> 1,
//                              </s> 2: "\n<s>\n" and "\n</s>\n" as llama2.c spells them, so
//                              no text merges into them), 6 byte (<0x00>..<0xFF>, ids 3..258)
//   tokenizer.ggml.bos_token_id 1, .eos_token_id 2, .unknown_token_id 0 (others are refused:
//                              kiln's SentencePiece encoder has those ids built in)
#pragma once

#include <memory>

#include "models/io/gguf.h"
#include "models/io/qwen_tokenizer.h"
#include "models/io/tokenizer.h"

namespace kiln::io {

// The file's tokenizer, or null when it has none (no tokenizer.ggml.model). Other models and
// pre-tokenizers, and malformed lists, are refused by name: "[gguf] <path>: ...".
std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f);
// The same for a file whose model is "gpt2" (resp. "llama"); any other model is refused.
std::unique_ptr<QwenTokenizer> gguf_bpe_tokenizer(const GgufFile& f);
std::unique_ptr<Llama2cTokenizer> gguf_spm_tokenizer(const GgufFile& f);

// Adds t's tokenizer.ggml.* keys to md, with `vocab_size` token ids (the model's embedding rows:
// ids past the tokenizer's are "[PAD<id>]", unused, as llama.cpp's converter writes them).
void add_gguf_tokenizer_metadata(const QwenTokenizer& t, std::int64_t vocab_size, GgufMetadata& md);
// The "llama" keys of a llama2.c tokenizer (vocab_size must equal its size).
void add_gguf_tokenizer_metadata(const Llama2cTokenizer& t, std::int64_t vocab_size,
                                 GgufMetadata& md);
// Whichever of the two t is; other tokenizers (byte, char) add nothing and return false.
bool add_gguf_tokenizer_metadata(const Tokenizer& t, std::int64_t vocab_size, GgufMetadata& md);

}  // namespace kiln::io
