// The checkpoint probe (models/io/checkpoint_probe.h): a file that crashes, exhausts or hangs
// libhdf5 is read in a forked child first, and ends as a kiln::Error naming the file; a valid
// checkpoint still loads. tests/models_io/data/hdf5_*.h5 are inputs the checkpoint_h5 fuzzer found
// that crashed inside Debian's libhdf5 1.10.8 before the probe existed (docs/fuzzing.md); the
// ones whose crash depends on the heap's layout are fed to the kiln binary by
// tests/apps/test_checkpoint_probe_cli.cpp.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "models/io/checkpoint_h5.h"

namespace fs = std::filesystem;
using kiln::io::CheckpointReader;

namespace {

std::string data_file(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/models_io/data/" + name;
}

class CheckpointProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_probe_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    kiln::io::forget_probed_checkpoints();
  }
  void TearDown() override {
    kiln::io::set_checkpoint_probe_limits(kiln::io::CheckpointProbeLimits{});
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// A small valid checkpoint: two tensors, a blob and attributes; returns the weights.
std::vector<float> write_valid(const std::string& p) {
  std::vector<float> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(i) - 3.0f;
  kiln::io::CheckpointWriter cw;
  cw.add_tensor("model/w", "F32", {10, 100}, w.data());
  cw.add_tensor("optim_m/w", "F32", {10, 100}, w.data());
  cw.set_attr_i64("step", 7);
  cw.set_attr_string("config", "{}");
  cw.add_bytes("tokenizer", {'a', 'b'});
  cw.write(p);
  return w;
}

// Opens `p` and reads everything in it, as the fuzz target does; returns the first error's
// message, or "" when it all read.
std::string load_everything(const std::string& p) {
  try {
    CheckpointReader r(p);
    for (const std::string& g : r.list_groups())
      for (const std::string& name : r.list_tensors(g)) (void)r.read_tensor(g + "/" + name);
    for (const std::string& a : r.list_attrs())
      if (r.attr_kind(a) == 's') (void)r.get_attr_string(a);
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_F(CheckpointProbe, ValidCheckpointStillLoadsBitExactly) {
  const std::string p = path("ok.h5");
  std::vector<float> w = write_valid(p);
  CheckpointReader r(p);
  EXPECT_EQ(r.list_groups(), (std::vector<std::string>{"meta", "model", "optim_m"}));
  EXPECT_EQ(r.list_attrs(),
            (std::vector<std::string>{"config", "kiln_checkpoint_version", "step"}));
  EXPECT_EQ(r.attr_kind("step"), 'i');
  EXPECT_EQ(r.attr_kind("config"), 's');
  std::vector<float> got(w.size());
  r.read_tensor_into("model/w", got.data(), got.size() * sizeof(float));
  EXPECT_EQ(got, w);
  EXPECT_EQ(r.get_attr_i64("step"), 7);
  EXPECT_EQ(load_everything(p), "");
}

// The child runs under an address-space limit: HDF5's 4 GiB request for a corrupt object header
// fails there (an HDF5 error, or the sanitizer's report), and the file is refused before this
// process lets HDF5 near it.
TEST_F(CheckpointProbe, HugeMallocInsideHdf5IsRefusedInTheChild) {
  const std::string p = path("oom.h5");
  fs::copy_file(data_file("hdf5_4gib_malloc.h5"), p);
  const std::string err = load_everything(p);
  EXPECT_EQ(err.rfind("[checkpoint] ", 0), 0u) << err;
  EXPECT_NE(err.find(p), std::string::npos) << err;
  EXPECT_TRUE(err.find("memory allocation failed") != std::string::npos ||
              err.find("HDF5 crashed reading the file") != std::string::npos)
      << err;
}

TEST_F(CheckpointProbe, ChildPastItsDeadlineIsKilledAndReported) {
  const std::string p = path("slow.h5");
  write_valid(p);
  kiln::io::CheckpointProbeLimits lim;
  lim.timeout_s = 1e-9;  // no child finishes this fast: the parent kills it and says so
  lim.bytes_per_second = 1e18;
  kiln::io::set_checkpoint_probe_limits(lim);
  const std::string err = load_everything(p);
  EXPECT_EQ(err, "[checkpoint] " + p +
                     ": HDF5 did not finish reading the file in 0 s (it hangs on it): the file is "
                     "corrupt or not a kiln checkpoint");
  // With the default limits the same file loads, and is then known to be probed.
  kiln::io::set_checkpoint_probe_limits(kiln::io::CheckpointProbeLimits{});
  EXPECT_EQ(load_everything(p), "");
  kiln::io::set_checkpoint_probe_limits(lim);
  EXPECT_EQ(load_everything(p), "");  // probed already: not probed again
}

TEST_F(CheckpointProbe, ChildRefusalIsTheSameMessageAsInProcess) {
  const std::string p = path("junk.h5");
  std::ofstream(p) << "not an HDF5 file";
  EXPECT_EQ(load_everything(p), "[checkpoint] '" + p + "' is not an HDF5 file");
  // A file replaced after it was probed is probed again (its inode and times differ).
  write_valid(p);
  EXPECT_EQ(load_everything(p), "");
  std::ofstream(p, std::ios::trunc) << "not an HDF5 file either";
  EXPECT_EQ(load_everything(p), "[checkpoint] '" + p + "' is not an HDF5 file");
}

TEST_F(CheckpointProbe, TruncatedFilesAreCleanErrors) {
  const std::string p = path("ok.h5");
  write_valid(p);
  std::ifstream f(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  // Every 331st truncation point gives a kiln::Error (flipped bytes: tests/apps, through the
  // kiln binary, where a libhdf5 over-read cannot trip this test process's sanitizer).
  for (size_t cut = 0; cut < bytes.size(); cut += 331) {
    const std::string q = path("cut.h5");
    std::ofstream(q, std::ios::binary | std::ios::trunc).write(bytes.data(), cut);
    const std::string err = load_everything(q);
    EXPECT_EQ(err.rfind("[checkpoint] ", 0), 0u) << "truncated at " << cut << ": " << err;
  }
}

// HDF5 converts a number to the native type on read and trusts the file's precision and offset;
// kiln accepts only HDF5's standard integer and IEEE types (a crafted one crashed H5T__conv_i_i
// in the fuzzing process after the probe had read the same attribute without harm).
TEST_F(CheckpointProbe, NonStandardNumberTypesAreRefusedBeforeConversion) {
  const std::string p = path("odd.h5");
  write_valid(p);
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t t = H5Tcopy(H5T_STD_I64LE);
    ASSERT_GE(H5Tset_precision(t, 48), 0);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "odd", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    const int64_t v = 5;
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &v), 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(f);
  }
  CheckpointReader r(p);
  EXPECT_EQ(r.get_attr_i64("step"), 7);
  try {
    (void)r.get_attr_i64("odd");
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(std::string(e.what()), "[checkpoint] attribute 'odd' of '" + p +
                                         "' has a non-standard number type (size 8, precision "
                                         "48, offset 0)");
  }
}
