// libFuzzer target: a llama2.c tokenizer.bin, read by Llama2cTokenizer, then used to encode and
// decode a fixed text (BPE merges by score, byte fallback, the dummy prefix).
#include "fuzz/fuzz_util.h"
#include "models/io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln::fuzz::write_file("tokenizer.bin", kiln::fuzz::as_view(data, size));
  kiln::fuzz::expect_clean([&] {
    kiln::io::Llama2cTokenizer tok(path);
    std::vector<int32_t> ids = tok.encode("Once upon a time, caf\xc3\xa9 \xff\x01 ok", true, true);
    (void)tok.decode(ids);
    int32_t prev = -1;
    for (int32_t id : ids) {
      (void)tok.decode(prev, id);
      prev = id;
    }
  });
  return 0;
}
