// libFuzzer target: a GGUF file (header, typed metadata, tensor infos, aligned data), read by
// GgufFile; every accepted tensor's first and last bytes and every metadata value are touched
// so ASan sees any out-of-range span.
#include "fuzz/fuzz_util.h"
#include "models/gguf_model.h"
#include "models/io/gguf.h"
#include "models/io/gguf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln::fuzz::write_file("model.gguf", kiln::fuzz::as_view(data, size));
  kiln::fuzz::expect_clean([&] {
    kiln::io::GgufFile f(path);
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors()) {
      (void)t.numel();
      (void)t.shape();
      if (t.nbytes > 0) sink = sink + f.data(t)[0] + f.data(t)[t.nbytes - 1];
      (void)f.find(t.name);
    }
    // Not dump(): GGUF strings may hold any bytes, and JSON text needs UTF-8.
    for (const auto& [k, v] : f.metadata())
      sink = sink + static_cast<uint8_t>(k.size() + (v.value.is_array() ? v.value.size() : 1));
    (void)f.get_int("general.alignment");
    // The tokenizer it carries (tokenizer.ggml.*); its errors are clean refusals too.
    try {
      (void)kiln::io::gguf_tokenizer(f);
    } catch (const kiln::Error&) {
    }
    // The model config from the metadata, as kiln generate --model file.gguf reads it.
    (void)kiln::models::gguf_model_config(f);
  });
  return 0;
}
