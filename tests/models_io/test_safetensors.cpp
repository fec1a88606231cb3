// Safetensors: round trip, every malformed-header case, sharded folders, and a
// cross-check against an independent Python reader/writer.
#include <gtest/gtest.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/common/error.h"
#include "models/io/safetensors.h"
#include "tests/test_python.h"

namespace fs = std::filesystem;
using kiln::io::Metadata;
using kiln::io::SafetensorsFile;
using kiln::io::SafetensorsIndex;
using kiln::io::SafetensorsWriter;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A raw file: u64 header length (or `len_override`), header text, `data_bytes` bytes of data.
  std::string raw(const std::string& name, const std::string& header, uint64_t data_bytes,
                  std::optional<uint64_t> len_override = std::nullopt) {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    uint64_t n = len_override.value_or(header.size());
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    std::string data(data_bytes, '\x11');
    f << data;
    return p;
  }

  // Opening `p` must throw kiln::Error whose message names the file and contains `what`. Text
  // that is not JSON (or nests too deep) is refused by parse_json_limited: "[json] safetensors
  // header of <path>: ...".
  static void expect_bad(const std::string& p, const std::string& what) {
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << "no error for " << p << ", expected '" << what << "'";
    } catch (const kiln::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_TRUE(msg.starts_with("[safetensors]") || msg.starts_with("[json] safetensors header"))
          << msg;
      EXPECT_NE(msg.find(fs::path(p).filename().string()), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

bool have_python() { return fs::exists(test_python()); }

std::string ref_script() {
  return std::string(KILN_SOURCE_DIR) + "/tests/models_io/safetensors_ref.py";
}

}  // namespace

TEST_F(SafetensorsTest, RoundTrip) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> w(6 * 5);
  for (auto& x : w) x = nd(rng);
  std::vector<uint16_t> bf(7);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = static_cast<uint16_t>(0x3f80 + 3 * i);
  std::vector<int64_t> ids = {-5, 0, 1LL << 50};
  std::vector<uint8_t> mask = {1, 0, 1, 1, 0};
  double scalar = 3.25;

  SafetensorsWriter wr;
  wr.add("model.layers.0.mlp.up_proj.weight", "F32", {6, 5}, w.data(), w.size() * 4);
  wr.add("bf", "BF16", {7}, bf.data(), bf.size() * 2);
  wr.add("ids", "I64", {3}, ids.data(), ids.size() * 8);
  wr.add("mask", "BOOL", {5}, mask.data(), mask.size());
  wr.add("scalar", "F64", {}, &scalar, 8);
  wr.add("empty", "F32", {0, 4}, nullptr, 0);
  Metadata meta = {{"format", "pt"}, {"note", "kiln \"test\""}};
  std::string p = path("rt.safetensors");
  wr.write(p, meta);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.data_offset() % 8, 0u);  // header padded to a multiple of 8
  ASSERT_EQ(f.entries().size(), 6u);
  auto check = [&](const char* name, const char* dtype, std::vector<int64_t> shape, const void* src,
                   size_t nbytes) {
    const auto* e = f.find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, dtype);
    EXPECT_EQ(e->shape, shape);
    EXPECT_EQ(e->nbytes(), nbytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data(*e)) % kiln::io::dtype_size(dtype), 0u) << name;
    if (nbytes) EXPECT_EQ(std::memcmp(f.data(*e), src, nbytes), 0) << name;
  };
  check("model.layers.0.mlp.up_proj.weight", "F32", {6, 5}, w.data(), w.size() * 4);
  check("bf", "BF16", {7}, bf.data(), bf.size() * 2);
  check("ids", "I64", {3}, ids.data(), 24);
  check("mask", "BOOL", {5}, mask.data(), 5);
  check("scalar", "F64", {}, &scalar, 8);
  check("empty", "F32", {0, 4}, nullptr, 0);
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_THROW(f.at("nope"), kiln::Error);
}

TEST_F(SafetensorsTest, WriterRejectsBadTensors) {
  float x[4] = {};
  SafetensorsWriter wr;
  EXPECT_THROW(wr.add("a", "F32", {2, 3}, x, 16), kiln::Error);  // size mismatch
  EXPECT_THROW(wr.add("a", "F7", {4}, x, 16), kiln::Error);      // unknown dtype
  EXPECT_THROW(wr.add("a", "F32", {-4}, x, 16), kiln::Error);    // negative dim
  EXPECT_THROW(wr.add("__metadata__", "F32", {4}, x, 16), kiln::Error);
  wr.add("a", "F32", {4}, x, 16);
  EXPECT_THROW(wr.add("a", "F32", {4}, x, 16), kiln::Error);  // duplicate
  EXPECT_EQ(wr.size(), 1u);
}

TEST_F(SafetensorsTest, WriteIsAtomicOverExistingFile) {
  float a[2] = {1, 2};
  SafetensorsWriter w1;
  w1.add("a", "F32", {2}, a, 8);
  std::string p = path("m.safetensors");
  w1.write(p);
  // Writing into a folder that does not exist fails and leaves nothing behind.
  EXPECT_THROW(w1.write(path("no/such/dir/m.safetensors")), kiln::Error);
  float b[3] = {3, 4, 5};
  SafetensorsWriter w2;
  w2.add("b", "F32", {3}, b, 12);
  w2.write(p);
  SafetensorsFile f(p);
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].name, "b");
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST_F(SafetensorsTest, TooSmallFile) {
  std::string p = path("tiny.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  expect_bad(p, "too small");
}

TEST_F(SafetensorsTest, TruncatedFile) {
  std::vector<float> v(64, 1.0f);
  SafetensorsWriter wr;
  wr.add("v", "F32", {64}, v.data(), 256);
  std::string p = path("cut.safetensors");
  wr.write(p);
  fs::resize_file(p, fs::file_size(p) - 100);
  expect_bad(p, "past the end of the data section");
  fs::resize_file(p, 20);  // now inside the header
  expect_bad(p, "exceeds file size");
}

TEST_F(SafetensorsTest, HeaderLengthExceedsFile) {
  expect_bad(raw("big.safetensors", "{}", 16, 4096), "header length 4096 exceeds file size 26");
}

TEST_F(SafetensorsTest, HeaderLengthHuge) {
  expect_bad(raw("huge.safetensors", "{}", 0, 9'000'000'000'000'000'000ull),
             "header length 9000000000000000000 exceeds file size");
}

TEST_F(SafetensorsTest, HeaderLengthOverLimit) {
  // A sparse 200 MB file whose header claims 150 MB: refused before parsing.
  std::string p = raw("sparse.safetensors", "{}", 0, 150'000'000);
  fs::resize_file(p, 200'000'000);
  expect_bad(p, "header length 150000000 exceeds the 100000000-byte limit");
}

TEST_F(SafetensorsTest, InvalidJson) {
  expect_bad(raw("j.safetensors", R"({"a": {"dtype": "F32", "shape": [1], )", 4),
             "invalid JSON at byte 38");
  // Nesting in an unused __metadata__-like key: refused while parsing, not a stack overflow.
  std::string deep = R"({"x": )" + std::string(100'000, '[') + std::string(100'000, ']') + "}";
  expect_bad(raw("deep.safetensors", deep, 0), "nested deeper than 64 levels");
  expect_bad(raw("j2.safetensors", "[1, 2]", 0), "does not start with");
  expect_bad(raw("j3.safetensors", R"({"a": 5})", 0), "not an object");
}

TEST_F(SafetensorsTest, OffsetsPastEnd) {
  expect_bad(raw("o.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
             "past the end");
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
  expect_bad(raw("be.safetensors", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8),
             "begin 8 > end 4");
}

TEST_F(SafetensorsTest, Overlap) {
  expect_bad(raw("ov.safetensors",
                 R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12),
             "overlaps");
}

TEST_F(SafetensorsTest, Gap) {
  expect_bad(raw("gap.safetensors",
                 R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                 20),
             "gap of 4 bytes between 'a'");
  expect_bad(
      raw("gap0.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
      "before the first entry");
  expect_bad(
      raw("tail.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12),
      "trailing gap");
}

TEST_F(SafetensorsTest, ShapeSizeMismatch) {
  expect_bad(raw("mm.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
             "needs 12");
}

TEST_F(SafetensorsTest, ShapeOverflow) {
  // 2^40 * 2^40 elements overflow 64 bits.
  expect_bad(
      raw("sh.safetensors",
          R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})", 8),
      "overflows");
  // 2^62 elements fit, but not 2^62 * 4 bytes.
  expect_bad(raw("sh2.safetensors",
                 R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
             "overflows");
}

TEST_F(SafetensorsTest, BadShapeValues) {
  expect_bad(
      raw("neg.safetensors", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
      "not a non-negative integer");
  expect_bad(
      raw("flt.safetensors", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
      "not a non-negative integer");
  expect_bad(raw("noshape.safetensors", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8),
             "no shape");
  expect_bad(
      raw("negoff.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8),
      "data_offsets");
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_bad(
      raw("dt.safetensors", R"({"a":{"dtype":"F8_E9M9","shape":[2],"data_offsets":[0,2]}})", 2),
      "unknown dtype 'F8_E9M9'");
}

TEST_F(SafetensorsTest, BadMetadata) {
  expect_bad(raw("md.safetensors", R"({"__metadata__":{"n":3}})", 0), "is not a string");
}

TEST_F(SafetensorsTest, ShardedIndex) {
  std::vector<float> a(12), b(5);
  std::vector<int32_t> c = {7, -8, 9};
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -1.0f - static_cast<float>(i);
  SafetensorsWriter s1, s2;
  s1.add("model.embed_tokens.weight", "F32", {3, 4}, a.data(), 48);
  s1.add("model.norm.weight", "F32", {5}, b.data(), 20);
  s2.add("lm_head.bias", "I32", {3}, c.data(), 12);
  s1.write(path("model-00001-of-00002.safetensors"));
  s2.write(path("model-00002-of-00002.safetensors"));
  kiln::io::write_safetensors_index(
      path("model.safetensors.index.json"), {{"total_size", "80"}},
      {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
       {"model.norm.weight", "model-00001-of-00002.safetensors"},
       {"lm_head.bias", "model-00002-of-00002.safetensors"}});

  SafetensorsIndex idx = SafetensorsIndex::open_dir(dir_.string());
  EXPECT_EQ(idx.shards_open(), 0u);  // lazy
  EXPECT_EQ(idx.metadata().at("total_size"), "80");
  EXPECT_EQ(idx.names().size(), 3u);
  EXPECT_EQ(idx.shard_files().size(), 2u);
  auto e = idx.at("lm_head.bias");
  EXPECT_EQ(idx.shards_open(), 1u);
  EXPECT_EQ(e.entry->dtype, "I32");
  EXPECT_EQ(std::memcmp(e.data(), c.data(), 12), 0);
  auto n = idx.at("model.norm.weight");
  EXPECT_EQ(idx.shards_open(), 2u);
  EXPECT_EQ(std::memcmp(n.data(), b.data(), 20), 0);
  auto emb = idx.at("model.embed_tokens.weight");
  EXPECT_EQ(emb.entry->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(std::memcmp(emb.data(), a.data(), 48), 0);
  EXPECT_EQ(idx.shards_open(), 2u);
  EXPECT_FALSE(idx.find("missing").has_value());
  EXPECT_THROW(idx.at("missing"), kiln::Error);
}

TEST_F(SafetensorsTest, IndexRejectsEscapingShardNames) {
  for (const char* bad : {"../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"}) {
    nlohmann::json j = {{"weight_map", {{"w", bad}}}};
    std::ofstream(path("model.safetensors.index.json")) << j.dump();
    try {
      SafetensorsIndex idx(path("model.safetensors.index.json"));
      ADD_FAILURE() << "accepted shard name " << bad;
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  std::ofstream(path("model.safetensors.index.json")) << R"({"weight_map": [1]})";
  EXPECT_THROW(SafetensorsIndex(path("model.safetensors.index.json")), kiln::Error);
  std::ofstream(path("model.safetensors.index.json")) << "{not json";
  EXPECT_THROW(SafetensorsIndex(path("model.safetensors.index.json")), kiln::Error);
}

TEST_F(SafetensorsTest, IndexShardMissingTensor) {
  float x[2] = {1, 2};
  SafetensorsWriter wr;
  wr.add("present", "F32", {2}, x, 8);
  wr.write(path("s.safetensors"));
  std::ofstream(path("model.safetensors.index.json"))
      << R"({"weight_map": {"present": "s.safetensors", "absent": "s.safetensors"}})";
  SafetensorsIndex idx(path("model.safetensors.index.json"));
  EXPECT_TRUE(idx.find("present").has_value());
  EXPECT_THROW(idx.find("absent"), kiln::Error);
}

TEST_F(SafetensorsTest, OpenDirSingleFile) {
  float x[3] = {1, 2, 3};
  SafetensorsWriter wr;
  wr.add("w", "F32", {3}, x, 12);
  wr.write(path("model.safetensors"), {{"format", "pt"}});
  SafetensorsIndex idx = SafetensorsIndex::open_dir(dir_.string());
  EXPECT_EQ(idx.names(), std::vector<std::string>{"w"});
  EXPECT_EQ(idx.metadata().at("format"), "pt");
  EXPECT_EQ(std::memcmp(idx.at("w").data(), x, 12), 0);
  fs::remove(path("model.safetensors"));
  EXPECT_THROW(SafetensorsIndex::open_dir(dir_.string()), kiln::Error);
}

TEST_F(SafetensorsTest, PythonReadsKilnFile) {
  if (!have_python()) GTEST_SKIP() << test_python() << " not found";
  std::vector<float> w = {0.5f, -1.25f, 3.0f, 1e-3f, -7.0f, 2.0f};
  std::vector<int64_t> ids = {-3, 1LL << 45};
  std::vector<uint8_t> u = {0, 255, 9};
  SafetensorsWriter wr;
  wr.add("w", "F32", {2, 3}, w.data(), 24);
  wr.add("ids", "I64", {2}, ids.data(), 16);
  wr.add("u", "U8", {3, 1}, u.data(), 3);
  std::string p = path("k.safetensors"), out = path("k.json");
  wr.write(p, {{"format", "pt"}});
  std::string cmd = test_python() + " " + ref_script() + " read " + p + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(j["metadata"]["format"], "pt");
  auto& t = j["tensors"];
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t["w"]["shape"], nlohmann::json({2, 3}));
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(t["w"]["values"][i].get<double>(), double(w[i]));
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(t["ids"]["values"][i].get<double>(), static_cast<double>(ids[i]));
  EXPECT_EQ(t["u"]["shape"], nlohmann::json({3, 1}));
  for (size_t i = 0; i < u.size(); ++i) EXPECT_EQ(t["u"]["values"][i].get<double>(), double(u[i]));
}

TEST_F(SafetensorsTest, KilnReadsPythonFile) {
  if (!have_python()) GTEST_SKIP() << test_python() << " not found";
  std::string p = path("py.safetensors");
  std::string cmd = test_python() + " " + ref_script() + " write " + p;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("who"), "python");
  const auto& a = f.at("a.weight");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  const float* av = reinterpret_cast<const float*>(f.data(a));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(av[i], 0.5f * i - 1.0f);
  const auto& b = f.at("b.bias");
  EXPECT_EQ(b.dtype, "F16");
  EXPECT_EQ(b.nbytes(), 8u);
  const uint16_t* bh = reinterpret_cast<const uint16_t*>(f.data(b));
  EXPECT_EQ(bh[0], 0x3E00);  // 1.5 in IEEE half
  EXPECT_EQ(bh[3], 0x0000);
  const auto& c = f.at("c.ids");
  int64_t cv[4];
  std::memcpy(cv, f.data(c), 32);  // the python file has no alignment padding
  EXPECT_EQ(cv[0], -3);
  EXPECT_EQ(cv[3], 1LL << 40);
  const auto& d = f.at("d.mask");
  EXPECT_EQ(d.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(f.data(d)[5], 1);
  EXPECT_EQ(f.data(d)[1], 0);
}

// prefault_mapping populates a range of a mapping (unaligned ends included) and leaves its bytes
// as they are; an empty range is a no-op. Kernels before 5.14 lack MADV_POPULATE_READ: false.
TEST(MappedFile, PrefaultKeepsTheBytes) {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / ("kiln_prefault_" + std::to_string(::getpid()));
  std::vector<char> bytes(3 * 4096 + 123);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7);
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  kiln::io::MappedFile m(p.string());
  EXPECT_TRUE(kiln::io::prefault_mapping(m.data() + 5, 0));
  const bool populated = kiln::io::prefault_mapping(m.data() + 100, m.size() - 200);
  utsname u{};
  ASSERT_EQ(::uname(&u), 0);
  int major = 0, minor = 0;
  std::sscanf(u.release, "%d.%d", &major, &minor);
  if (major > 5 || (major == 5 && minor >= 14)) EXPECT_TRUE(populated) << u.release;
  EXPECT_EQ(0, std::memcmp(m.data(), bytes.data(), bytes.size()));
  fs::remove(p);
}

// A file truncated after it was mapped: reading the lost pages raises SIGBUS, which the guarded
// copy turns into an error naming the file (issue 13, class 7).
TEST(MappedFile, TruncatedWhileMappedIsAnErrorNotSigbus) {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / ("kiln_sigbus_" + std::to_string(::getpid()));
  std::vector<char> bytes(1 << 16, 'x');
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  kiln::io::MappedFile m(p.string());
  ASSERT_EQ(m.size(), bytes.size());
  std::vector<char> out(bytes.size());
  kiln::io::copy_from_mapping(out.data(), m.data(), m.size(), p.string());  // intact: fine
  EXPECT_EQ(out, bytes);
  fs::resize_file(p, 0);
  try {
    kiln::io::copy_from_mapping(out.data(), m.data(), m.size(), p.string() + " (tensor w)");
    ADD_FAILURE() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[mmap] " + p.string() + " (tensor w): the file shrank"),
              std::string::npos)
        << e.what();
  }
  // And again: the handler stays installed and the thread is not left in a bad state.
  EXPECT_THROW(kiln::io::copy_from_mapping(out.data(), m.data(), m.size(), "again"), kiln::Error);
  fs::remove(p);
}
