// HDF5 checkpoints: round trips of every dtype, atomic writes, and corrupt / truncated / foreign
// files, each of which must give a clear kiln::Error "[checkpoint] ...".
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/error.h"
#include "models/io/checkpoint_h5.h"
#include "tests/error_of.h"
#include "tests/test_python.h"

namespace fs = std::filesystem;
using kiln::io::CheckpointReader;
using kiln::io::CheckpointWriter;

namespace {

class CheckpointH5 : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_ckpt_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> file_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), {});
}

void put_file(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Runs f, expects a kiln::Error whose message starts with "[checkpoint]" and contains `part`.
template <typename F>
void expect_checkpoint_error(F&& f, const std::string& part) {
  kiln::test::expect_error(std::forward<F>(f), part, "[checkpoint]");
}

// A small checkpoint with one f32 tensor of 1000 elements; returns its values.
std::vector<float> write_small(const std::string& p, float base) {
  std::vector<float> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = base + 0.25f * static_cast<float>(i);
  CheckpointWriter wr;
  wr.add_tensor("model/model.norm.weight", "F32", {10, 100}, w.data());
  wr.set_attr_i64("step", static_cast<int64_t>(base));
  wr.write(p);
  return w;
}

TEST_F(CheckpointH5, RoundTripAllDtypesAndAttrs) {
  struct T {
    std::string path, dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<T> ts = {
      {"model/model.embed_tokens.weight", "F32", {7, 5}},
      {"model/model.layers.0.mlp.up_proj.weight", "BF16", {3, 11}},
      {"model/model.layers.0.self_attn.q_proj.bias", "F16", {13}},
      {"optim_m/model.layers.0.mlp.up_proj.weight", "F64", {2, 3, 4}},
      {"optim_v/nested/dir/name.with.dots", "F32", {1, 1, 1, 1}},
      {"meta/token_ids", "I32", {17}},
      {"meta/data_position", "I64", {}},  // scalar
      {"meta/mask", "U8", {5, 2}},
      {"meta/empty", "F32", {0, 4}},  // zero elements
  };
  std::vector<std::vector<uint8_t>> data;
  CheckpointWriter wr;
  for (size_t i = 0; i < ts.size(); ++i) {
    size_t n = kiln::io::checkpoint_dtype_size(ts[i].dtype);
    for (int64_t d : ts[i].shape) n *= static_cast<size_t>(d);
    data.push_back(random_bytes(n, static_cast<uint32_t>(i + 1)));
    wr.add_tensor(ts[i].path, ts[i].dtype, ts[i].shape, data.back().data());
  }
  std::vector<uint8_t> rng_state = random_bytes(313, 99);
  wr.add_bytes("rng_state", rng_state);
  wr.add_bytes("meta/empty_blob", {});
  wr.set_attr_i64("step", -1234567890123LL);
  wr.set_attr_f64("lr", 3.0e-4);
  wr.set_attr_string("config", R"({"dim": 288, "name": "stories15M ✓"})");
  wr.set_attr_string("empty", "");
  wr.set_attr_i64("step", 42);  // overwrite
  const std::string p = path("ck.h5");
  wr.write(p);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  CheckpointReader rd(p);
  for (size_t i = 0; i < ts.size(); ++i) {
    SCOPED_TRACE(ts[i].path);
    auto t = rd.read_tensor(ts[i].path);
    EXPECT_EQ(t.dtype, ts[i].dtype);
    EXPECT_EQ(t.shape, ts[i].shape);
    EXPECT_EQ(t.bytes, data[i]);
    auto info = rd.tensor_info(ts[i].path);
    EXPECT_EQ(info.nbytes, data[i].size());
    EXPECT_TRUE(rd.has_tensor(ts[i].path));
  }
  std::vector<uint8_t> into(data[0].size());
  rd.read_tensor_into(ts[0].path, into.data(), into.size());
  EXPECT_EQ(into, data[0]);
  expect_checkpoint_error([&] { rd.read_tensor_into(ts[0].path, into.data(), into.size() - 1); },
                          "buffer");

  EXPECT_EQ(rd.read_bytes("rng_state"), rng_state);
  EXPECT_TRUE(rd.read_bytes("meta/empty_blob").empty());
  EXPECT_EQ(rd.get_attr_i64("step"), 42);
  EXPECT_EQ(rd.get_attr_f64("lr"), 3.0e-4);
  EXPECT_EQ(rd.get_attr_string("config"), R"({"dim": 288, "name": "stories15M ✓"})");
  EXPECT_EQ(rd.get_attr_string("empty"), "");
  EXPECT_TRUE(rd.has_attr("lr"));
  EXPECT_FALSE(rd.has_attr("nope"));
  expect_checkpoint_error([&] { rd.get_attr_i64("nope"); }, "no attribute 'nope'");
  expect_checkpoint_error([&] { rd.get_attr_i64("config"); }, "wrong type");

  EXPECT_EQ(
      rd.list_tensors("model"),
      (std::vector<std::string>{"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                                "model.layers.0.self_attn.q_proj.bias"}));
  EXPECT_EQ(rd.list_tensors("optim_v"), (std::vector<std::string>{"nested/dir/name.with.dots"}));
  EXPECT_TRUE(rd.has_group("optim_m"));
  EXPECT_FALSE(rd.has_group("optim_x"));
  EXPECT_FALSE(rd.has_tensor("model/missing"));
  expect_checkpoint_error([&] { rd.read_tensor("model/missing"); }, "no tensor 'model/missing'");
  expect_checkpoint_error([&] { rd.list_tensors("nope"); }, "no group 'nope'");
}

TEST_F(CheckpointH5, BadWriterArguments) {
  CheckpointWriter wr;
  float x = 0;
  expect_checkpoint_error([&] { wr.add_tensor("model/x", "F8", {1}, &x); }, "unknown dtype 'F8'");
  expect_checkpoint_error([&] { wr.add_tensor("no_section", "F32", {1}, &x); }, "needs a section");
  expect_checkpoint_error([&] { wr.add_tensor("model//x", "F32", {1}, &x); }, "bad tensor path");
  expect_checkpoint_error([&] { wr.add_tensor("model/./x", "F32", {1}, &x); }, "bad tensor path");
  expect_checkpoint_error(
      [&] {
        wr.add_tensor("model/x", "F32", {2, -1}, &x);
      },
      "negative dimension");
  expect_checkpoint_error(
      [&] {
        wr.add_tensor("model/x", "F32", {1LL << 40, 1LL << 40}, &x);
      },
      "overflow");
  expect_checkpoint_error([&] { wr.add_tensor("model/x", "F32", {3}, nullptr); }, "null data");
  expect_checkpoint_error([&] { wr.set_attr_i64("kiln_checkpoint_version", 2); },
                          "bad attribute name");
  expect_checkpoint_error([&] { wr.set_attr_string("big", std::string(70000, 'a')); }, "add_bytes");
}

TEST_F(CheckpointH5, FailedWriteKeepsPreviousFile) {
  const std::string p = path("ck.h5");
  std::vector<float> old = write_small(p, 1.0f);
  const auto old_bytes = file_bytes(p);

  // Two tensors under one name: HDF5 refuses the second dataset part-way through the write.
  std::vector<float> w(4, 2.0f);
  CheckpointWriter dup;
  dup.add_tensor("model/a", "F32", {4}, w.data());
  dup.add_tensor("model/a", "F32", {4}, w.data());
  expect_checkpoint_error([&] { dup.write(p); }, "cannot create dataset 'model/a'");
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(file_bytes(p), old_bytes);

  // A dataset where a group is needed ("model/a" then "model/a/b").
  CheckpointWriter clash;
  clash.add_tensor("model/a", "F32", {4}, w.data());
  clash.add_tensor("model/a/b", "F32", {4}, w.data());
  expect_checkpoint_error([&] { clash.write(p); }, "cannot create dataset 'model/a/b'");
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  // The target directory does not exist.
  expect_checkpoint_error([&] { dup.write(path("no_such_dir/ck.h5")); }, "cannot create");

  CheckpointReader rd(p);
  auto t = rd.read_tensor("model/model.norm.weight");
  ASSERT_EQ(t.bytes.size(), old.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(t.bytes.data(), old.data(), t.bytes.size()), 0);
  EXPECT_EQ(rd.get_attr_i64("step"), 1);

  // A successful write replaces it; a stale .tmp from an earlier crash is no obstacle.
  put_file(p + ".tmp", random_bytes(100, 5));
  std::vector<float> neu = write_small(p, 7.0f);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  rd.open(p);
  EXPECT_EQ(rd.get_attr_i64("step"), 7);
  t = rd.read_tensor("model/model.norm.weight");
  EXPECT_EQ(std::memcmp(t.bytes.data(), neu.data(), t.bytes.size()), 0);
}

TEST_F(CheckpointH5, TruncatedFileAndHalfWrittenTmp) {
  const std::string p = path("ck.h5");
  write_small(p, 1.0f);
  auto bytes = file_bytes(p);
  ASSERT_GT(bytes.size(), 4000u);
  for (size_t keep : {bytes.size() / 2, bytes.size() - 1, size_t{100}, size_t{0}}) {
    SCOPED_TRACE(keep);
    const std::string q = path("trunc.h5");
    put_file(q, std::vector<uint8_t>(bytes.begin(), bytes.begin() + keep));
    expect_checkpoint_error(
        [&] {
          CheckpointReader rd(q);
          rd.read_tensor("model/model.norm.weight");
        },
        "");
  }
  // Only a half-written .tmp exists for the requested path.
  const std::string lost = path("lost.h5");
  put_file(lost + ".tmp", std::vector<uint8_t>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  expect_checkpoint_error([&] { CheckpointReader rd(lost); }, "half-written");
  expect_checkpoint_error([&] { CheckpointReader rd(lost + ".tmp"); }, "");
}

TEST_F(CheckpointH5, FlippedDataBytesFailChecksum) {
  const std::string p = path("ck.h5");
  write_small(p, 1.0f);
  // Where the tensor's bytes are in the file, from HDF5 itself.
  haddr_t off = HADDR_UNDEF;
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t d = H5Dopen2(f, "model/model.norm.weight", H5P_DEFAULT);
    ASSERT_GE(d, 0);
    off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
  }
  ASSERT_NE(off, HADDR_UNDEF);
  auto bytes = file_bytes(p);
  ASSERT_LT(off + 4000, bytes.size() + 1);
  bytes[off + 2001] ^= 0x10;
  put_file(p, bytes);
  CheckpointReader rd(p);  // metadata is intact, so opening works
  EXPECT_EQ(rd.tensor_info("model/model.norm.weight").nbytes, 4000u);
  expect_checkpoint_error([&] { rd.read_tensor("model/model.norm.weight"); },
                          "tensor model/model.norm.weight checksum mismatch: file is corrupt");
}

TEST_F(CheckpointH5, ForeignAndMissingFiles) {
  expect_checkpoint_error([&] { CheckpointReader rd(path("missing.h5")); }, "does not exist");
  expect_checkpoint_error([&] { CheckpointReader rd(dir_.string()); }, "not a regular file");
  const std::string junk = path("junk.h5");
  put_file(junk, random_bytes(65536, 3));
  expect_checkpoint_error([&] { CheckpointReader rd(junk); }, "not an HDF5 file");
  put_file(junk, {});
  expect_checkpoint_error([&] { CheckpointReader rd(junk); }, "not an HDF5 file");

  // Valid HDF5 files that are not (valid) kiln checkpoints, made with the C API directly.
  auto make = [&](const std::string& p, bool version_attr, int64_t version, bool model, bool meta) {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    if (version_attr) {
      hid_t s = H5Screate(H5S_SCALAR);
      hid_t a =
          H5Acreate2(f, "kiln_checkpoint_version", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_INT64, &version);
      H5Aclose(a);
      H5Sclose(s);
    }
    if (model) H5Gclose(H5Gcreate2(f, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (meta) H5Gclose(H5Gcreate2(f, "meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Fclose(f);
  };
  const std::string h = path("other.h5");
  make(h, false, 0, true, true);
  expect_checkpoint_error([&] { CheckpointReader rd(h); }, "not a kiln checkpoint");
  make(h, true, 2, true, true);
  expect_checkpoint_error([&] { CheckpointReader rd(h); }, "kiln_checkpoint_version 2");
  make(h, true, 1, false, true);
  expect_checkpoint_error([&] { CheckpointReader rd(h); }, "missing the required group 'model'");
  make(h, true, 1, true, false);
  expect_checkpoint_error([&] { CheckpointReader rd(h); }, "missing the required group 'meta'");
  make(h, true, 1, true, true);
  CheckpointReader ok(h);
  EXPECT_TRUE(ok.list_tensors("model").empty());
}

TEST_F(CheckpointH5, DtypeAttrMustMatchStoredType) {
  const std::string p = path("ck.h5");
  write_small(p, 1.0f);
  // Rewrite the f32 tensor's dtype attribute to "i32" and then drop its checksum.
  hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t d = H5Dopen2(f, "model/model.norm.weight", H5P_DEFAULT);
  ASSERT_GE(d, 0);
  H5Adelete(d, "dtype");
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, 3);
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(d, "dtype", t, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, "i32");
  H5Aclose(a);
  H5Sclose(s);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  CheckpointReader rd(p);
  expect_checkpoint_error([&] { rd.read_tensor("model/model.norm.weight"); },
                          "stored element type does not match dtype 'i32'");
}

TEST_F(CheckpointH5, ReadableByH5py) {
  if (std::system((test_python() + " -c 'import h5py, numpy' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "python3 with h5py not available";
  const std::string p = path("ck.h5");
  std::vector<uint16_t> bf = {0x3f80, 0xc000, 0x0000, 0x7f80, 0x1234, 0xffff};  // raw bf16 bits
  std::vector<int32_t> ids = {5, -7, 9};
  CheckpointWriter wr;
  wr.add_tensor("model/model.layers.0.mlp.up_proj.weight", "BF16", {2, 3}, bf.data());
  wr.add_tensor("meta/ids", "I32", {3}, ids.data());
  wr.set_attr_i64("step", 11);
  wr.set_attr_string("config", "{\"dim\": 8}");
  wr.write(p);
  const std::string script =
      "import h5py, numpy as np, sys\n"
      "f = h5py.File(sys.argv[1], 'r')\n"
      "d = f['model']['model.layers.0.mlp.up_proj.weight']\n"
      "dt = d.attrs['dtype']\n"
      "assert (dt.decode() if isinstance(dt, bytes) else dt) == 'bf16', dt\n"
      "assert d.dtype == np.uint16 and d.shape == (2, 3), (d.dtype, d.shape)\n"
      "assert d[()].ravel().tolist() == [0x3f80, 0xc000, 0, 0x7f80, 0x1234, 0xffff]\n"
      "assert f['meta/ids'][()].tolist() == [5, -7, 9]\n"
      "assert int(f.attrs['kiln_checkpoint_version']) == 1 and int(f.attrs['step']) == 11\n"
      "print('ok')\n";
  const std::string sp = path("check.py");
  std::ofstream(sp) << script;
  std::string cmd = test_python() + " " + sp + " " + p;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// A chunked dataset may declare any shape; one larger than the whole file is refused before a
// buffer is allocated for it (a 3 MB file once asked for 16 GiB).
TEST_F(CheckpointH5, HugeDeclaredShapeRefusedBeforeAllocating) {
  const std::string p = path("ck.h5");
  write_small(p, 1.0f);
  hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hsize_t dims[2] = {hsize_t{1} << 20, hsize_t{1} << 12};  // 16 GiB of f32
  hsize_t chunk[2] = {16, 16};
  hid_t s = H5Screate_simple(2, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, chunk);
  hid_t d = H5Dcreate2(f, "model/huge", H5T_NATIVE_FLOAT, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, 3);
  hid_t as = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(d, "dtype", t, as, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, "f32");
  H5Aclose(a);
  H5Sclose(as);
  H5Tclose(t);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(s);
  H5Fclose(f);
  CheckpointReader rd(p);
  expect_checkpoint_error(
      [&] { rd.read_tensor("model/huge"); },
      "tensor 'model/huge' declares shape 1048576x4096 (17179869184 bytes), more than the "
      "whole file");
}

TEST(CheckpointHash, Fnv1a64KnownValues) {
  // Reference values of the FNV-1a 64-bit hash (offset basis 0xcbf29ce484222325).
  EXPECT_EQ(kiln::io::fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(kiln::io::fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(kiln::io::fnv1a64("foobar", 6), 0x85944171f73967e8ull);
}

}  // namespace
