// Inputs that fuzz/ (scripts/fuzz.sh) found crashing a models/ loader, each fed to the loader's
// public entry point: it must now refuse them with a kiln::Error that names the file and field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "models/config.h"
#include "tests/error_of.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

class FuzzRegression : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_fuzz_regression_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }

  fs::path dir_;
};

using kiln::test::error_of;

}  // namespace

// fuzz_hf_config: "rms_norm_eps": true escaped load_hf_config as nlohmann's raw
// "[json.exception.type_error.302] type must be number, but is boolean" (uncaught, not a
// kiln::Error). Every optional field read with a fallback is now type-checked by name.
TEST_F(FuzzRegression, HfConfigWrongTypedOptionalFieldIsRefusedByName) {
  const std::string crash = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 8,
  "hidden_act": "silu", "hidden_size": 16, "intermediate_size": 32,
  "max_position_embeddings": 64, "model_type": "qwen3", "num_attention_heads": 4,
  "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": true,
  "torch_dtype": "bfloat16", "vocab_size": 300
})";
  std::string path = write("config.json", crash);
  EXPECT_EQ(error_of([&] { models::load_hf_config(path); }),
            "[config] " + path + ": rms_norm_eps must be a number, got true");

  const std::string base = R"({"model_type": "llama", "vocab_size": 32, "hidden_size": 16,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2)";
  const std::pair<std::string, std::string> cases[] = {
      {R"("tie_word_embeddings": "yes")",
       "tie_word_embeddings must be true or false, "
       "got \"yes\""},
      {R"("attention_bias": 1)", "attention_bias must be true or false, got 1"},
      {R"("rope_parameters": {"rope_theta": "1e6"})", "rope_theta must be a number, got \"1e6\""},
      {R"("model_type": 3)", "model_type must be a string, got 3"},
  };
  for (const auto& [field, want] : cases) {
    path = write("config.json", base + ", " + field + "}");
    std::string e = error_of([&] { models::load_hf_config(path); });
    EXPECT_NE(e.find("[config] " + path + ": " + want), std::string::npos) << field << ": " << e;
  }
  path = write("config.json", R"({"model_type": "gpt2", "vocab_size": 64, "n_embd": 16,
    "n_layer": 1, "n_head": 2, "n_positions": 32, "activation_function": ["gelu"]})");
  EXPECT_EQ(error_of([&] { models::load_hf_config(path); }),
            "[config] " + path + ": activation_function must be a string, got [\"gelu\"]");

  // Valid values read as before; null means "not given", like an absent field.
  path = write("config.json", base + R"(, "rms_norm_eps": null, "tie_word_embeddings": true,
    "rope_parameters": {"rope_theta": 5e5}})");
  models::ModelConfig c = models::load_hf_config(path);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.rope_theta, 5e5);
}
