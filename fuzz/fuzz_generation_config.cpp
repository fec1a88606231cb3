// libFuzzer target: a Hugging Face generation_config.json, read by load_generation_config.
#include "fuzz/fuzz_util.h"
#include "models/generation_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      kiln::fuzz::write_file("generation_config.json", kiln::fuzz::as_view(data, size));
  kiln::fuzz::expect_clean([&] {
    kiln::models::GenerationConfig g = kiln::models::load_generation_config(path);
    (void)g.sampling(1);
  });
  return 0;
}
