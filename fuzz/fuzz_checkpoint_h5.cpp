// libFuzzer target: an HDF5 training checkpoint, read by CheckpointReader the way resume and
// sample do: open (format checks), list the sections, read every tensor, blob and attribute.
#include "fuzz/fuzz_util.h"
#include "models/io/checkpoint_h5.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln::fuzz::write_file("ckpt.h5", kiln::fuzz::as_view(data, size));
  kiln::fuzz::expect_clean([&] {
    kiln::io::CheckpointReader r(path);
    for (const char* group : {"model", "optim_m", "optim_v", "meta"}) {
      if (!r.has_group(group)) continue;
      for (const std::string& name : r.list_tensors(group)) {
        const std::string p = std::string(group) + "/" + name;
        kiln::fuzz::expect_clean([&] {
          kiln::io::TensorInfo info = r.tensor_info(p);
          kiln::io::TensorData t = r.read_tensor(p);
          std::vector<uint8_t> buf(info.nbytes);
          r.read_tensor_into(p, buf.data(), buf.size());
        });
      }
    }
    kiln::fuzz::expect_clean([&] { (void)r.read_bytes("tokenizer"); });
    for (const char* a : {"step", "best_val_loss", "config"}) {
      if (!r.has_attr(a)) continue;
      kiln::fuzz::expect_clean([&] { (void)r.get_attr_i64(a); });
      kiln::fuzz::expect_clean([&] { (void)r.get_attr_f64(a); });
      kiln::fuzz::expect_clean([&] { (void)r.get_attr_string(a); });
    }
  });
  return 0;
}
