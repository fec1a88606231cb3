// libFuzzer target: a llama2.c model .bin (legacy or version 1), read by load_llama2c_bin; the
// first and last float of every tensor are touched so ASan sees any segment past the mapping.
#include "fuzz/fuzz_util.h"
#include "models/io/llama2c_bin.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln::fuzz::write_file("model.bin", kiln::fuzz::as_view(data, size));
  kiln::fuzz::expect_clean([&] { (void)kiln::io::read_llama2c_config(path); });
  kiln::fuzz::expect_clean([&] {
    kiln::io::Llama2cCheckpoint ck = kiln::io::load_llama2c_bin(path);
    volatile float sink = 0;
    for (const auto& [name, t] : ck.tensors) {
      auto v = t.values();
      if (!v.empty()) sink = sink + v.front() + v.back();
    }
  });
  return 0;
}
