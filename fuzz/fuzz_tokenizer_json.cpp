// libFuzzer target: a Qwen tokenizer.json, optionally followed by a NUL and a
// tokenizer_config.json, read by QwenTokenizer::from_tokenizer_json.
#include "fuzz/qwen_use.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = kiln::fuzz::split_parts(data, size, 2);
  const std::string path = kiln::fuzz::write_file("tokenizer.json", parts[0]);
  std::string config;
  if (!parts[1].empty()) config = kiln::fuzz::write_file("tokenizer_config.json", parts[1]);
  kiln::fuzz::expect_clean([&] {
    auto tok = kiln::io::QwenTokenizer::from_tokenizer_json(path, config);
    kiln::fuzz::use_qwen_tokenizer(*tok);
  });
  return 0;
}
