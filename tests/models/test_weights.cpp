// Weight I/O: safetensors round trips (F32 bit-exact, BF16 rounding, sharded
// folders), name/shape validation errors, tied lm_head handling, and llama2.c
// .bin checkpoints written here from a kiln model in the legacy layout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "models/weights.h"
#include "tests/models/tiny_hf.h"

namespace fs = std::filesystem;
using namespace kiln;
using kiln::models::DecoderModel;
using kiln::models::ModelConfig;

namespace {

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_weights_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// Qwen3-style: QK-norm, GQA, untied (so every kind of parameter name exists).
ModelConfig qwen_cfg(bool tied = false) {
  ModelConfig c;
  c.name = "tiny-qwen3";
  c.vocab_size = 40;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.hidden_dim = 24;
  c.max_seq_len = 16;
  c.norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.rope_style = ops::RopeStyle::RotateHalf;
  c.qk_norm = true;
  c.tie_embeddings = tied;
  return c;
}

// What llama2c_model_config produces for a header (dim 16, 4 heads, 2 kv heads).
ModelConfig llama2c_cfg(bool shared) {
  ModelConfig c;
  c.name = "llama2c";
  c.vocab_size = 40;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.hidden_dim = 32;
  c.max_seq_len = 12;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.rope_style = ops::RopeStyle::Interleaved;
  c.tie_embeddings = shared;
  return c;
}

// Norm weights are 1 at init; perturb every parameter so a load that skips
// one, or swaps two, is visible.
void perturb(nn::Module& m, std::uint64_t seed) {
  Generator gen(seed);
  for (auto& [name, p] : m.named_parameters()) {
    Tensor noise = ops::randn(p.shape(), gen, 0.0, 0.05, p.dtype());
    Tensor d = p.detach();
    d.copy_(ops::add(d, noise));
  }
}

std::map<std::string, std::vector<float>> values(const nn::Module& m) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = p.to_float_vector();
  return out;
}

// Round to nearest even bf16, as float (independent of the kernels' conversion).
float bf16_round(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  std::uint32_t lsb = (u >> 16) & 1u;
  u = (u + 0x7fffu + lsb) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

Tensor ids_batch(const ModelConfig& c, std::int64_t B, std::int64_t T, std::uint32_t seed) {
  std::vector<std::int32_t> v(B * T);
  std::uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(c.vocab_size));
  }
  return ops::from_vector(v, {B, T});
}

std::string load_error(nn::Module& m, const std::string& p, const models::LoadOptions& o = {}) {
  try {
    models::load_safetensors(m, p, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_F(WeightsTest, SafetensorsRoundTripF32IsBitExact) {
  DecoderModel a(qwen_cfg(), 1);
  perturb(a, 11);
  models::save_safetensors(a, path("m.safetensors"));

  io::SafetensorsFile f(path("m.safetensors"));
  EXPECT_EQ(f.entries().size(), a.named_parameters().size());
  ASSERT_TRUE(f.metadata().count("kiln_config"));
  ModelConfig back = ModelConfig::from_json(nlohmann::json::parse(f.metadata().at("kiln_config")));
  EXPECT_EQ(back.to_json(), a.cfg.to_json());
  EXPECT_EQ(f.metadata().at("format"), "pt");

  DecoderModel b(qwen_cfg(), 2);
  Tensor before = b.model->embed_tokens->weight;  // handles held elsewhere must see the load
  models::load_safetensors(b, path("m.safetensors"));
  auto va = values(a), vb = values(b);
  ASSERT_EQ(va.size(), vb.size());
  for (const auto& [name, v] : va) {
    ASSERT_EQ(v.size(), vb[name].size()) << name;
    EXPECT_EQ(std::memcmp(v.data(), vb[name].data(), v.size() * 4), 0) << name;
  }
  EXPECT_EQ(before.to_float_vector(), va["model.embed_tokens.weight"]);
}

TEST_F(WeightsTest, Bf16SaveGivesRoundedValues) {
  DecoderModel a(qwen_cfg(), 3);
  perturb(a, 12);
  models::save_safetensors(a, path("bf16.safetensors"), DType::BF16);
  io::SafetensorsFile f(path("bf16.safetensors"));
  for (const auto& e : f.entries()) EXPECT_EQ(e.dtype, "BF16") << e.name;

  DecoderModel b(qwen_cfg(), 4);
  models::load_safetensors(b, path("bf16.safetensors"));
  auto va = values(a), vb = values(b);
  std::size_t rounded_differently = 0;
  for (const auto& [name, v] : va)
    for (std::size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(vb[name][i], bf16_round(v[i])) << name << "[" << i << "]";
      rounded_differently += vb[name][i] != v[i];
    }
  EXPECT_GT(rounded_differently, 0u);  // the test really exercised rounding

  // An F32 file into a BF16 model converts on load, to the same rounding.
  DecoderModel c(qwen_cfg(), 5, DType::BF16);
  models::save_safetensors(a, path("f32.safetensors"));
  models::load_safetensors(c, path("f32.safetensors"));
  for (const auto& [name, p] : c.named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::BF16);
    auto v = p.to_float_vector();
    for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], bf16_round(va[name][i])) << name;
  }
}

TEST_F(WeightsTest, LoadsShardedFolderAndSingleFileFolder) {
  DecoderModel a(qwen_cfg(), 6);
  perturb(a, 13);
  // Two shards: embeddings + layer 0 in one, the rest in the other; F64 and F16 mixed in.
  fs::create_directories(dir_ / "sharded");
  io::SafetensorsWriter w1, w2;
  std::vector<Tensor> keep;
  std::map<std::string, std::string> weight_map;
  std::map<std::string, std::vector<float>> expect;
  int i = 0;
  for (const auto& [name, p] : a.named_parameters()) {
    DType dt = (i % 3 == 0) ? DType::F64 : (i % 3 == 1 ? DType::F32 : DType::F16);
    Tensor t = p.detach().to(dt).contiguous();
    keep.push_back(t);
    expect[name] = t.to_float_vector();
    bool first =
        name.find("layers.1.") == std::string::npos && name.find("lm_head") == std::string::npos;
    (first ? w1 : w2)
        .add(name, std::string(dtype_safetensors_name(dt)), t.shape(), t.raw_data(), t.nbytes());
    weight_map[name] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    ++i;
  }
  w1.write((dir_ / "sharded" / "model-00001-of-00002.safetensors").string());
  w2.write((dir_ / "sharded" / "model-00002-of-00002.safetensors").string());
  io::write_safetensors_index((dir_ / "sharded" / "model.safetensors.index.json").string(), {},
                              weight_map);
  DecoderModel b(qwen_cfg(), 7);
  models::load_safetensors(b, (dir_ / "sharded").string());
  auto vb = values(b);
  for (const auto& [name, v] : expect) EXPECT_EQ(vb[name], v) << name;

  fs::create_directories(dir_ / "single");
  models::save_safetensors(a, (dir_ / "single" / "model.safetensors").string());
  DecoderModel c(qwen_cfg(), 8);
  models::load_safetensors(c, (dir_ / "single").string());
  EXPECT_EQ(values(c), values(a));
}

TEST_F(WeightsTest, MismatchErrorListsEveryNameAndLoadsNothing) {
  DecoderModel a(qwen_cfg(), 9);
  io::SafetensorsWriter w;
  std::vector<Tensor> keep;
  for (const auto& [name, p] : a.named_parameters()) {
    if (name == "model.layers.1.mlp.up_proj.weight" || name == "model.norm.weight") continue;
    Tensor t = p.detach();
    if (name == "model.layers.0.self_attn.k_proj.weight") t = ops::zeros({8, 16});
    keep.push_back(t);
    w.add(name, "F32", t.shape(), t.raw_data(), t.nbytes());
  }
  Tensor extra = ops::zeros({3});
  w.add("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {3}, extra.raw_data(), 12);
  Tensor ids = ops::from_vector(std::vector<std::int32_t>{1, 2, 3}, {3});
  w.add("model.layers.0.bad_dtype", "I32", {3}, ids.raw_data(), 12);
  w.write(path("bad.safetensors"));

  DecoderModel b(qwen_cfg(), 10);
  auto before = values(b);
  std::string msg = load_error(b, path("bad.safetensors"));
  ASSERT_FALSE(msg.empty());
  EXPECT_NE(msg.find("[load_safetensors]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
  for (const char* s :
       {"missing: ", "model.layers.1.mlp.up_proj.weight", "model.norm.weight",
        "unexpected: ", "model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.0.bad_dtype",
        "wrong shape: ", "model.layers.0.self_attn.k_proj.weight (file (8, 16), model (16, 16))"})
    EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg;
  EXPECT_EQ(values(b), before);  // validation happens before any copy

  // A wrong dtype on a real parameter is named too.
  io::SafetensorsWriter w2;
  std::vector<Tensor> keep2;
  for (const auto& [name, p] : a.named_parameters()) {
    Tensor t = name == "model.norm.weight" ? ops::zeros({16}, DType::I32) : p.detach();
    keep2.push_back(t);
    w2.add(name, std::string(dtype_safetensors_name(t.dtype())), t.shape(), t.raw_data(),
           t.nbytes());
  }
  w2.write(path("dtype.safetensors"));
  msg = load_error(b, path("dtype.safetensors"));
  EXPECT_NE(msg.find("model.norm.weight (I32)"), std::string::npos) << msg;

  EXPECT_NE(load_error(b, path("absent.safetensors")).find("absent.safetensors"),
            std::string::npos);
}

TEST_F(WeightsTest, TiedModelAndLmHeadInFile) {
  // An untied file has lm_head.weight; a tied model reports it unless told to ignore it.
  DecoderModel untied(qwen_cfg(false), 14);
  perturb(untied, 15);
  models::save_safetensors(untied, path("untied.safetensors"));
  DecoderModel tied(qwen_cfg(true), 16);
  std::string msg = load_error(tied, path("untied.safetensors"));
  EXPECT_NE(msg.find("unexpected: lm_head.weight"), std::string::npos) << msg;

  models::LoadOptions o;
  o.ignore_tied_lm_head = true;
  models::load_safetensors(tied, path("untied.safetensors"), o);
  EXPECT_EQ(tied.model->embed_tokens->weight.to_float_vector(),
            untied.model->embed_tokens->weight.to_float_vector());

  // And the reverse: an untied model needs lm_head.weight.
  models::save_safetensors(tied, path("tied.safetensors"));
  msg = load_error(untied, path("tied.safetensors"));
  EXPECT_NE(msg.find("missing: lm_head.weight"), std::string::npos) << msg;
  o.ignore = {"model.extra"};
  EXPECT_FALSE(load_error(untied, path("tied.safetensors"), o).empty());
}

TEST_F(WeightsTest, MetaModelIsValidatedOnly) {
  DecoderModel a(qwen_cfg(), 17);
  models::save_safetensors(a, path("m.safetensors"));
  DecoderModel meta(qwen_cfg(), 18, DType::BF16, Device::meta());
  EXPECT_NO_THROW(models::load_safetensors(meta, path("m.safetensors")));
  DecoderModel meta_tied(qwen_cfg(true), 18, DType::BF16, Device::meta());
  EXPECT_FALSE(load_error(meta_tied, path("m.safetensors")).empty());
}

TEST_F(WeightsTest, Llama2cBinLoadsIntoModelWithSameLogits) {
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared classifier" : "separate classifier");
    DecoderModel a(llama2c_cfg(shared), 20);
    perturb(a, 21);
    std::string p = path(shared ? "shared.bin" : "unshared.bin");
    test_hf::write_llama2c_bin(a, p, /*freq_cis_fill=*/7.0f);  // garbage the reader must skip

    auto b = models::load_llama2c_model(p);
    EXPECT_EQ(b->cfg.to_json(), a.cfg.to_json());
    EXPECT_EQ(values(*b), values(a));
    NoGradGuard ng;
    Tensor ids = ids_batch(a.cfg, 2, 12, 5);
    auto la = a.forward(ids).to_float_vector();
    auto lb = b->forward(ids).to_float_vector();
    ASSERT_EQ(la.size(), lb.size());
    ASSERT_EQ(la.size(), static_cast<std::size_t>(2 * 12 * 40));
    double max_diff = 0, max_abs = 0;
    for (std::size_t i = 0; i < la.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double(la[i]) - lb[i]));
      max_abs = std::max(max_abs, std::fabs(double(la[i])));
    }
    EXPECT_EQ(max_diff, 0.0);  // same weights, same config, same kernels
    EXPECT_GT(max_abs, 0.0);
  }
}

TEST_F(WeightsTest, Llama2cConfigFromHeader) {
  io::Llama2cConfig h;
  h.dim = 288, h.hidden_dim = 768, h.n_layers = 6, h.n_heads = 6, h.n_kv_heads = 6;
  h.vocab_size = 32000, h.seq_len = 256, h.shared_classifier = true;
  ModelConfig c = models::llama2c_model_config(h);
  ModelConfig s = models::preset("stories15M");
  EXPECT_EQ(c.dim, s.dim);
  EXPECT_EQ(c.hidden_dim, s.hidden_dim);
  EXPECT_EQ(c.head_dim, s.head_dim);
  EXPECT_EQ(c.max_seq_len, s.max_seq_len);
  EXPECT_EQ(c.norm_eps, s.norm_eps);
  EXPECT_EQ(c.rope_theta, s.rope_theta);
  EXPECT_EQ(c.rope_style, s.rope_style);
  EXPECT_EQ(c.tie_embeddings, s.tie_embeddings);
  h.n_heads = 7;
  EXPECT_THROW(models::llama2c_model_config(h), Error);
}
