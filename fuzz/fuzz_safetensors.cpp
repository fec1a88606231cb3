// libFuzzer target: a safetensors file (u64 header length, JSON header, data section), read by
// SafetensorsFile; every accepted entry's bytes are touched so ASan sees any out-of-range span.
#include "fuzz/fuzz_util.h"
#include "models/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      kiln::fuzz::write_file("model.safetensors", kiln::fuzz::as_view(data, size));
  kiln::fuzz::expect_clean([&] {
    kiln::io::SafetensorsFile f(path);
    volatile uint8_t sink = 0;
    for (const auto& e : f.entries()) {
      (void)e.numel();
      if (e.nbytes() > 0) sink = sink + f.data(e)[0] + f.data(e)[e.nbytes() - 1];
      (void)f.at(e.name);
    }
    (void)f.find("missing");
    for (const auto& [k, v] : f.metadata()) sink = sink + static_cast<uint8_t>(k.size() + v.size());
  });
  return 0;
}
