// GGUF: the writer's files read back (metadata with its types, tensors with their bytes at
// aligned offsets), and each malformed-file class that peers' loaders have mishandled is refused
// by name. The malformed files are built byte by byte here (RawGguf), not by the writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "models/io/gguf.h"

namespace fs = std::filesystem;
using kiln::io::GgufFile;
using kiln::io::GgufMetadata;
using kiln::io::GgufType;
using kiln::io::GgufValue;
using kiln::io::GgufWriter;

namespace {

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_gguf_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// A GGUF file written field by field, so that each field can be made wrong.
struct RawGguf {
  std::vector<std::uint8_t> b;
  template <class T>
  RawGguf& put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  RawGguf& str(const std::string& s) {
    put<std::uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    return put<std::uint32_t>(0x46554747).put<std::uint32_t>(version).put(n_tensors).put(n_kv);
  }
  RawGguf& tensor(const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type,
                  std::uint64_t offset) {
    str(name).put<std::uint32_t>(static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) put(d);
    return put(type).put(offset);
  }
  RawGguf& pad(std::size_t align = 32) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
  RawGguf& bytes(std::size_t n, std::uint8_t v = 0) {
    b.insert(b.end(), n, v);
    return *this;
  }
  void save(const std::string& p) const {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(GgufTest, WriterRoundTripsMetadataTypesAndTensors) {
  GgufMetadata md;
  md["general.architecture"] = {GgufType::String, GgufType::Uint8, "qwen3"};
  md["qwen3.block_count"] = {GgufType::Uint32, GgufType::Uint8, 28};
  md["qwen3.rope.freq_base"] = {GgufType::Float32, GgufType::Uint8, 1000000.0};
  md["qwen3.attention.layer_norm_rms_epsilon"] = {GgufType::Float64, GgufType::Uint8, 1e-6};
  md["general.flag"] = {GgufType::Bool, GgufType::Uint8, true};
  md["general.signed"] = {GgufType::Int64, GgufType::Uint8, -5};
  md["tokenizer.ggml.tokens"] = {GgufType::Array, GgufType::String, {"<s>", "a", "", "bc"}};
  md["tokenizer.ggml.token_type"] = {GgufType::Array, GgufType::Int32, {1, 1, 3, 1}};
  md["general.alignment"] = {GgufType::Uint32, GgufType::Uint8, 64};

  std::vector<float> w(3 * 5);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(i) - 1.0f;
  std::vector<std::uint8_t> q(2 * 34);  // two Q8_0 blocks: one (64) row
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<std::uint8_t>(i * 7);
  GgufWriter wr;
  wr.add_tensor("token_embd.weight", {5, 3}, 0, w.data(), w.size() * 4);
  wr.add_tensor("blk.0.ffn_up.weight", {64, 1}, 8, q.data(), q.size());
  wr.write(path("m.gguf"), md);

  GgufFile f(path("m.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  ASSERT_EQ(f.metadata().size(), md.size());
  for (const auto& [k, v] : md) {
    const GgufValue& got = f.metadata().at(k);
    EXPECT_EQ(got.type, v.type) << k;
    if (v.type == GgufType::Array) EXPECT_EQ(got.elem, v.elem) << k;
    if (v.type == GgufType::Float32)
      EXPECT_EQ(got.value.get<float>(), v.value.get<float>()) << k;
    else
      EXPECT_EQ(got.value, v.value) << k;
  }
  EXPECT_EQ(f.get_int("qwen3.block_count"), 28);
  EXPECT_EQ(f.get_int("general.signed"), -5);
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3");
  EXPECT_DOUBLE_EQ(*f.get_float("qwen3.rope.freq_base"), 1e6);
  EXPECT_EQ(f.get_int("absent"), std::nullopt);
  EXPECT_NE(error_of([&] {
              f.get_int("general.architecture");
            }).find("general.architecture is string, expected an integer"),
            std::string::npos);

  ASSERT_EQ(f.tensors().size(), 2u);
  const auto* e = f.find("token_embd.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape(), (std::vector<std::int64_t>{3, 5}));  // row-major: dims reversed
  EXPECT_EQ(e->nbytes, 60u);
  EXPECT_EQ(std::memcmp(f.data(*e), w.data(), 60), 0);
  const auto* qt = f.find("blk.0.ffn_up.weight");
  ASSERT_NE(qt, nullptr);
  EXPECT_EQ(qt->offset % 64, 0u);
  EXPECT_EQ(qt->nbytes, 68u);
  EXPECT_EQ(std::memcmp(f.data(*qt), q.data(), q.size()), 0);
}

// A tensor whose bytes are made by a fill callback when write() reaches it gives the same file
// as one given its bytes up front, and the callbacks run one at a time, in file order.
TEST_F(GgufTest, WriterFillsLazyTensorsInOrderWithTheSameBytes) {
  GgufMetadata md;
  md["general.architecture"] = {GgufType::String, GgufType::Uint8, "qwen3"};
  std::vector<float> w(3 * 5);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * static_cast<float>(i) - 2.0f;
  std::vector<std::uint8_t> q(2 * 34);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<std::uint8_t>(i * 5 + 1);
  GgufWriter eager;
  eager.add_tensor("token_embd.weight", {5, 3}, 0, w.data(), w.size() * 4);
  eager.add_tensor("blk.0.ffn_up.weight", {64, 1}, 8, q.data(), q.size());
  eager.write(path("eager.gguf"), md);
  std::vector<std::string> calls;
  GgufWriter lazy;
  lazy.add_tensor("token_embd.weight", {5, 3}, 0, w.size() * 4, [&](std::uint8_t* out) {
    calls.push_back("token_embd");
    std::memcpy(out, w.data(), w.size() * 4);
  });
  lazy.add_tensor("blk.0.ffn_up.weight", {64, 1}, 8, q.size(), [&](std::uint8_t* out) {
    calls.push_back("ffn_up");
    std::memcpy(out, q.data(), q.size());
  });
  EXPECT_TRUE(calls.empty()) << "nothing is made before write()";
  lazy.write(path("lazy.gguf"), md);
  EXPECT_EQ(calls, (std::vector<std::string>{"token_embd", "ffn_up"}));
  std::ifstream a(path("eager.gguf"), std::ios::binary), b(path("lazy.gguf"), std::ios::binary);
  const std::string ea((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
  const std::string la((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
  EXPECT_GT(ea.size(), 128u);
  EXPECT_EQ(ea, la);
}

// One malformed file per peer bug class (and the other refusals), each refused by name.
TEST_F(GgufTest, RefusesEachMalformedFileByName) {
  struct Case {
    std::string name, expect;
    RawGguf file;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, std::string expect, RawGguf f) {
    cases.push_back({std::move(name), std::move(expect), std::move(f)});
  };
  add("magic", "not a GGUF file", RawGguf().put<std::uint32_t>(0x12345678).bytes(40));
  add("version", "GGUF version 7 is not supported", RawGguf().header(0, 0, 7));
  add("big_endian", "a big-endian GGUF file", RawGguf().header(0, 0, 0x03000000));
  add("truncated_header", "the metadata count needs 8 bytes",
      RawGguf().put<std::uint32_t>(0x46554747).put<std::uint32_t>(3).put<std::uint64_t>(0));
  add("kv_count", "metadata entries cannot fit", RawGguf().header(0, 1ull << 40).bytes(64));
  add("tensor_count", "tensors cannot fit", RawGguf().header(1ull << 40, 0).bytes(64));
  add("string_length", "string length 1099511627776 is larger than the file",
      RawGguf().header(0, 1).put<std::uint64_t>(1ull << 40).bytes(64));
  add("value_type", "k: unknown value type 99",
      RawGguf().header(0, 1).str("k").put<std::uint32_t>(99).bytes(16));
  add("array_length", "k: array of 1152921504606846976 u32 is larger than the file",
      RawGguf()
          .header(0, 1)
          .str("k")
          .put<std::uint32_t>(9)
          .put<std::uint32_t>(4)
          .put<std::uint64_t>(1ull << 60)
          .bytes(16));
  add("array_overflow", "k: array of 4611686018427387904 u64",
      RawGguf()
          .header(0, 1)
          .str("k")
          .put<std::uint32_t>(9)
          .put<std::uint32_t>(10)
          .put<std::uint64_t>(1ull << 62)
          .bytes(16));
  add("array_elem_type", "k: array element type 77 is unknown",
      RawGguf()
          .header(0, 1)
          .str("k")
          .put<std::uint32_t>(9)
          .put<std::uint32_t>(77)
          .put<std::uint64_t>(1)
          .bytes(16));
  add("nested_array", "nested arrays are not supported",
      RawGguf()
          .header(0, 1)
          .str("k")
          .put<std::uint32_t>(9)
          .put<std::uint32_t>(9)
          .put<std::uint64_t>(1)
          .bytes(16));
  add("bool_value", "k: bool value 2 is neither 0 nor 1",
      RawGguf().header(0, 1).str("k").put<std::uint32_t>(7).put<std::uint8_t>(2).bytes(8));
  add("duplicate_key", "metadata key k appears twice",
      RawGguf()
          .header(0, 2)
          .str("k")
          .put<std::uint32_t>(4)
          .put<std::uint32_t>(1)
          .str("k")
          .put<std::uint32_t>(4)
          .put<std::uint32_t>(2)
          .bytes(8));
  add("alignment", "general.alignment 48 is not a power of two in [8, 65536]",
      RawGguf().header(0, 1).str("general.alignment").put<std::uint32_t>(4).put<std::uint32_t>(48));
  add("alignment_huge", "general.alignment 4294967295 is not a power of two",
      RawGguf()
          .header(0, 1)
          .str("general.alignment")
          .put<std::uint32_t>(4)
          .put<std::uint32_t>(0xffffffffu));
  add("alignment_type", "general.alignment is u64, expected u32",
      RawGguf()
          .header(0, 1)
          .str("general.alignment")
          .put<std::uint32_t>(10)
          .put<std::uint64_t>(32));
  add("n_dims", "tensor t has 5 dims; GGUF allows 1 to 4",
      RawGguf().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad().bytes(32));
  add("zero_dim", "tensor t has dim 1 of size 0",
      RawGguf().header(1, 0).tensor("t", {4, 0}, 0, 0).pad().bytes(32));
  add("numel_overflow", "tensor t: the element count overflows",
      RawGguf().header(1, 0).tensor("t", {1ull << 32, 1ull << 32}, 0, 0).pad().bytes(32));
  add("bytes_overflow", "tensor t: the byte size overflows",
      RawGguf().header(1, 0).tensor("t", {1ull << 31, 1ull << 31}, 0, 0).pad().bytes(32));
  add("tensor_type", "tensor t has unknown ggml type 5",
      RawGguf().header(1, 0).tensor("t", {4}, 5, 0).pad().bytes(32));
  add("partial_block", "tensor t: rows of 40 are not whole q8_0 blocks of 32",
      RawGguf().header(1, 0).tensor("t", {40}, 8, 0).pad().bytes(64));
  add("past_end", "tensor t (64 bytes at data offset 32) runs past the end of the file",
      RawGguf().header(1, 0).tensor("t", {16}, 0, 32).pad().bytes(64));
  add("offset_overflow", "runs past the end of the file",
      RawGguf().header(1, 0).tensor("t", {16}, 0, ~0ull - 31).pad().bytes(64));
  add("unaligned", "tensor t at offset 4 is not aligned to 32",
      RawGguf().header(1, 0).tensor("t", {4}, 0, 4).pad().bytes(64));
  add("overlap", "tensors a and b overlap",
      RawGguf().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad().bytes(128));
  add("duplicate_tensor", "tensor a appears twice",
      RawGguf().header(2, 0).tensor("a", {4}, 0, 0).tensor("a", {4}, 0, 32).pad().bytes(64));
  add("long_name", "a tensor name: string length 65 is longer than the 64 bytes allowed",
      RawGguf().header(1, 0).tensor(std::string(65, 'x'), {4}, 0, 0).pad().bytes(32));
  add("long_key", "a metadata key: string length 65536 is longer than the 65535 bytes allowed",
      RawGguf()
          .header(0, 1)
          .str(std::string(65536, 'k'))
          .put<std::uint32_t>(4)
          .put<std::uint32_t>(1));
  // Untrusted names reach messages escaped: no raw control bytes on the user's terminal.
  add("escaped_key", "metadata key \\x1b[31mred appears twice",
      RawGguf()
          .header(0, 2)
          .str("\x1b[31mred")
          .put<std::uint32_t>(4)
          .put<std::uint32_t>(1)
          .str("\x1b[31mred")
          .put<std::uint32_t>(4)
          .put<std::uint32_t>(2)
          .bytes(8));
  for (const Case& c : cases) {
    const std::string p = path(c.name + ".gguf");
    c.file.save(p);
    const std::string e = error_of([&] { GgufFile f(p); });
    EXPECT_NE(e.find("[gguf] " + p + ": "), std::string::npos) << c.name << ": " << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.name << ": " << e;
  }
}

// The smallest valid files: no tensors, and tensors exactly filling the file.
TEST_F(GgufTest, AcceptsEdgeFiles) {
  RawGguf().header(0, 0).save(path("empty.gguf"));
  GgufFile empty(path("empty.gguf"));
  EXPECT_TRUE(empty.tensors().empty());
  RawGguf()
      .header(2, 0)
      .tensor("a", {8}, 0, 0)
      .tensor("b", {32}, 8, 32)
      .pad()
      .bytes(32 + 34)
      .save(path("exact.gguf"));
  GgufFile exact(path("exact.gguf"));
  ASSERT_EQ(exact.tensors().size(), 2u);
  EXPECT_EQ(exact.find("b")->nbytes, 34u);
  EXPECT_EQ(exact.data(*exact.find("b")) - exact.data(*exact.find("a")), 32);
}

TEST_F(GgufTest, WriterRefusesBadTensors) {
  GgufWriter w;
  std::vector<std::uint8_t> buf(64);
  EXPECT_NE(error_of([&] {
              w.add_tensor("t", {40}, 8, buf.data(), 34);
            }).find("[gguf] writing t: rows of 40 are not whole q8_0 blocks"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              w.add_tensor("t", {4}, 0, buf.data(), 15);
            }).find("[gguf] writing t: 15 bytes given, 4 f32 elements take 16"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { w.add_tensor("t", {4}, 99, buf.data(), 16); }).find("unknown ggml type 99"),
      std::string::npos);
  w.add_tensor("t", {4}, 0, buf.data(), 16);
  EXPECT_NE(error_of([&] { w.add_tensor("t", {4}, 0, buf.data(), 16); }).find("added twice"),
            std::string::npos);
}

}  // namespace
