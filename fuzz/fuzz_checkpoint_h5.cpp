// libFuzzer target: an HDF5 training checkpoint, read by CheckpointReader the way resume and
// sample do: open (the probe in a forked child first, then the format checks), list the sections,
// read every tensor, blob and attribute. A file that crashes, exhausts or hangs libhdf5 must end
// as a kiln::Error from the probe (docs/robustness.md); a crash in this process is a finding.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fuzz/fuzz_util.h"
#include "models/io/checkpoint_h5.h"

namespace {

// With KILN_FUZZ_PROBE_KEEP=DIR, an input that crashed, exhausted or hung HDF5 in the probe's
// child is copied to DIR/<kind>-<size>-<fnv1a64> (at most 500): scripts/fuzz.sh counts them, and
// they are regression inputs for tests/apps (the probe must keep turning them into errors).
void keep_probe_failure(const std::string& what, const uint8_t* data, size_t size) {
  static const char* dir = std::getenv("KILN_FUZZ_PROBE_KEEP");
  static int kept = 0;
  if (!dir || !*dir || kept >= 500) return;
  const char* kind = what.find("HDF5 crashed") != std::string::npos              ? "crash"
                     : what.find("did not finish") != std::string::npos          ? "hang"
                     : what.find("out of memory") != std::string::npos           ? "oom"
                     : what.find("HDF5 was killed") != std::string::npos         ? "killed"
                     : what.find("reading the file failed") != std::string::npos ? "other"
                                                                                 : nullptr;
  if (!kind) return;
  std::filesystem::create_directories(dir);
  const std::string name = std::string(dir) + "/" + kind + "-" + std::to_string(size) + "-" +
                           std::to_string(kiln::io::fnv1a64(data, size));
  if (std::filesystem::exists(name)) return;
  ++kept;
  std::ofstream(name, std::ios::binary)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // A hang inside HDF5 costs the probe's timeout; keep it well under libFuzzer's -timeout=10.
  kiln::io::CheckpointProbeLimits lim;
  lim.timeout_s = 2.0;
  lim.memory_bytes = size_t{512} << 20;
  kiln::io::set_checkpoint_probe_limits(lim);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln::fuzz::write_file("ckpt.h5", kiln::fuzz::as_view(data, size));
  // Every input is written over the same file, faster than the file system's clock ticks: the
  // identity cache must not take one input for the last.
  kiln::io::forget_probed_checkpoints();
  kiln::io::CheckpointReader r;
  try {
    r.open(path);
  } catch (const kiln::Error& e) {
    keep_probe_failure(e.what(), data, size);
    return 0;
  }
  kiln::fuzz::expect_clean([&] {
    for (const std::string& group : r.list_groups()) {
      std::vector<std::string> names;
      kiln::fuzz::expect_clean([&] { names = r.list_tensors(group); });
      for (const std::string& name : names) {
        const std::string p = group + "/" + name;
        kiln::fuzz::expect_clean([&] {
          kiln::io::TensorInfo info = r.tensor_info(p);
          kiln::io::TensorData t = r.read_tensor(p);
          std::vector<uint8_t> buf(info.nbytes);
          r.read_tensor_into(p, buf.data(), buf.size());
        });
      }
    }
    kiln::fuzz::expect_clean([&] { (void)r.read_bytes("tokenizer"); });
    for (const char* a : {"step", "best_val_loss", "config", "missing"}) {
      if (!r.has_attr(a)) continue;
      kiln::fuzz::expect_clean([&] { (void)r.get_attr_i64(a); });
      kiln::fuzz::expect_clean([&] { (void)r.get_attr_f64(a); });
      kiln::fuzz::expect_clean([&] { (void)r.get_attr_string(a); });
    }
  });
  return 0;
}
