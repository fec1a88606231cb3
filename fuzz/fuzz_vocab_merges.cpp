// libFuzzer target: vocab.json NUL merges.txt [NUL tokenizer_config.json], read by
// QwenTokenizer::from_vocab_merges.
#include "fuzz/qwen_use.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = kiln::fuzz::split_parts(data, size, 3);
  const std::string vocab = kiln::fuzz::write_file("vocab.json", parts[0]);
  const std::string merges = kiln::fuzz::write_file("merges.txt", parts[1]);
  std::string config;
  if (!parts[2].empty()) config = kiln::fuzz::write_file("tokenizer_config.json", parts[2]);
  kiln::fuzz::expect_clean([&] {
    auto tok = kiln::io::QwenTokenizer::from_vocab_merges(vocab, merges, config);
    kiln::fuzz::use_qwen_tokenizer(*tok);
  });
  return 0;
}
