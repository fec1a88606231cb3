// A model from a GGUF file: a tiny Qwen3 written with llama.cpp's tensor names and metadata keys
// loads back with every parameter equal (f32 tensors as written, a Q8_0 one as its dequantized
// weights) and the same logits; metadata and tensors kiln does not implement are refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "kernels/common/half.h"
#include "kernels/common/quant.h"
#include "models/generation_config.h"
#include "models/gguf_model.h"
#include "models/io/tokenizer.h"
#include "tests/kernels/quant_ref.h"
#include "tests/models/tiny_hf.h"
#include "tests/test_data.h"

namespace fs = std::filesystem;

namespace kiln {
namespace {

using io::GgufMetadata;
using io::GgufType;

// llama.cpp's name for a kiln parameter (the inverse of kiln_name_of_gguf_tensor).
std::string gguf_name(const std::string& kiln) {
  if (kiln == "model.embed_tokens.weight") return "token_embd.weight";
  if (kiln == "model.norm.weight") return "output_norm.weight";
  if (kiln == "lm_head.weight") return "output.weight";
  const std::map<std::string, std::string> layer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const std::string rest = kiln.substr(std::string("model.layers.").size());
  const std::size_t dot = rest.find('.');
  return "blk." + rest.substr(0, dot) + "." + layer.at(rest.substr(dot + 1));
}

class GgufModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_gguf_model_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  GgufMetadata metadata(const models::ModelConfig& c, const std::string& arch) {
    GgufMetadata md;
    auto u32 = [](std::int64_t v) { return io::GgufValue{GgufType::Uint32, GgufType::Uint8, v}; };
    auto f32 = [](double v) { return io::GgufValue{GgufType::Float32, GgufType::Uint8, v}; };
    md["general.architecture"] = {GgufType::String, GgufType::Uint8, arch};
    md[arch + ".block_count"] = u32(c.n_layers);
    md[arch + ".embedding_length"] = u32(c.dim);
    md[arch + ".feed_forward_length"] = u32(c.hidden_dim);
    md[arch + ".attention.head_count"] = u32(c.n_heads);
    md[arch + ".attention.head_count_kv"] = u32(c.n_kv_heads);
    md[arch + ".attention.key_length"] = u32(c.head_dim);
    md[arch + ".attention.value_length"] = u32(c.head_dim);
    md[arch + ".context_length"] = u32(c.max_seq_len);
    md[arch + ".attention.layer_norm_rms_epsilon"] = f32(c.norm_eps);
    md[arch + ".rope.freq_base"] = f32(c.rope_theta);
    return md;
  }

  // Writes m's parameters (f32; the names in `q8` as Q8_0) and returns the file's path.
  std::string write(const models::DecoderModel& m, const GgufMetadata& md,
                    const std::vector<std::string>& q8 = {}, const std::string& skip = "") {
    io::GgufWriter w;
    keep_.clear();
    for (const auto& [name, p] : m.named_parameters()) {
      if (name == skip) continue;
      std::vector<std::int64_t> dims(p.shape().rbegin(), p.shape().rend());
      const std::vector<float> v = p.to_float_vector();
      std::vector<std::uint8_t> bytes;
      std::uint32_t type = 0;
      if (std::find(q8.begin(), q8.end(), name) != q8.end()) {
        bytes = test::quantize_q8_0(v);
        type = 8;
      } else {
        bytes.resize(v.size() * 4);
        std::memcpy(bytes.data(), v.data(), bytes.size());
      }
      keep_.push_back(std::move(bytes));
      w.add_tensor(gguf_name(name), dims, type, keep_.back().data(), keep_.back().size());
    }
    const std::string path = (dir_ / "model.gguf").string();
    w.write(path, md);
    return path;
  }

  fs::path dir_;
  std::vector<std::vector<std::uint8_t>> keep_;
};

Tensor logits_of(models::DecoderModel& m) {
  NoGradGuard no_grad;
  const Tensor ids = ops::from_vector(std::vector<std::int32_t>{3, 17, 256, 999, 5, 42}, {1, 6});
  return m.forward(ids);
}

// max |a - b| and max |b| over two logit vectors of one size.
std::pair<double, double> max_diff_and_spread(const std::vector<float>& a,
                                              const std::vector<float>& b) {
  double diff = 0, spread = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    spread = std::max(spread, std::fabs(double(b[i])));
  }
  return {diff, spread};
}

TEST_F(GgufModelTest, Qwen3LoadsWithEveryParameterAndTheSameLogits) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const models::ModelConfig c = test_hf::tiny_qwen3(tied);
    models::DecoderModel m(c, 0, DType::F32, Device::cpu());
    test_hf::init_weights(m, 9);
    const std::string path =
        write(m, metadata(c, "qwen3"), {"model.layers.1.mlp.down_proj.weight"});

    io::GgufFile f(path);
    const models::ModelConfig g = models::gguf_model_config(f);
    EXPECT_EQ(g.to_json().dump(), [&] {
      models::ModelConfig want = c;
      want.name = "qwen3";
      want.norm_eps =
          static_cast<float>(c.norm_eps);  // GGUF stores it as f32, as llama.cpp uses it
      return want.to_json().dump();
    }()) << "the config from the GGUF metadata";

    // Dequantized at load: every parameter a float tensor of the model's shape.
    auto loaded = models::load_gguf_model(path, DType::F32, Device::cpu(), false);
    auto want = m.state_dict();
    for (const auto& [name, p] : loaded->named_parameters()) {
      std::vector<float> expect = want.at(name).to_float_vector();
      if (name == "model.layers.1.mlp.down_proj.weight") {  // the Q8_0 one: its weights
        const std::vector<std::uint8_t> q = test::quantize_q8_0(expect);
        Tensor blocks = Tensor::empty({static_cast<std::int64_t>(q.size())}, DType::Bool);
        std::memcpy(blocks.data<std::uint8_t>(), q.data(), q.size());
        expect = ops::dequantize(blocks, quant::QuantType::Q8_0, p.shape()).to_float_vector();
      }
      EXPECT_EQ(p.to_float_vector(), expect) << name;
    }
    if (!tied) {
      // Every tensor as written, but for the quantized one: compare logits without it.
      const std::string exact = write(m, metadata(c, "qwen3"));
      auto same = models::load_gguf_model(exact, DType::F32, Device::cpu());
      EXPECT_EQ(logits_of(*same).to_float_vector(), logits_of(m).to_float_vector());
    }
  }
}

// By default the Q8_0 Linear weight stays quantized (its bytes as written, run by
// ops::linear_quant); the logits then differ from the dequantized model's only by quantizing
// that layer's input to 8 bits (|d logit| well below the logits' spread).
TEST_F(GgufModelTest, QuantizedLinearWeightsStayQuantizedAndRun) {
  const models::ModelConfig c = test_hf::tiny_qwen3(false);
  models::DecoderModel m(c, 0, DType::F32, Device::cpu());
  test_hf::init_weights(m, 9);
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  const std::string path = write(m, metadata(c, "qwen3"), {name, "lm_head.weight"});
  auto q = models::load_gguf_model(path, DType::F32, Device::cpu());
  auto deq = models::load_gguf_model(path, DType::F32, Device::cpu(), false);
  const auto linears = q->linears();
  ASSERT_TRUE(linears.at(name)->weight_quant.has_value());
  EXPECT_EQ(*linears.at(name)->weight_quant, quant::QuantType::Q8_0);
  EXPECT_TRUE(linears.at("lm_head.weight")->weight_quant.has_value());
  EXPECT_FALSE(linears.at("model.layers.0.mlp.down_proj.weight")->weight_quant.has_value());
  const Tensor& blocks = linears.at(name)->weight;
  EXPECT_EQ(blocks.dtype(), DType::Bool);
  const std::vector<std::uint8_t> written =
      test::quantize_q8_0(m.state_dict().at(name).to_float_vector());
  ASSERT_EQ(blocks.numel(), static_cast<std::int64_t>(written.size()));
  EXPECT_EQ(std::memcmp(blocks.data<std::uint8_t>(), written.data(), written.size()), 0);
  EXPECT_EQ(q->dtype(), DType::F32);
  const std::vector<float> a = logits_of(*q).to_float_vector(),
                           b = logits_of(*deq).to_float_vector();
  const auto [diff, spread] = max_diff_and_spread(a, b);
  EXPECT_GT(spread, 0.0);
  EXPECT_LT(diff, 0.05 * spread);
  // Module::to keeps the blocks' bytes; training through them is refused by name.
  q->to(DType::BF16);
  EXPECT_EQ(linears.at(name)->weight.dtype(), DType::Bool);
  EXPECT_EQ(q->dtype(), DType::BF16);
  Tensor x = ops::zeros({1, c.hidden_dim}).set_requires_grad(true);
  try {
    linears.at(name)->forward(x);
    ADD_FAILURE() << "a quantized weight took a gradient";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantized weights run inference only"), std::string::npos)
        << e.what();
  }
}

// A tied model with a quantized token table: lookups dequantize rows, the LM head runs the int8
// GEMV on the same blocks, and the logits follow the dequantized model's.
TEST_F(GgufModelTest, QuantizedTiedEmbeddingServesLookupAndLmHead) {
  const models::ModelConfig c = test_hf::tiny_qwen3(true);
  models::DecoderModel m(c, 0, DType::F32, Device::cpu());
  test_hf::init_weights(m, 19);
  const std::string path = write(m, metadata(c, "qwen3"), {"model.embed_tokens.weight"});
  auto q = models::load_gguf_model(path, DType::F32, Device::cpu());
  auto deq = models::load_gguf_model(path, DType::F32, Device::cpu(), false);
  const nn::Embedding& e = *q->model->embed_tokens;
  ASSERT_TRUE(e.weight_quant.has_value());
  EXPECT_EQ(e.weight.dtype(), DType::Bool);
  EXPECT_EQ(q->dtype(), DType::F32);
  EXPECT_EQ(q->device(), Device::cpu());
  const std::vector<float> a = logits_of(*q).to_float_vector(),
                           b = logits_of(*deq).to_float_vector();
  const auto [diff, spread] = max_diff_and_spread(a, b);
  EXPECT_GT(spread, 0.0);
  EXPECT_LT(diff, 0.05 * spread) << diff << " of " << spread;
}

// save_gguf_model: llama.cpp's names and metadata, Q8_0 bytes as llama.cpp's quantize_row_q8_0_ref
// writes them (tests/kernels/quant_ref.h), norms in f32; it reads back as the same config.
TEST_F(GgufModelTest, SavedQ8_0FileReadsBackWithLlamaCppsBytes) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const models::ModelConfig c = test_hf::tiny_qwen3(tied);
    models::DecoderModel m(c, 0, DType::F32, Device::cpu());
    test_hf::init_weights(m, 21);
    const std::string path = (dir_ / "saved.gguf").string();
    models::save_gguf_model(m, path, models::GgufScheme::Q8_0);
    io::GgufFile f(path);
    EXPECT_EQ(f.get_string("general.architecture"), "qwen3");
    models::ModelConfig want = c;
    want.name = "qwen3";
    want.norm_eps = static_cast<float>(c.norm_eps);
    EXPECT_EQ(models::gguf_model_config(f).to_json().dump(), want.to_json().dump());
    const auto sd = m.state_dict();
    EXPECT_EQ(f.tensors().size(), sd.size());
    for (const auto& [name, p] : sd) {
      const io::GgufTensor* t = f.find(models::gguf_name_of_kiln_tensor(name));
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->shape(), p.shape()) << name;
      const std::vector<float> v = p.to_float_vector();
      if (p.dim() == 2) {
        EXPECT_EQ(io::ggml_type_info(t->type)->name, "q8_0") << name;
        const std::vector<std::uint8_t> ref = test::quantize_q8_0(v);
        ASSERT_EQ(t->nbytes, ref.size()) << name;
        EXPECT_EQ(std::memcmp(f.data(*t), ref.data(), ref.size()), 0) << name;
      } else {
        EXPECT_EQ(io::ggml_type_info(t->type)->name, "f32") << name;
        EXPECT_EQ(std::memcmp(f.data(*t), v.data(), v.size() * 4), 0) << name;
      }
    }
    auto loaded = models::load_gguf_model(path, DType::F32, Device::cpu());
    EXPECT_EQ(loaded->cfg.tie_embeddings, tied);
    EXPECT_EQ(logits_of(*loaded).shape(), logits_of(m).shape());
  }
  // A llama (interleaved RoPE, kiln's llama2.c layout) is written as llama.cpp's llama arch and
  // reads back as itself, with the same logits in f32; rotate-half without QK-norm or bias (HF's
  // llama layout, which needs the converter's q/k permutation) is refused by name.
  models::ModelConfig llama = test_hf::tiny_qwen3(false);
  llama.qk_norm = false;
  llama.rope_style = ops::RopeStyle::Interleaved;
  models::DecoderModel lm(llama, 0, DType::F32, Device::cpu());
  test_hf::init_weights(lm, 22);
  const std::string lpath = (dir_ / "llama.gguf").string();
  models::save_gguf_model(lm, lpath, models::GgufScheme::F32);
  io::GgufFile lf(lpath);
  EXPECT_EQ(lf.get_string("general.architecture"), "llama");
  models::ModelConfig lwant = llama;
  lwant.name = "llama";
  lwant.norm_eps = static_cast<float>(llama.norm_eps);
  EXPECT_EQ(models::gguf_model_config(lf).to_json().dump(), lwant.to_json().dump());
  EXPECT_EQ(logits_of(*models::load_gguf_model(lpath, DType::F32, Device::cpu())).to_float_vector(),
            logits_of(lm).to_float_vector());
  llama.rope_style = ops::RopeStyle::RotateHalf;
  models::DecoderModel hf_llama(llama, 0, DType::F32, Device::meta());
  try {
    models::save_gguf_model(hf_llama, (dir_ / "x.gguf").string(), models::GgufScheme::Q8_0);
    ADD_FAILURE() << "a rotate-half llama was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kiln writes Qwen3, Qwen2 and LLaMA models"),
              std::string::npos)
        << e.what();
  }
}

// llama.cpp's Q4_K_M mix for Qwen3-0.6B's 28 layers, and the fallbacks for short rows.
TEST(GgufScheme, Q4_K_MPicksLlamaCppsTypes) {
  using models::GgufScheme;
  using quant::QuantType;
  auto type = [](const std::string& name, Shape shape) {
    return models::gguf_tensor_type(GgufScheme::Q4_K_M, name, shape, 28);
  };
  const std::string v = "self_attn.v_proj.weight", down = "mlp.down_proj.weight";
  EXPECT_EQ(type("lm_head.weight", {151936, 1024}), QuantType::Q6_K);
  EXPECT_EQ(type("model.embed_tokens.weight", {151936, 1024}), QuantType::Q4_K);
  EXPECT_EQ(type("model.layers.0." + v, {1024, 1024}), QuantType::Q6_K);      // first eighth
  EXPECT_EQ(type("model.layers.3." + v, {1024, 1024}), QuantType::Q4_K);      // (3 - 3) % 3 = 0
  EXPECT_EQ(type("model.layers.5." + down, {1024, 3072}), QuantType::Q6_K);   // (5 - 3) % 3 = 2
  EXPECT_EQ(type("model.layers.24." + down, {1024, 3072}), QuantType::Q6_K);  // last eighth
  EXPECT_EQ(type("model.layers.5.self_attn.q_proj.weight", {2048, 1024}), QuantType::Q4_K);
  EXPECT_EQ(type("model.layers.5.input_layernorm.weight", {1024}), std::nullopt);
  EXPECT_EQ(type("model.layers.5.mlp.up_proj.weight", {3072, 160}), QuantType::Q8_0);
  EXPECT_EQ(type("model.layers.5.mlp.up_proj.weight", {3072, 48}), std::nullopt);
  EXPECT_EQ(models::gguf_tensor_type(GgufScheme::Q8_0, "lm_head.weight", {10, 64}, 28),
            QuantType::Q8_0);
  EXPECT_EQ(models::gguf_tensor_type(GgufScheme::F32, "lm_head.weight", {10, 64}, 28),
            std::nullopt);
}

// A model with rows of whole 256-blocks written as Q4_K_M: Q4_K and Q6_K weights, read back
// quantized, and run by the int8 GEMV.
TEST_F(GgufModelTest, Q4_K_MFileRunsQuantized) {
  models::ModelConfig c = test_hf::tiny_qwen3(false);
  c.dim = 256;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.hidden_dim = 512;
  models::DecoderModel m(c, 0, DType::F32, Device::cpu());
  test_hf::init_weights(m, 31);
  const std::string path = (dir_ / "q4km.gguf").string();
  models::save_gguf_model(m, path, models::GgufScheme::Q4_K_M);
  EXPECT_EQ(io::GgufFile(path).get_int("general.file_type"), 15);
  auto q = models::load_gguf_model(path, DType::F32, Device::cpu());
  const auto linears = q->linears();
  EXPECT_EQ(*linears.at("lm_head.weight")->weight_quant, quant::QuantType::Q6_K);
  EXPECT_EQ(*linears.at("model.layers.0.mlp.down_proj.weight")->weight_quant,
            quant::QuantType::Q4_K);
  EXPECT_EQ(*linears.at("model.layers.1.mlp.down_proj.weight")->weight_quant,
            quant::QuantType::Q6_K);
  EXPECT_EQ(*linears.at("model.layers.1.mlp.up_proj.weight")->weight_quant, quant::QuantType::Q4_K);
  // Against the same file dequantized (the weights' own 4-6 bit error is the format's, tested in
  // tests/kernels/test_quantize.cpp): only the int8 activations differ, each value by at most
  // half a code (1/254 of its block's max), so the logits move by a few percent of their spread.
  auto dq = models::load_gguf_model(path, DType::F32, Device::cpu(), false);
  const std::vector<float> a = logits_of(*q).to_float_vector(),
                           b = logits_of(*dq).to_float_vector();
  const auto [diff, spread] = max_diff_and_spread(a, b);
  EXPECT_GT(spread, 0.0);
  EXPECT_LT(diff, 0.05 * spread) << "max |d logit| " << diff << " of " << spread;
}

// kiln generate --model file.gguf goes through load_model, as a folder or a .bin does.
TEST_F(GgufModelTest, LoadModelTakesAGgufFile) {
  const models::ModelConfig c = test_hf::tiny_qwen3(true);
  models::DecoderModel m(c, 0, DType::F32, Device::cpu());
  test_hf::init_weights(m, 5);
  models::ModelSource src;
  src.model = write(m, metadata(c, "qwen3"));
  src.tokenizer = "byte";
  src.dtype = DType::BF16;
  models::LoadedModel l = models::load_model(src);
  ASSERT_NE(l.model, nullptr);
  EXPECT_EQ(l.description, "qwen3 from GGUF " + src.model);
  EXPECT_EQ(l.model->cfg.n_layers, 2);
  EXPECT_EQ(l.model->named_parameters().front().second.dtype(), DType::BF16);
  ASSERT_NE(l.tokenizer, nullptr);
}

TEST_F(GgufModelTest, LlamaUsesInterleavedRopeAndBf16Loads) {
  models::ModelConfig c = test_hf::tiny_qwen3(false);
  c.qk_norm = false;
  c.rope_style = ops::RopeStyle::Interleaved;
  models::DecoderModel m(c, 0, DType::F32, Device::cpu());
  test_hf::init_weights(m, 4);
  const std::string path = write(m, metadata(c, "llama"));
  io::GgufFile f(path);
  const models::ModelConfig g = models::gguf_model_config(f);
  EXPECT_EQ(g.rope_style, ops::RopeStyle::Interleaved);
  EXPECT_FALSE(g.qk_norm);
  auto bf = models::load_gguf_model(path, DType::BF16, Device::cpu());
  EXPECT_EQ(bf->named_parameters().front().second.dtype(), DType::BF16);
  EXPECT_EQ(
      bf->state_dict().at("model.layers.0.mlp.up_proj.weight").to_float_vector(),
      m.state_dict().at("model.layers.0.mlp.up_proj.weight").to(DType::BF16).to_float_vector());
}

// kiln quantize of a LLaMA model with llama2.c's tokenizer: the file carries it as
// tokenizer.ggml.model "llama", and load_model (kiln generate) reads it back from the file.
TEST_F(GgufModelTest, LlamaFileCarriesItsSentencePieceTokenizer) {
  const io::Llama2cTokenizer tok(test_shared_data() + "/llama2c/tokenizer.bin");
  models::ModelConfig c = test_hf::tiny_qwen3(false);
  c.qk_norm = false;
  c.rope_style = ops::RopeStyle::Interleaved;
  c.vocab_size = tok.vocab_size();
  c.dim = 32, c.hidden_dim = 64, c.n_heads = 2, c.n_kv_heads = 2, c.head_dim = 16;
  models::DecoderModel m(c, 0, DType::F32, Device::cpu());
  const std::string path = (dir_ / "llama.gguf").string();
  models::save_gguf_model(m, path, models::GgufScheme::F32, &tok);
  models::ModelSource src;
  src.model = path;
  const models::LoadedModel l = models::load_model(src);
  const auto* read = dynamic_cast<const io::Llama2cTokenizer*>(l.tokenizer.get());
  ASSERT_NE(read, nullptr);
  EXPECT_EQ(read->vocab_size(), tok.vocab_size());
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  EXPECT_EQ(read->encode(text, true, false), tok.encode(text, true, false));
  EXPECT_EQ(read->eos_id(), 2);
}

TEST_F(GgufModelTest, RefusesWhatKilnDoesNotImplementByName) {
  const models::ModelConfig c = test_hf::tiny_qwen3(false);
  models::DecoderModel m(c, 0, DType::F32, Device::cpu());
  auto error_of = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  GgufMetadata md = metadata(c, "qwen3");
  md["qwen3.rope.scaling.type"] = {GgufType::String, GgufType::Uint8, "yarn"};
  std::string path = write(m, md);
  EXPECT_NE(error_of([&] { models::load_gguf_model(path, DType::F32, Device::cpu()); })
                .find("qwen3.rope.scaling.type = yarn is not supported (kiln implements no RoPE "
                      "scaling)"),
            std::string::npos);
  md = metadata(c, "qwen3");
  md["qwen3.expert_count"] = {GgufType::Uint32, GgufType::Uint8, 8};
  path = write(m, md);
  EXPECT_NE(error_of([&] { models::load_gguf_model(path, DType::F32, Device::cpu()); })
                .find("qwen3.expert_count = 8 is not supported (kiln implements no mixture of "
                      "experts)"),
            std::string::npos);
  md = metadata(c, "qwen3");
  md["qwen3.rope.dimension_count"] = {GgufType::Uint32, GgufType::Uint8, 8};
  path = write(m, md);
  EXPECT_NE(error_of([&] { models::load_gguf_model(path, DType::F32, Device::cpu()); })
                .find("qwen3.rope.dimension_count = 8 is not supported (kiln rotates the whole "
                      "head of 16)"),
            std::string::npos);
  md = metadata(c, "mamba");
  md["general.architecture"] = {GgufType::String, GgufType::Uint8, "mamba"};
  path = write(m, md);
  EXPECT_NE(error_of([&] {
              models::load_gguf_model(path, DType::F32, Device::cpu());
            }).find("general.architecture mamba is not supported"),
            std::string::npos);
  path = write(m, metadata(c, "qwen3"), {}, "model.layers.1.self_attn.k_norm.weight");
  EXPECT_NE(error_of([&] {
              models::load_gguf_model(path, DType::F32, Device::cpu());
            }).find("missing: model.layers.1.self_attn.k_norm.weight"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
