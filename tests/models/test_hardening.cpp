// Issue 13's classes at the library level: config fields refused by name (1), the non-finite
// guards (2), size limits and typed out-of-memory errors before anything is built (5), JSON reads
// that name the file and field and refuse deep nesting (6), and the trainer's protections of
// earlier work (7). The command-line side is in tests/apps/test_hardening_cli.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/config.h"
#include "models/generation_config.h"
#include "models/io/tokenizer_config.h"
#include "models/param_count.h"
#include "models/sampling.h"
#include "models/trainer.h"
#include "tests/error_of.h"
#include "tests/models/tiny_hf.h"
#include "tests/temp_dir.h"
#include "tests/test_data.h"

namespace fs = std::filesystem;
using namespace kiln;
using nlohmann::json;

namespace {

using kiln::test::error_of;

json qwen3_json() { return test_hf::hf_config_json(test_hf::tiny_qwen3(true)); }

fs::path hardening_dir(const std::string& name) {
  return kiln::test::fresh_temp_dir("kiln_hardening_" + name);
}

}  // namespace

// ---- class 1: a different model, computed silently ----------------------------------------

TEST(Hardening, RopeScalingRefusedByNameWithItsValue) {
  json j = qwen3_json();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  std::string e = error_of([&] { models::from_hf_config(j, "/m/config.json"); });
  EXPECT_NE(e.find("[config] /m/config.json: rope_scaling"), std::string::npos) << e;
  EXPECT_NE(e.find("\"yarn\""), std::string::npos) << e;
  EXPECT_NE(e.find("4.0"), std::string::npos) << e;
  j["rope_scaling"] = "garbage";
  e = error_of([&] { models::from_hf_config(j, "/m/config.json"); });
  EXPECT_NE(e.find("rope_scaling \"garbage\" is not supported"), std::string::npos) << e;
  j["rope_scaling"] = nullptr;  // null: plain RoPE, accepted
  EXPECT_NO_THROW(models::from_hf_config(j, "/m/config.json"));
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  e = error_of([&] { models::from_hf_config(j, "/m/config.json"); });
  EXPECT_NE(e.find("rope_parameters"), std::string::npos) << e;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_EQ(models::from_hf_config(j, "c").rope_theta, 5e5);
}

TEST(Hardening, SlidingWindowsRefused) {
  json j = qwen3_json();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  std::string e = error_of([&] { models::from_hf_config(j, "c.json"); });
  EXPECT_NE(e.find("[config] c.json: use_sliding_window true is not supported"), std::string::npos)
      << e;
  EXPECT_NE(e.find("sliding_window 4096"), std::string::npos) << e;
  // Unused (qwen): use_sliding_window false makes sliding_window and max_window_layers inert.
  j["use_sliding_window"] = false;
  j["max_window_layers"] = 28;
  EXPECT_NO_THROW(models::from_hf_config(j, "c.json"));
  // Mistral uses sliding_window whenever it is set: shorter than the context is refused.
  j = qwen3_json();
  j["model_type"] = "mistral";
  j["sliding_window"] = 16;
  e = error_of([&] { models::from_hf_config(j, "c.json"); });
  EXPECT_NE(e.find("sliding_window 16 is not supported"), std::string::npos) << e;
  j["sliding_window"] = 64;  // = max_position_embeddings: no effect
  EXPECT_NO_THROW(models::from_hf_config(j, "c.json"));
}

TEST(Hardening, UnknownAndModelChangingFieldsRefusedByName) {
  json j = qwen3_json();
  j["partial_rotary_factor"] = 0.5;
  std::string e = error_of([&] { models::from_hf_config(j, "/x/config.json"); });
  EXPECT_NE(e.find("[config] /x/config.json: field 'partial_rotary_factor' = 0.5"),
            std::string::npos)
      << e;
  j = qwen3_json();
  j["hidden_act"] = "relu";
  e = error_of([&] { models::from_hf_config(j, "c"); });
  EXPECT_NE(e.find("hidden_act \"relu\" is not supported"), std::string::npos) << e;
  j = qwen3_json();
  j["mlp_bias"] = true;
  EXPECT_NE(error_of([&] { models::from_hf_config(j, "c"); }).find("mlp_bias true"),
            std::string::npos);
  j = qwen3_json();
  j["attention_bias"] = true;  // qwen3 biases o_proj too
  EXPECT_NE(error_of([&] { models::from_hf_config(j, "c"); }).find("attention_bias true"),
            std::string::npos);
  j["model_type"] = "qwen2";  // qwen2: q/k/v biases, which kiln implements
  EXPECT_TRUE(models::from_hf_config(j, "c").qkv_bias);
  j = qwen3_json();
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_NE(error_of([&] { models::from_hf_config(j, "c"); }).find("\"sliding_attention\""),
            std::string::npos);
}

TEST(Hardening, EveryRealConfigIsUnderstood) {
  // The published configs in the shared data (Qwen3-0.6B, Qwen3-8B) and kiln's own fixtures.
  // Where every test reads the shared data (tests/test_data.h); the two Qwen3 configs must be
  // there: a run that read none would check nothing.
  const fs::path data = test_shared_data();
  int n = 0;
  std::error_code ec;
  ASSERT_TRUE(fs::exists(data)) << data << " is missing: run scripts/get_data.sh";
  for (auto& f : fs::recursive_directory_iterator(data, ec))
    if (f.path().filename() == "config.json") {
      EXPECT_NO_THROW(models::load_hf_config(f.path().string())) << f.path();
      ++n;
    }
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_GE(n, 2) << "expected Qwen3-0.6B's and Qwen3-8B's config.json under " << data;
  EXPECT_NO_THROW(models::from_hf_config(qwen3_json(), "tiny_hf"));
  std::cout << n << " shared config.json files read\n";
}

TEST(Hardening, FieldListIsDocumented) {
  std::string help = models::hf_config_fields_help();
  for (const char* f : {"rope_scaling", "use_sliding_window", "torch_dtype", "hidden_act",
                        "max_window_layers", "attention_dropout"})
    EXPECT_NE(help.find(f), std::string::npos) << f;
}

// ---- class 2: non-finite numbers --------------------------------------------------------

TEST(Hardening, GreedyRefusesNonFiniteLogits) {
  std::vector<float> nan(8, std::numeric_limits<float>::quiet_NaN());
  models::SamplingOptions greedy;
  greedy.temperature = 0;
  std::string e = error_of([&] { models::sample_token(nan, greedy, 0); });
  EXPECT_NE(e.find("[sample] greedy decoding: the logits are not finite"), std::string::npos) << e;
  std::vector<float> one_nan{1, 2, std::numeric_limits<float>::quiet_NaN(), 0};
  EXPECT_NE(error_of([&] { models::sample_token(one_nan, greedy, 0); }).find("NaN"),
            std::string::npos);
  std::vector<float> masked{-INFINITY, 3, -INFINITY};  // masking with -inf stays fine
  EXPECT_EQ(models::sample_token(masked, greedy, 0), 1);
}

// A trainer whose weights are NaN skips every step and stops after max_nonfinite_steps, without
// writing a checkpoint.
TEST(Hardening, TrainerSkipsNonFiniteStepsThenStopsBeforeCheckpointing) {
  fs::path d = hardening_dir("nonfinite");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(d / "t.txt") << text;
  models::TrainOptions o;
  o.data_path = (d / "t.txt").string();
  o.out_dir = (d / "run").string();
  o.batch = 2, o.seq = 16, o.steps = 20, o.eval_interval = 0, o.eval_batches = 1;
  o.max_nonfinite_steps = 3;
  o.progress = 0;
  std::ostringstream log;
  models::Trainer t(o, Device::cpu(), DType::F32, log);
  Tensor w = t.model().parameters()[0].detach();
  w.copy_(ops::full(w.shape(), std::numeric_limits<double>::quiet_NaN()));
  std::string e = error_of([&] { t.run(); });
  EXPECT_NE(e.find("[train] 3 steps in a row"), std::string::npos) << e;
  EXPECT_NE(e.find("--max-nonfinite-steps"), std::string::npos) << e;
  EXPECT_NE(log.str().find("not finite: step skipped, no update"), std::string::npos) << log.str();
  EXPECT_FALSE(fs::exists(d / "run" / "ckpt.h5"));
  EXPECT_FALSE(fs::exists(d / "run" / "final.h5"));
}

TEST(Hardening, TrainerRefusesOutOfRangeOptionsFromTheLibrary) {
  models::TrainOptions o;
  o.data_path = "/nonexistent";
  o.out_dir = hardening_dir("opts").string();
  o.log_interval = 0;
  std::ostringstream log;
  std::string e = error_of([&] { models::Trainer(o, Device::cpu(), DType::F32, log); });
  EXPECT_NE(e.find("--log-interval 0"), std::string::npos) << e;
  o.log_interval = 10;
  o.beta2 = std::nan("");
  e = error_of([&] { models::Trainer(o, Device::cpu(), DType::F32, log); });
  EXPECT_NE(e.find("--beta2 nan"), std::string::npos) << e;
  o.beta2 = 0.99;
  o.loss_chunk_rows = -1;
  e = error_of([&] { models::Trainer(o, Device::cpu(), DType::F32, log); });
  EXPECT_NE(e.find("--loss-chunk-rows -1"), std::string::npos) << e;
}

// ---- class 5: sizes checked before anything is built -------------------------------------

TEST(Hardening, ConfigSizesHaveHardLimits) {
  json j = qwen3_json();
  j["num_hidden_layers"] = 1000000000;
  std::string e = error_of([&] { models::from_hf_config(j, "/m/config.json"); });
  EXPECT_NE(e.find("[config] /m/config.json: n_layers (num_hidden_layers) = 1000000000 is out of "
                   "range [1, 4096]"),
            std::string::npos)
      << e;
  j = qwen3_json();
  j["max_position_embeddings"] = 100000000000;
  e = error_of([&] { models::from_hf_config(j, "c.json"); });
  EXPECT_NE(e.find("max_position_embeddings) = 100000000000 is out of range"), std::string::npos)
      << e;
  j = qwen3_json();
  j["vocab_size"] = std::int64_t{1} << 41;  // positive, too large
  e = error_of([&] { models::from_hf_config(j, "c.json"); });
  EXPECT_NE(e.find("vocab_size = 2199023255552 is out of range"), std::string::npos) << e;
  // The meta dry runs (kiln params --layers) meet the same limit.
  models::WhatIf w;
  w.layers = 1000000000;
  e = error_of([&] { models::apply_what_if(models::preset("stories260K"), w); });
  EXPECT_NE(e.find("1000000000"), std::string::npos) << e;
}

TEST(Hardening, ConfigCheckedAgainstWeightsBeforeBuilding) {
  fs::path d = hardening_dir("layers");
  models::DecoderModel m(test_hf::tiny_qwen3(true), 1);
  test_hf::write_hf_folder(m, d);
  json j = test_hf::hf_config_json(m.cfg);
  j["num_hidden_layers"] = 4000;  // within the limits, far more than the 2-layer files hold
  test_hf::write_json(d / "config.json", j);
  const std::int64_t before = MemoryTracker::get(DeviceType::CPU).stats().total;
  models::ModelSource src;
  src.model = d.string();
  std::string e = error_of([&] { models::load_model(src); });
  EXPECT_NE(e.find("does not match the model"), std::string::npos) << e;
  EXPECT_NE(e.find("missing: model.layers.2."), std::string::npos) << e;
  EXPECT_NE(e.find("more"), std::string::npos) << e;  // the list is cut short
  EXPECT_LT(e.size(), 4000u);
  EXPECT_EQ(MemoryTracker::get(DeviceType::CPU).stats().total_peak >= before, true);
  EXPECT_EQ(MemoryTracker::get(DeviceType::CPU).stats().total, before);
}

TEST(Hardening, LargerThanMemoryIsATypedErrorNamingTheField) {
  models::ModelConfig c = test_hf::tiny_qwen3(true);
  c.vocab_size = models::kMaxVocab;  // 16.7M x 131072 x 4 bytes: 8 TiB
  c.dim = models::kMaxDim;
  c.head_dim = 128;
  bool typed = false;
  std::string e;
  try {
    models::DecoderModel m(c, 0);
  } catch (const OutOfMemory& x) {
    typed = true;
    e = x.what();
  }
  ASSERT_TRUE(typed);
  EXPECT_NE(e.find("[allocator] cpu: out of memory"), std::string::npos) << e;
  EXPECT_NE(e.find("for weights"), std::string::npos) << e;
  EXPECT_NE(e.find("allocated so far"), std::string::npos) << e;
  EXPECT_NE(e.find("vocab_size 16777216 x hidden_size 131072"), std::string::npos) << e;
}

// ---- class 6: JSON reads name the file and the field -------------------------------------

TEST(Hardening, WronglyTypedFieldsNameFileFieldAndValue) {
  json j = qwen3_json();
  j["hidden_size"] = "64";
  std::string e = error_of([&] { models::from_hf_config(j, "/m/config.json"); });
  EXPECT_EQ(e, "[config] /m/config.json: hidden_size must be an integer, got \"64\"");
  EXPECT_EQ(e.find("json.exception"), std::string::npos);
  j = qwen3_json();
  j["rms_norm_eps"] = "tiny";
  e = error_of([&] { models::from_hf_config(j, "c"); });
  EXPECT_NE(e.find("rms_norm_eps must be a number, got \"tiny\""), std::string::npos) << e;
  j = qwen3_json();
  j["tie_word_embeddings"] = 1;
  e = error_of([&] { models::from_hf_config(j, "c"); });
  EXPECT_NE(e.find("tie_word_embeddings must be true or false, got 1"), std::string::npos) << e;
  j = qwen3_json();
  j["num_hidden_layers"] = 18446744073709551615ull;  // beyond int64
  e = error_of([&] { models::from_hf_config(j, "c"); });
  EXPECT_NE(e.find("num_hidden_layers must be an integer, got 18446744073709551615"),
            std::string::npos)
      << e;
  // kiln's own config JSON (checkpoints, kiln params --model file.json) too.
  json k = models::preset("stories260K").to_json();
  k["n_layers"] = "five";
  e = error_of([&] { models::ModelConfig::from_json(k, "ckpt.h5"); });
  EXPECT_EQ(e, "[config] ckpt.h5: n_layers must be an integer, got \"five\"");
}

TEST(Hardening, DeepNestingInAnUnusedConfigKeyIsRefusedNotACrash) {
  // A million nested arrays under a key nothing reads: nlohmann's copy constructor and dump()
  // recurse once per level, so this ended `kiln generate` with SIGSEGV before parsing was bounded.
  const fs::path d = hardening_dir("deep_json");
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  std::string text = qwen3_json().dump();
  text.insert(1, "\"unused\": " + deep + ", ");
  std::ofstream(d / "config.json") << text;
  const std::string path = (d / "config.json").string();
  const std::string want =
      "[json] config file " + path + ": nested deeper than 64 levels of arrays and objects";
  EXPECT_EQ(error_of([&] { models::load_hf_config(path); }), want);
  models::ModelSource src;  // what `kiln generate --random-weights --config` loads
  src.random_weights = true;
  src.config = path;
  EXPECT_EQ(error_of([&] { models::load_model(src); }), want);
  EXPECT_EQ(error_of([&] { models::resolve_model_config(path); }), want);  // kiln params, budget
  std::ofstream(d / "generation_config.json") << "{\"x\": " + deep + "}";
  const std::string gen = (d / "generation_config.json").string();
  EXPECT_EQ(error_of([&] { models::load_generation_config(gen); }),
            "[json] generation_config file " + gen +
                ": nested deeper than 64 levels of arrays and objects");
  // Not JSON: the file and nlohmann's reason with the byte, not its bare exception text.
  std::ofstream(d / "config.json") << "{\"model_type\": ";
  const std::string e = error_of([&] { models::load_hf_config(path); });
  EXPECT_TRUE(e.starts_with("[json] config file " + path + ": invalid JSON at byte 16: ")) << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
}

TEST(Hardening, WronglyTypedTokenizerConfigNamesFileAndField) {
  const fs::path d = hardening_dir("tokenizer_config");
  const std::string path = (d / "tokenizer_config.json").string();
  auto refusal = [&](const json& j) {
    std::ofstream(path) << j.dump();
    return error_of([&] { io::read_tokenizer_config(path); });
  };
  const std::string at = "[tokenizer] tokenizer_config.json at " + path + ": ";
  EXPECT_EQ(refusal({{"eos_token", 151645}}),
            at + "field \"eos_token\" must be a string or an object with \"content\", got "
                 "number 151645");
  EXPECT_EQ(refusal({{"add_bos_token", "yes"}}),
            at + "field \"add_bos_token\" must be true or false, got string \"yes\"");
  EXPECT_EQ(refusal({{"bos_token", json::array({"<s>"})}}),
            at + "field \"bos_token\" must be a string or an object with \"content\", got "
                 "array [\"<s>\"]");
  EXPECT_EQ(refusal({{"added_tokens_decoder", {{"7", {{"content", "<x>"}, {"special", 1}}}}}}),
            at + "field \"added_tokens_decoder.7.special\" must be true or false, got number 1");
  // Qwen3's layout (fields kiln does not know pass unchecked), and both HF spellings of a token,
  // with null for "none".
  const json entry = {{"content", "<|im_end|>"}, {"lstrip", false},      {"normalized", false},
                      {"rstrip", false},         {"single_word", false}, {"special", true}};
  std::ofstream(path) << json({{"add_bos_token", false},
                               {"add_prefix_space", false},
                               {"added_tokens_decoder", {{"151645", entry}}},
                               {"additional_special_tokens", {"<|im_start|>", "<|im_end|>"}},
                               {"bos_token", nullptr},
                               {"chat_template", "{%- for message in messages %}{%- endfor %}"},
                               {"eos_token", "<|im_end|>"},
                               {"model_max_length", 131072},
                               {"pad_token", {{"content", "<|endoftext|>"}, {"lstrip", false}}},
                               {"tokenizer_class", "Qwen2Tokenizer"},
                               {"unk_token", nullptr}})
                             .dump();
  io::TokenizerConfig c;
  ASSERT_NO_THROW(c = io::read_tokenizer_config(path));
  EXPECT_EQ(c.eos_token, "<|im_end|>");
  EXPECT_FALSE(c.bos_token.has_value());
  EXPECT_EQ(c.pad_token, "<|endoftext|>");
  EXPECT_EQ(c.add_bos_token, false);
  EXPECT_FALSE(c.add_eos_token.has_value());
  ASSERT_EQ(c.added.size(), 1u);
  EXPECT_EQ(c.added[0].id, 151645);
  EXPECT_EQ(c.added[0].content, "<|im_end|>");
  EXPECT_TRUE(c.added[0].special);
}

TEST(Hardening, WronglyTypedTokenizerConfigRefusedWhenAModelLoads) {
  // The path `kiln generate` takes: the tokenizer beside --config, with a broken config.
  const std::string qwen = test_shared_data() + "/qwen";
  if (!fs::exists(qwen + "/vocab.json")) GTEST_SKIP() << "no " << qwen << "/vocab.json";
  const fs::path d = hardening_dir("tokenizer_config_load");
  test_hf::write_json(d / "config.json", qwen3_json());
  fs::create_symlink(qwen + "/vocab.json", d / "vocab.json");
  fs::create_symlink(qwen + "/merges.txt", d / "merges.txt");
  const std::string path = (d / "tokenizer_config.json").string();
  models::ModelSource src;
  src.random_weights = true;
  src.config = (d / "config.json").string();
  std::ofstream(path) << json({{"eos_token", 151645}}).dump();
  EXPECT_EQ(error_of([&] { models::load_model(src); }),
            "[tokenizer] tokenizer_config.json at " + path +
                ": field \"eos_token\" must be a string or an object with \"content\", got "
                "number 151645");
  std::ofstream(path) << json({{"eos_token", "<|im_end|>"}, {"add_bos_token", "yes"}}).dump();
  EXPECT_EQ(error_of([&] { models::load_model(src); }),
            "[tokenizer] tokenizer_config.json at " + path +
                ": field \"add_bos_token\" must be true or false, got string \"yes\"");
}

TEST(Hardening, MaxNewTokensAtInt64MaxStopsAtTheContext) {
  models::DecoderModel m(test_hf::tiny_qwen3(true, 16), 1);
  m.eval();
  models::SamplingOptions greedy;
  greedy.temperature = 0;
  auto out = models::generate_tokens(m, {1, 2, 3}, std::numeric_limits<std::int64_t>::max(), greedy,
                                     [](std::int32_t) { return true; });
  EXPECT_EQ(out.size(), 13u);  // 16 - 3: the context is full
}
