// libFuzzer target: model.safetensors.index.json, read by SafetensorsIndex. The scratch folder
// also holds one valid shard, a.safetensors (tensors "x" and "y"), so an index that maps names to
// it reaches the lazy shard opening and the "shard lacks a promised tensor" check.
#include <array>
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "models/io/safetensors.h"

namespace {

void write_shard() {
  static const std::array<float, 2> x{1.0f, 2.0f};
  static const std::array<float, 1> y{3.0f};
  kiln::io::SafetensorsWriter w;
  w.add("x", "F32", {2}, x.data(), sizeof(x));
  w.add("y", "F32", {1}, y.data(), sizeof(y));
  w.write(kiln::fuzz::scratch_dir() + "/a.safetensors");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool shard_written = (write_shard(), true);
  (void)shard_written;
  const std::string path =
      kiln::fuzz::write_file("model.safetensors.index.json", kiln::fuzz::as_view(data, size));
  kiln::fuzz::expect_clean([&] {
    kiln::io::SafetensorsIndex idx(path);
    (void)idx.shard_files();
    (void)idx.metadata();
    int looked_up = 0;
    for (const std::string& name : idx.names()) {
      if (++looked_up > 8) break;  // a few lookups reach every path; more only cost time
      kiln::fuzz::expect_clean([&] {
        auto found = idx.find(name);
        if (found && found->entry->nbytes() > 0) {
          volatile uint8_t sink = found->data()[found->entry->nbytes() - 1];
          (void)sink;
        }
      });
    }
  });
  return 0;
}
