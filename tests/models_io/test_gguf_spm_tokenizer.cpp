// The SentencePiece tokenizer in GGUF metadata (tokenizer.ggml.model "llama", as llama.cpp's
// converter writes LLaMA's): llama2.c's tokenizer.bin written as tokenizer.ggml.* keys and read
// back gives the same pieces, scores, ids and text; the keys have llama.cpp's spelling ("▁" for a
// space, <s>/</s> control, <0xXX> byte tokens); ids kiln's encoder cannot take are refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "models/io/gguf.h"
#include "models/io/gguf_tokenizer.h"
#include "models/io/tokenizer.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"
#include "tests/test_data.h"

namespace fs = std::filesystem;
using namespace kiln::io;
using kiln::test::expect_error;
using nlohmann::json;

namespace {

const std::string kTokBin = test_shared_data() + "/llama2c/tokenizer.bin";

// The test's files live in <tmp>/kiln_spm_<pid>_<test>/, removed when the binary exits.
std::string temp_path(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_spm_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(dir);
  kiln::test::remove_at_exit(dir);
  return (dir / name).string();
}

// Lines of the bundled TinyStories text, and strings that exercise the byte fallback, the dummy
// prefix, control-token spellings and an empty text.
std::vector<std::string> texts() {
  std::vector<std::string> out = {"",
                                  "Hello world",
                                  " leading space",
                                  "tabs\tand\nnewlines",
                                  "<s> is not a control token in text </s>",
                                  "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82",
                                  "\xe2\x96\x81 a literal U+2581"};
  std::ifstream f(test_shared_data() + "/text/tinystories_valid_head.txt");
  std::string line;
  for (int i = 0; i < 200 && std::getline(f, line); ++i) out.push_back(line);
  EXPECT_GT(out.size(), 100u) << "the bundled text is missing";
  return out;
}

TEST(GgufSpmTokenizer, Llama2cTokenizerRoundTripsThroughGgufMetadata) {
  const Llama2cTokenizer ref(kTokBin);
  GgufMetadata md;
  md["general.architecture"] = {GgufType::String, GgufType::Uint8, "llama"};
  add_gguf_tokenizer_metadata(ref, ref.vocab_size(), md);
  // llama.cpp's spelling of the keys.
  const json& tokens = md.at("tokenizer.ggml.tokens").value;
  const json& types = md.at("tokenizer.ggml.token_type").value;
  ASSERT_EQ(tokens.size(), static_cast<std::size_t>(ref.vocab_size()));
  EXPECT_EQ(md.at("tokenizer.ggml.model").value, "llama");
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(types[2], 3);
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(types[3], 6);
  EXPECT_EQ(tokens[258], "<0xFF>");
  const std::int32_t the = ref.lookup(" the");
  ASSERT_GE(the, 259);
  EXPECT_EQ(tokens[static_cast<std::size_t>(the)], "\xe2\x96\x81the");
  EXPECT_EQ(types[static_cast<std::size_t>(the)], 1);
  EXPECT_EQ(md.at("tokenizer.ggml.scores").value.size(), tokens.size());

  const std::string path = temp_path("spm.gguf");
  GgufWriter().write(path, md);
  const GgufFile f(path);
  auto any = gguf_tokenizer(f);
  auto* t = dynamic_cast<Llama2cTokenizer*>(any.get());
  ASSERT_NE(t, nullptr) << "a llama model reads into the SentencePiece tokenizer";
  ASSERT_EQ(t->vocab_size(), ref.vocab_size());
  for (std::int32_t id = 0; id < ref.vocab_size(); ++id) {
    ASSERT_EQ(t->piece(id), ref.piece(id)) << id;
    ASSERT_EQ(t->score(id), ref.score(id)) << id;
  }
  EXPECT_EQ(t->max_token_length(), ref.max_token_length());
  for (const std::string& s : texts()) {
    const std::vector<std::int32_t> ids = ref.encode(s, true, false);
    EXPECT_EQ(t->encode(s, true, false), ids) << s;
    EXPECT_EQ(t->decode(ids), ref.decode(ids)) << s;
  }
}

TEST(GgufSpmTokenizer, RefusesWhatKilnsEncoderCannotTake) {
  const Llama2cTokenizer ref(kTokBin);
  GgufMetadata md;
  add_gguf_tokenizer_metadata(ref, ref.vocab_size(), md);
  const std::string path = temp_path("bad.gguf");
  auto check = [&](const GgufMetadata& m, const std::string& what) {
    GgufWriter().write(path, m);
    expect_error([&] { gguf_tokenizer(GgufFile(path)); }, what);
  };
  GgufMetadata m = md;
  m["tokenizer.ggml.bos_token_id"] = {GgufType::Uint32, GgufType::Uint8, 5};
  check(m, "tokenizer.ggml.bos_token_id is 5; kiln's SentencePiece tokenizer takes 1");
  m = md;
  m["tokenizer.ggml.scores"].value.erase(0);
  check(m, "31999 scores and 32000 token types for 32000 tokens");
  m = md;
  m["tokenizer.ggml.scores"] = {GgufType::Array, GgufType::Float64, json::array({1.0})};
  check(m, "tokenizer.ggml.scores is array (of f64), expected an array of f32");
  m = md;
  m["tokenizer.ggml.token_type"].value[300] = 9;
  check(m, "has type 9; kiln reads 1 to 6");
  m = md;
  m["tokenizer.ggml.tokens"].value[3] = "x";  // not the byte piece <0x00>
  check(m, "expected the byte piece <0x00>");
  // Writing needs the model's vocab to be the tokenizer's.
  GgufMetadata w;
  expect_error([&] { add_gguf_tokenizer_metadata(ref, 32001, w); },
               "the SentencePiece tokenizer has 32000 ids, the model's vocab_size is 32001");
}

}  // namespace
