// libFuzzer target: a Hugging Face config.json, read by load_hf_config (the path `kiln generate`
// and load_model take).
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "models/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln::fuzz::write_file("config.json", kiln::fuzz::as_view(data, size));
  kiln::fuzz::expect_clean([&] {
    kiln::models::ModelConfig c = kiln::models::load_hf_config(path);
    (void)c.to_json();
  });
  return 0;
}
