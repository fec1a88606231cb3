// llama2.c .bin checkpoints: the test writes small fake checkpoints in both
// formats (its own description of export.py's layouts), fills every tensor
// with values that identify it, and checks the reader maps names, shapes and
// values; then absurd headers and wrong file sizes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kernels/common/error.h"
#include "models/io/llama2c_bin.h"

namespace fs = std::filesystem;
using kiln::io::Llama2cCheckpoint;
using kiln::io::load_llama2c_bin;

namespace {

struct Cfg {
  int32_t dim, hidden, layers, heads, kv_heads, vocab, seq;
};

struct Seg {
  std::string name;  // "" = filler that the reader skips
  std::vector<int64_t> shape;
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Value of element i of segment k: unique per segment and element.
float value(size_t k, int64_t i) {
  return static_cast<float>(k) * 1000.0f + static_cast<float>(i % 997) * 0.5f;
}

std::string L(int l, const std::string& rest) {
  return "model.layers." + std::to_string(l) + "." + rest;
}

// export.py legacy_export order.
std::vector<Seg> legacy_layout(const Cfg& c, bool shared) {
  int64_t D = c.dim, H = c.hidden, V = c.vocab, KV = D / c.heads * c.kv_heads, hs = D / c.heads;
  std::vector<Seg> s{{"model.embed_tokens.weight", {V, D}}};
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "input_layernorm.weight"), {D}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "self_attn.q_proj.weight"), {D, D}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "self_attn.k_proj.weight"), {KV, D}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "self_attn.v_proj.weight"), {KV, D}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "self_attn.o_proj.weight"), {D, D}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "post_attention_layernorm.weight"), {D}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "mlp.gate_proj.weight"), {H, D}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "mlp.down_proj.weight"), {D, H}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "mlp.up_proj.weight"), {H, D}});
  s.push_back({"model.norm.weight", {D}});
  s.push_back({"", {c.seq, hs / 2}});  // freqs_cos
  s.push_back({"", {c.seq, hs / 2}});  // freqs_sin
  if (!shared) s.push_back({"lm_head.weight", {V, D}});
  return s;
}

// export.py version1_export order.
std::vector<Seg> v1_layout(const Cfg& c, bool shared) {
  int64_t D = c.dim, H = c.hidden, V = c.vocab, KV = D / c.heads * c.kv_heads;
  std::vector<Seg> s;
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "input_layernorm.weight"), {D}});
  for (int l = 0; l < c.layers; ++l) s.push_back({L(l, "post_attention_layernorm.weight"), {D}});
  s.push_back({"model.norm.weight", {D}});
  s.push_back({"model.embed_tokens.weight", {V, D}});
  const std::pair<const char*, std::vector<int64_t>> mats[] = {
      {"self_attn.q_proj.weight", {D, D}},  {"self_attn.k_proj.weight", {KV, D}},
      {"self_attn.v_proj.weight", {KV, D}}, {"self_attn.o_proj.weight", {D, D}},
      {"mlp.gate_proj.weight", {H, D}},     {"mlp.down_proj.weight", {D, H}},
      {"mlp.up_proj.weight", {H, D}}};
  for (const auto& [name, shape] : mats)
    for (int l = 0; l < c.layers; ++l) s.push_back({L(l, name), shape});
  if (!shared) s.push_back({"lm_head.weight", {V, D}});
  return s;
}

class Llama2cBinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_l2c_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const Cfg& c, int version, bool shared,
                    const std::vector<Seg>& segs) {
    std::string p = (dir_ / name).string();
    std::ofstream f(p, std::ios::binary);
    auto i32 = [&](int32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
    if (version == 0) {
      for (int32_t v :
           {c.dim, c.hidden, c.layers, c.heads, c.kv_heads, shared ? c.vocab : -c.vocab, c.seq})
        i32(v);
    } else {
      uint32_t magic = 0x616b3432;
      f.write(reinterpret_cast<const char*>(&magic), 4);
      i32(version);
      for (int32_t v : {c.dim, c.hidden, c.layers, c.heads, c.kv_heads, c.vocab, c.seq}) i32(v);
      char flag = shared ? 1 : 0;
      f.write(&flag, 1);
      std::string pad(256 - 37, '\0');
      f.write(pad.data(), static_cast<std::streamsize>(pad.size()));
    }
    for (size_t k = 0; k < segs.size(); ++k) {
      int64_t n = numel(segs[k].shape);
      for (int64_t i = 0; i < n; ++i) {
        float v = segs[k].name.empty() ? -99.0f : value(k, i);
        f.write(reinterpret_cast<const char*>(&v), 4);
      }
    }
    return p;
  }

  void check(const Llama2cCheckpoint& ck, const Cfg& c, int version, bool shared,
             const std::vector<Seg>& segs) {
    EXPECT_EQ(ck.config.dim, c.dim);
    EXPECT_EQ(ck.config.hidden_dim, c.hidden);
    EXPECT_EQ(ck.config.n_layers, c.layers);
    EXPECT_EQ(ck.config.n_heads, c.heads);
    EXPECT_EQ(ck.config.n_kv_heads, c.kv_heads);
    EXPECT_EQ(ck.config.vocab_size, c.vocab);
    EXPECT_EQ(ck.config.seq_len, c.seq);
    EXPECT_EQ(ck.config.shared_classifier, shared);
    EXPECT_EQ(ck.config.version, version);
    size_t named = 0;
    for (size_t k = 0; k < segs.size(); ++k) {
      if (segs[k].name.empty()) continue;
      ++named;
      const auto& t = ck.at(segs[k].name);
      EXPECT_EQ(t.shape, segs[k].shape) << segs[k].name;
      auto v = t.values();
      ASSERT_EQ(static_cast<int64_t>(v.size()), numel(segs[k].shape));
      for (int64_t i = 0; i < numel(segs[k].shape); ++i)
        ASSERT_EQ(v[i], value(k, i)) << segs[k].name << " element " << i;
    }
    EXPECT_EQ(ck.tensors.size(), named);
    EXPECT_EQ(ck.tensors.count("lm_head.weight"), shared ? 0u : 1u);
    EXPECT_EQ(ck.tensors.size(), 2u + 9u * c.layers + (shared ? 0u : 1u));
  }

  void expect_bad(const std::string& p, const std::string& what) {
    try {
      load_llama2c_bin(p);
      ADD_FAILURE() << "no error, expected '" << what << "'";
    } catch (const kiln::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("[llama2c]"), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

// GQA (kv_heads < heads), odd hidden, head size 4.
const Cfg kCfg{16, 40, 2, 4, 2, 37, 8};

}  // namespace

TEST_F(Llama2cBinTest, LegacyShared) {
  auto segs = legacy_layout(kCfg, true);
  auto ck = load_llama2c_bin(write("m.bin", kCfg, 0, true, segs));
  check(ck, kCfg, 0, true, segs);
}

TEST_F(Llama2cBinTest, LegacyUnshared) {
  auto segs = legacy_layout(kCfg, false);
  auto ck = load_llama2c_bin(write("m.bin", kCfg, 0, false, segs));
  check(ck, kCfg, 0, false, segs);
}

TEST_F(Llama2cBinTest, Version1Shared) {
  auto segs = v1_layout(kCfg, true);
  auto ck = load_llama2c_bin(write("m.bin", kCfg, 1, true, segs));
  check(ck, kCfg, 1, true, segs);
}

TEST_F(Llama2cBinTest, Version1Unshared) {
  Cfg c{8, 24, 3, 2, 1, 11, 5};  // multi-query, 3 layers
  auto segs = v1_layout(c, false);
  auto ck = load_llama2c_bin(write("m.bin", c, 1, false, segs));
  check(ck, c, 1, false, segs);
  EXPECT_EQ(kiln::io::read_llama2c_config((dir_ / "m.bin").string()).n_layers, 3);
}

TEST_F(Llama2cBinTest, CheckpointOutlivesCopies) {
  auto segs = legacy_layout(kCfg, true);
  Llama2cCheckpoint ck;
  {
    auto tmp = load_llama2c_bin(write("m.bin", kCfg, 0, true, segs));
    ck = tmp;  // shares the mapping
  }
  fs::remove(dir_ / "m.bin");  // the mapping stays valid after unlink
  EXPECT_EQ(ck.at("model.norm.weight").values()[1], value(1 + 9 * kCfg.layers, 1));
}

TEST_F(Llama2cBinTest, AbsurdHeader) {
  Cfg c = kCfg;
  c.dim = 1'000'000'000;
  expect_bad(write("a.bin", c, 0, true, {}), "dim = 1000000000 is out of range");
  c = kCfg;
  c.layers = -3;
  expect_bad(write("b.bin", c, 0, true, {}), "n_layers = -3");
  c = kCfg;
  c.heads = 3;  // does not divide 16
  expect_bad(write("c.bin", c, 0, true, {}), "does not divide dim");
  c = kCfg;
  c.kv_heads = 3;
  expect_bad(write("d.bin", c, 0, true, {}), "n_kv_heads = 3");
  c = kCfg;
  c.vocab = 20'000'000;
  expect_bad(write("e.bin", c, 1, true, {}), "vocab_size = 20000000");
  c = kCfg;
  c.seq = 0;
  expect_bad(write("f.bin", c, 0, true, {}), "seq_len = 0");
  c = kCfg;
  c.vocab = INT_MIN;
  expect_bad(write("g.bin", c, 0, true, {}), "vocab_size");
  c = kCfg;
  c.heads = 16;  // head size 1: odd
  c.kv_heads = 16;
  expect_bad(write("h.bin", c, 0, true, {}), "odd");
}

TEST_F(Llama2cBinTest, TruncatedAndOversizedFiles) {
  auto segs = legacy_layout(kCfg, false);
  std::string p = write("t.bin", kCfg, 0, false, segs);
  uint64_t size = fs::file_size(p);
  fs::resize_file(p, size - 4);
  expect_bad(p, "(truncated?)");
  fs::resize_file(p, size + 4);
  expect_bad(p, "needs exactly " + std::to_string(size) + " bytes");
  fs::resize_file(p, 10);
  expect_bad(p, "too small");
  // A shared-classifier file read as version 1 with the flag cleared misses the classifier.
  auto v1 = v1_layout(kCfg, true);
  std::string q = write("v.bin", kCfg, 1, true, v1);
  {
    std::fstream f(q, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(36);
    f.put(0);
  }
  expect_bad(q, "unshared classifier needs exactly");
}

TEST_F(Llama2cBinTest, RejectsOtherVersions) {
  expect_bad(write("v2.bin", kCfg, 2, true, {}), "version 2 is not supported");
  auto v1 = v1_layout(kCfg, true);
  std::string q = write("flag.bin", kCfg, 1, true, v1);
  {
    std::fstream f(q, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(36);
    f.put(7);
  }
  expect_bad(q, "shared_classifier flag is 7");
}
