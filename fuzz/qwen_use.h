// What the two Qwen tokenizer targets do with a tokenizer that loaded: encode a fixed text that
// reaches added tokens, NFC, the pre-tokenizer regex and BPE, and decode every id back.
#pragma once

#include "fuzz/fuzz_util.h"
#include "models/io/qwen_tokenizer.h"

namespace kiln::fuzz {

inline void use_qwen_tokenizer(const io::QwenTokenizer& tok) {
  const char* text =
      "Hello world, caf\xc3\xa9 e\xcc\x81 123 <|im_end|> <think>x</think>\n\n  \xf0\x9f\x99\x82";
  expect_clean([&] {
    std::vector<int32_t> ids = tok.encode(text, false, true);
    io::Utf8StreamDecoder dec(tok);
    for (int32_t id : ids) (void)dec.push(id);
    (void)dec.flush();
  });
  const int32_t n = tok.vocab_size();
  for (int32_t id = 0; id < n && id < 64; ++id)
    expect_clean([&] {
      (void)tok.token(id);
      (void)tok.is_special(id);
      (void)tok.decode(-1, id);
    });
}

}  // namespace kiln::fuzz
