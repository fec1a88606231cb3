// Qwen byte-level BPE: the 46 llama.cpp reference cases (qwen2.inp -> qwen2.out), round trips,
// added/special tokens, streaming decode, both merge formats on a tiny tokenizer.json, the heap BPE
// against a naive rescanning BPE written here, NFC against Python's unicodedata, and bad files.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "kernels/common/error.h"
#include "models/io/gguf_tokenizer.h"
#include "models/io/qwen_tokenizer.h"
#include "models/io/unicode_nfc.h"
#include "tests/error_of.h"
#include "tests/test_data.h"

namespace fs = std::filesystem;
using namespace kiln::io;
using kiln::test::expect_error;
using nlohmann::json;

namespace {

const std::string kData = test_shared_data();
const std::string kQwenDir = kData + "/qwen";
const std::string kTestsDir = kData + "/tokenizer-tests";

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("kiln_qwentok_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Reference GPT-2 byte -> unicode map, written out independently of the tokenizer's.
std::string byte_symbol(unsigned char b) {
  int cp = b, n = 0;
  bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
  if (!printable) {
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174))) ++n;
    cp = 256 + n;
  }
  std::string s;
  unicode::utf8_append(s, static_cast<char32_t>(cp));
  return s;
}

// Naive BPE: rescan every adjacent pair, merge the lowest rank (leftmost on ties), repeat.
std::vector<std::string> naive_bpe(std::string_view word,
                                   const std::map<std::pair<std::string, std::string>, int>& rank) {
  std::vector<std::string> syms;
  for (unsigned char b : word) syms.push_back(byte_symbol(b));
  while (syms.size() > 1) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = rank.find({syms[i], syms[i + 1]});
      if (it != rank.end() && (best < 0 || it->second < best)) best = it->second, at = i;
    }
    if (best < 0) break;
    syms[at] += syms[at + 1];
    syms.erase(syms.begin() + static_cast<long>(at) + 1);
  }
  return syms;
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's convention: inputs separated by "\n__ggml_vocab_test__\n" (the file ends with one),
// one line of space-separated ids per input.
std::vector<Case> load_cases() {
  const std::string inp = slurp(kTestsDir + "/qwen2.inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Case> cases;
  for (size_t p = 0;;) {
    size_t q = inp.find(sep, p);
    if (q == std::string::npos) break;
    cases.push_back({inp.substr(p, q - p), {}});
    p = q + sep.size();
  }
  std::istringstream out(slurp(kTestsDir + "/qwen2.out"));
  std::string line;
  size_t i = 0;
  while (std::getline(out, line)) {
    EXPECT_LT(i, cases.size());
    if (i >= cases.size()) break;
    std::istringstream ls(line);
    int32_t x;
    while (ls >> x) cases[i].ids.push_back(x);
    ++i;
  }
  EXPECT_EQ(i, cases.size());
  return cases;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    int n = unicode::utf8_decode(s, i, cp);
    if (n == 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

// The real Qwen vocabulary, loaded once for the whole suite.
class QwenReal : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kQwenDir + "/vocab.json")) return;
    tok_ = QwenTokenizer::from_vocab_merges(kQwenDir + "/vocab.json", kQwenDir + "/merges.txt")
               .release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "no " << kQwenDir << "/vocab.json";
  }
  static QwenTokenizer* tok_;
};
QwenTokenizer* QwenReal::tok_ = nullptr;

}  // namespace

// ---- the real vocabulary --------------------------------------------------------------------

TEST_F(QwenReal, ReferenceCases46) {
  const std::vector<Case> cases = load_cases();
  ASSERT_EQ(cases.size(), 46u);
  int pass = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> got = tok_->encode(cases[i].text);
    EXPECT_EQ(got, cases[i].ids) << "case " << i << ": '" << cases[i].text << "'";
    pass += got == cases[i].ids;
  }
  EXPECT_EQ(pass, 46);
}

TEST_F(QwenReal, Sizes) {
  EXPECT_EQ(tok_->vocab_size(), 151669);
  EXPECT_EQ(tok_->num_merges(), 151387u);
  EXPECT_EQ(tok_->added_tokens().size(), 26u);
  EXPECT_EQ(tok_->bos_id(), -1);
  EXPECT_EQ(tok_->eos_id(), 151643);
}

TEST_F(QwenReal, RoundTripOnReferenceCases) {
  for (const Case& c : load_cases()) {
    EXPECT_EQ(tok_->decode(tok_->encode(c.text)), c.text);
    EXPECT_EQ(tok_->decode(c.ids), c.text);
  }
  // Invalid UTF-8 survives byte for byte.
  const std::string bad = "ok \xff\xfe tail \xe2\x82 end \xc3";
  EXPECT_EQ(tok_->decode(tok_->encode(bad)), bad);
  // Random byte strings (valid and broken UTF-8, special-token fragments): exact round trip, and
  // the stream decoder's pieces add up to the same bytes.
  const std::string alphabet[] = {
      "a",    " ",         "\n",           "\t",       "7",    "'s",       "<|im_end|>",
      "<|",   "\xc3",      "\xa9",         "\xe2\x82", "\xac", "\xf0\x9f", "\xa6\x99",
      "\xff", "e\xcc\x81", "\xe5\x9c\xa8", "  ",       "!?"};
  std::mt19937 rng(3);
  for (int k = 0; k < 300; ++k) {
    std::string s;
    for (size_t n = rng() % 16; n > 0; --n) s += alphabet[rng() % std::size(alphabet)];
    const std::vector<int32_t> ids = tok_->encode(s);
    // NFC may rewrite a valid e + U+0301 pair, so compare with the normalised text.
    EXPECT_EQ(tok_->decode(ids), unicode::nfc(s));
    QwenTokenizer::StreamDecoder sd(*tok_);
    std::string streamed;
    for (int32_t id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    EXPECT_EQ(streamed, tok_->decode(ids));
  }
}

TEST_F(QwenReal, SpecialAndAddedTokens) {
  const int32_t im_start = 151644, im_end = 151645, think = 151667, end_think = 151668;
  EXPECT_EQ(tok_->token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok_->token_to_id("<|im_start|>"), im_start);
  EXPECT_EQ(tok_->token_to_id("<think>"), think);
  EXPECT_TRUE(tok_->is_special(im_start));
  EXPECT_TRUE(tok_->is_special(151643));
  EXPECT_FALSE(tok_->is_special(think));
  EXPECT_FALSE(tok_->is_special(end_think));
  EXPECT_FALSE(tok_->is_special(9707));

  // Added tokens are cut out first; the text around them is encoded on its own.
  const std::vector<int32_t> user = tok_->encode("user\nHello world");
  std::vector<int32_t> want = {im_start};
  want.insert(want.end(), user.begin(), user.end());
  want.push_back(im_end);
  const std::vector<int32_t> nl = tok_->encode("\n");
  want.insert(want.end(), nl.begin(), nl.end());
  want.push_back(think);
  want.push_back(end_think);
  const std::string chat = "<|im_start|>user\nHello world<|im_end|>\n<think></think>";
  EXPECT_EQ(tok_->encode(chat), want);
  EXPECT_EQ(tok_->decode(tok_->encode(chat)), chat);
  EXPECT_EQ(tok_->decode(-1, think), "<think>");
  // A broken special token is ordinary text.
  EXPECT_EQ(tok_->decode(tok_->encode("<|im_start|")), "<|im_start|");
  for (int32_t id : tok_->encode("<|im_start|")) EXPECT_LT(id, 151643);
  // eos=true appends <|endoftext|>, and decode() drops it.
  std::vector<int32_t> with_eos = tok_->encode("Hello", false, true);
  ASSERT_EQ(with_eos.size(), 2u);
  EXPECT_EQ(with_eos.back(), 151643);
  EXPECT_EQ(tok_->decode(with_eos), "Hello");
  // Out of range ids.
  expect_error([&] { tok_->decode(-1, 151669); }, "out of range");
  expect_error([&] { tok_->decode(-1, -3); }, "out of range");
}

TEST_F(QwenReal, StreamingNeverSplitsACharacter) {
  // "🦙" is one character in three tokens (bytes F0 9F | A6 | 99 in the reference case).
  const std::vector<int32_t> llama = tok_->encode(" 🦙");
  ASSERT_GE(llama.size(), 2u);
  QwenTokenizer::StreamDecoder sd(*tok_);
  std::string shown;
  for (size_t i = 0; i + 1 < llama.size(); ++i) {
    std::string piece = sd.push(llama[i]);
    EXPECT_TRUE(valid_utf8(piece));
    shown += piece;
  }
  EXPECT_EQ(shown, " ");  // the space is out, the emoji's first bytes are held back
  EXPECT_GT(sd.pending(), 0u);
  EXPECT_EQ(sd.push(llama.back()), "🦙");
  EXPECT_EQ(sd.flush(), "");

  // Every reference case: each piece is valid UTF-8, and together they are the text.
  for (const Case& c : load_cases()) {
    QwenTokenizer::StreamDecoder s(*tok_);
    std::string all;
    for (int32_t id : c.ids) {
      std::string piece = s.push(id);
      EXPECT_TRUE(valid_utf8(piece)) << c.text;
      all += piece;
    }
    all += s.flush();
    EXPECT_EQ(all, c.text);
  }

  // An unfinished character at the end comes out of flush() as it is.
  QwenTokenizer::StreamDecoder s(*tok_);
  const int32_t lead = tok_->token_to_id(byte_symbol(0xE2));  // a 3-byte lead alone
  ASSERT_GE(lead, 0);
  EXPECT_EQ(s.push(lead), "");
  EXPECT_EQ(s.pending(), 1u);
  EXPECT_EQ(s.push(tok_->token_to_id("a")),
            "\xe2"
            "a");  // invalid: passed through, not held
  EXPECT_EQ(s.push(lead), "");
  EXPECT_EQ(s.flush(), "\xe2");
}

TEST_F(QwenReal, HeapBpeMatchesNaiveBpe) {
  // Reference ranks straight from merges.txt, and the vocabulary from vocab.json.
  std::map<std::pair<std::string, std::string>, int> rank;
  std::istringstream m(slurp(kQwenDir + "/merges.txt"));
  std::string line;
  int r = 0;
  while (std::getline(m, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ');
    rank.emplace(std::pair{line.substr(0, sp), line.substr(sp + 1)}, r++);
  }
  const json vocab = json::parse(slurp(kQwenDir + "/vocab.json"));
  const std::string text = slurp(kData + "/text/tinyshakespeare.txt").substr(0, 200000) +
                           slurp(kTestsDir + "/qwen2.inp");
  std::mt19937 rng(7);
  for (int k = 0; k < 300; ++k) {
    size_t len = 1 + rng() % 24, at = rng() % (text.size() - len);
    std::string w = text.substr(at, len);
    if (k % 10 == 0) w = std::string(len, 'a' + static_cast<char>(rng() % 3));  // runs: ties
    std::vector<int32_t> want;
    for (const std::string& s : naive_bpe(w, rank)) want.push_back(vocab.at(s).get<int32_t>());
    EXPECT_EQ(tok_->bpe(w), want) << "'" << w << "'";
  }
}

TEST_F(QwenReal, FullSizeTokenizerJsonGivesTheSameIds) {
  // The HF tokenizer.json layout at full size (merges as pairs, as newer files write them), with
  // the added tokens and eos_token of a tokenizer_config.json next to it.
  json tj = {{"version", "1.0"},
             {"normalizer", {{"type", "NFC"}}},
             {"model", {{"type", "BPE"}, {"ignore_merges", false}}}};
  tj["model"]["vocab"] = json::parse(slurp(kQwenDir + "/vocab.json"));
  json merges = json::array();
  std::istringstream m(slurp(kQwenDir + "/merges.txt"));
  std::string line;
  while (std::getline(m, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ');
    merges.push_back(json::array({line.substr(0, sp), line.substr(sp + 1)}));
  }
  tj["model"]["merges"] = std::move(merges);
  tj["added_tokens"] = json::array();
  for (const AddedToken& a : tok_->added_tokens())
    tj["added_tokens"].push_back({{"id", a.id}, {"content", a.content}, {"special", a.special}});
  TempDir dir;
  spit(dir.path() / "tokenizer.json", tj.dump());
  spit(dir.path() / "tokenizer_config.json", json({{"eos_token", "<|im_end|>"}}).dump());
  auto t = QwenTokenizer::from_dir(dir.path().string());
  EXPECT_EQ(t->vocab_size(), tok_->vocab_size());
  EXPECT_EQ(t->num_merges(), tok_->num_merges());
  EXPECT_EQ(t->eos_id(), 151645);
  for (const Case& c : load_cases()) EXPECT_EQ(t->encode(c.text), c.ids) << c.text;
  const std::string chat = "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>";
  EXPECT_EQ(t->encode(chat), tok_->encode(chat));
}

// The tokenizer stored in GGUF metadata (tokenizer.ggml.*, as llama.cpp's converter writes it)
// and read back: every reference case, the added tokens and EOS, and the padding ids of a
// vocab_size larger than the tokenizer's.
TEST_F(QwenReal, GgufMetadataRoundTripGivesTheSameIds) {
  GgufMetadata md;
  md["general.architecture"] = {GgufType::String, GgufType::Uint8, "qwen3"};
  add_gguf_tokenizer_metadata(*tok_, 151936, md);
  EXPECT_EQ(md.at("tokenizer.ggml.tokens").value.size(), 151936u);
  EXPECT_EQ(md.at("tokenizer.ggml.tokens").value[151700], "[PAD151700]");
  EXPECT_EQ(md.at("tokenizer.ggml.token_type").value[151645], 3);  // <|im_end|>: control
  EXPECT_EQ(md.at("tokenizer.ggml.token_type").value[151667], 4);  // <think>: user-defined
  EXPECT_EQ(md.at("tokenizer.ggml.token_type").value[100], 1);
  EXPECT_EQ(md.at("tokenizer.ggml.merges").value.size(), tok_->num_merges());
  TempDir dir;
  const std::string path = (dir.path() / "tok.gguf").string();
  GgufWriter().write(path, md);
  auto t = gguf_bpe_tokenizer(GgufFile(path));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), tok_->vocab_size());
  EXPECT_EQ(t->num_merges(), tok_->num_merges());
  EXPECT_EQ(t->eos_id(), tok_->eos_id());
  EXPECT_TRUE(t->is_special(151645));
  EXPECT_FALSE(t->is_special(151667));
  for (const Case& c : load_cases()) EXPECT_EQ(t->encode(c.text), c.ids) << c.text;
  const std::string chat = "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>";
  EXPECT_EQ(t->encode(chat), tok_->encode(chat));
}

// What llama.cpp's convert_hf_to_gguf.py writes for a Qwen3 folder without tokenizer.json
// (vocab.json and merges.txt only): <|endoftext|> is the one control token, every id from 151644
// on is "[PAD<id>]" (unused), and EOS is config.json's 151645, one of those. The unused ids up to
// EOS are ids without text, so EOS can be sampled and stops a generation, as in llama.cpp.
TEST_F(QwenReal, GgufFromLlamaCppsConverterWithAnUnusedEos) {
  GgufMetadata md;
  md["general.architecture"] = {GgufType::String, GgufType::Uint8, "qwen3"};
  add_gguf_tokenizer_metadata(*tok_, 151936, md);
  auto& tokens = md.at("tokenizer.ggml.tokens").value;
  auto& types = md.at("tokenizer.ggml.token_type").value;
  for (int id = 151644; id < 151936; ++id) {
    tokens[id] = fmt::format("[PAD{}]", id);
    types[id] = 5;
  }
  md["tokenizer.ggml.eos_token_id"] = {GgufType::Uint32, GgufType::Uint8, 151645};
  TempDir dir;
  const std::string path = (dir.path() / "conv.gguf").string();
  GgufWriter().write(path, md);
  auto t = gguf_bpe_tokenizer(GgufFile(path));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 151646);  // up to EOS; the padding after it stays out of sampling
  EXPECT_EQ(t->eos_id(), 151645);
  EXPECT_EQ(t->decode(151643, 151644), "");
  EXPECT_EQ(t->decode(151643, 151645), "");
  EXPECT_TRUE(t->is_special(151643));
  EXPECT_FALSE(t->is_special(151645));
  for (const Case& c : load_cases())
    if (c.text.find("<|") == std::string::npos) EXPECT_EQ(t->encode(c.text), c.ids) << c.text;
  // kiln writes it back as it came: the unused ids as [PAD<id>].
  GgufMetadata again;
  add_gguf_tokenizer_metadata(*t, 151936, again);
  EXPECT_EQ(again.at("tokenizer.ggml.tokens").value[151645], "[PAD151645]");
  EXPECT_EQ(again.at("tokenizer.ggml.token_type").value[151645], 5);
}

// A file written by the reference writer (gguf-py's GGUFWriter: add_tokenizer_model("gpt2"),
// add_token_list, add_token_types, add_token_merges, add_eos_token_id; the fuzz seed
// fuzz/corpus/gguf/tokenizer): 256 byte tokens, "ab", "abc", <|endoftext|> (control), <think>
// (user-defined), merges "a b" and "ab c".
TEST(GgufTokenizer, ReadsAFileTheReferenceWriterMade) {
  auto t =
      gguf_bpe_tokenizer(GgufFile(std::string(KILN_SOURCE_DIR) + "/fuzz/corpus/gguf/tokenizer"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 260);
  EXPECT_EQ(t->eos_id(), 258);
  EXPECT_EQ(t->encode("abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(t->encode("<think>ab"), (std::vector<int32_t>{259, 256}));
  EXPECT_TRUE(t->is_special(258));
  EXPECT_FALSE(t->is_special(259));
}

TEST(GgufTokenizer, AbsentIsNullAndOtherModelsAreRefusedByName) {
  TempDir dir;
  const std::string path = (dir.path() / "t.gguf").string();
  auto str = [](const char* v) { return GgufValue{GgufType::String, GgufType::Uint8, v}; };
  GgufMetadata md;
  md["general.architecture"] = str("qwen3");
  GgufWriter().write(path, md);
  EXPECT_EQ(gguf_tokenizer(GgufFile(path)), nullptr);
  md["tokenizer.ggml.model"] = str("t5");
  GgufWriter().write(path, md);
  expect_error([&] { gguf_tokenizer(GgufFile(path)); },
               "tokenizer.ggml.model = t5 is not supported");
  md["tokenizer.ggml.model"] = str("gpt2");
  md["tokenizer.ggml.pre"] = str("llama-bpe");
  GgufWriter().write(path, md);
  expect_error([&] { gguf_tokenizer(GgufFile(path)); },
               "tokenizer.ggml.pre = llama-bpe is not supported");
  md["tokenizer.ggml.pre"] = str("qwen2");
  md["tokenizer.ggml.tokens"] = {GgufType::Array, GgufType::String, json::array({"a", "b"})};
  md["tokenizer.ggml.token_type"] = {GgufType::Array, GgufType::Int32, json::array({1})};
  md["tokenizer.ggml.merges"] = {GgufType::Array, GgufType::String, json::array({"a b"})};
  GgufWriter().write(path, md);
  expect_error([&] { gguf_tokenizer(GgufFile(path)); }, "1 token types for 2 tokens");
  md["tokenizer.ggml.token_type"] = {GgufType::Array, GgufType::Uint8, json::array({1, 1})};
  GgufWriter().write(path, md);
  expect_error([&] { gguf_tokenizer(GgufFile(path)); },
               "tokenizer.ggml.token_type is array (of u8), expected an array of i32");
  md["tokenizer.ggml.token_type"] = {GgufType::Array, GgufType::Int32, json::array({1, 7})};
  GgufWriter().write(path, md);
  expect_error([&] { gguf_tokenizer(GgufFile(path)); }, "token 1 (b) has type 7");
  md["tokenizer.ggml.token_type"] = {GgufType::Array, GgufType::Int32, json::array({1, 1})};
  md["tokenizer.ggml.merges"] = {GgufType::Array, GgufType::String, json::array({"ab"})};
  GgufWriter().write(path, md);
  expect_error([&] { gguf_tokenizer(GgufFile(path)); },
               "merge 0 'ab' is not two tokens separated by a space");
}

TEST_F(QwenReal, NfcBeforeSplitting) {
  // "é" written as e + U+0301 is normalised to U+00E9 first.
  EXPECT_EQ(tok_->encode("Caf\x65\xcc\x81"), tok_->encode("Caf\xc3\xa9"));
  // U+212B ANGSTROM SIGN -> U+00C5.
  EXPECT_EQ(tok_->encode("\xe2\x84\xab"), tok_->encode("\xc3\x85"));
}

// ---- NFC ------------------------------------------------------------------------------------

TEST(UnicodeNfc, HandCases) {
  using unicode::nfc;
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc("e\xcc\x81"), "\xc3\xa9");                     // e + acute -> é
  EXPECT_EQ(nfc("\xe2\x84\xab"), "\xc3\x85");                  // Angstrom sign -> Å
  EXPECT_EQ(nfc("a\xcc\x82\xcc\xa3"), "\xe1\xba\xad");         // a + ^ + dot below -> ậ (reorder)
  EXPECT_EQ(nfc("\xe1\x84\x80\xe1\x85\xa1"), "\xea\xb0\x80");  // Hangul L + V -> 가
  EXPECT_EQ(nfc("\xea\xb0\x80\xe1\x86\xa8"), "\xea\xb0\x81");  // LV + T -> 각
  EXPECT_EQ(nfc("\xe0\xa5\x98"), "\xe0\xa4\x95\xe0\xa4\xbc");  // U+0958 is excluded: stays split
  EXPECT_EQ(nfc("\xcd\x84"), "\xcc\x88\xcc\x81");              // U+0344 -> U+0308 U+0301
  EXPECT_EQ(nfc("\xff"
                "e\xcc\x81"),
            "\xff\xc3\xa9");  // invalid byte passes through
  EXPECT_TRUE(unicode::quick_is_nfc("F\xc3\xbchrer"));
  EXPECT_FALSE(unicode::quick_is_nfc("e\xcc\x81"));
}

TEST(UnicodeNfc, MatchesPythonUnicodedata) {
  if (std::system("python3 -c 'import unicodedata' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 not available";
  // Random strings over code points where NFC does real work: bases, precomposed letters,
  // combining marks of several classes, Hangul jamo and syllables, singletons, exclusions.
  const std::vector<char32_t> pool = {
      'a',    'e',    'o',    'A',    'u',    ' ',    0xE9,   0xC5,   0x212B, 0x2126,
      0x300,  0x301,  0x302,  0x308,  0x323,  0x327,  0x328,  0x31B,  0x345,  0x344,
      0x340,  0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01, 0x0915, 0x093C, 0x0958, 0x0B47,
      0x0B3E, 0x1E9B, 0x1F00, 0x3B1,  0x3099, 0x304B, 0xF900};
  std::mt19937 rng(11);
  std::vector<std::string> strs;
  for (int k = 0; k < 400; ++k) {
    std::string s;
    for (size_t n = 1 + rng() % 8; n > 0; --n) unicode::utf8_append(s, pool[rng() % pool.size()]);
    strs.push_back(s);
  }
  TempDir dir;
  json in = strs;
  spit(dir.path() / "in.json", in.dump());
  const std::string cmd =
      "python3 -c \"import json,sys,unicodedata as u; "
      "print(json.dumps([u.normalize('NFC', s) for s in json.load(open(sys.argv[1]))]))\" " +
      (dir.path() / "in.json").string() + " > " + (dir.path() / "out.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const json out = json::parse(slurp((dir.path() / "out.json").string()));
  ASSERT_EQ(out.size(), strs.size());
  for (size_t k = 0; k < strs.size(); ++k)
    EXPECT_EQ(unicode::nfc(strs[k]), out[k].get<std::string>()) << "string " << k;
}

// ---- a tiny tokenizer written here ------------------------------------------------------------

namespace {

// 256 byte symbols (ids 0..255 in byte order), then merged tokens from `merges`.
struct Tiny {
  std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"},  {"l", "l"},   {"he", "ll"},  {"hell", "o"},  {"Ġ", "w"},
      {"o", "r"},  {"Ġw", "or"}, {"Ġwor", "l"}, {"Ġworl", "d"}, {"a", "a"},
      {"aa", "a"}, {"Ġ", "Ġ"},   {"ĠĠ", "Ġ"}};
  json vocab = json::object();
  Tiny() {
    for (int b = 0; b < 256; ++b) vocab[byte_symbol(static_cast<unsigned char>(b))] = b;
    int id = 256;
    for (auto& [a, b] : merges)
      if (!vocab.contains(a + b)) vocab[a + b] = id++;
  }
  json added() const {
    return json::array({{{"id", 300}, {"content", "<|end|>"}, {"special", true}},
                        {{"id", 301}, {"content", "<x>"}, {"special", false}},
                        {{"id", 302}, {"content", "<x><y>"}, {"special", false}}});
  }
  json tokenizer_json(bool pairs) const {
    json m = json::array();
    for (auto& [a, b] : merges) m.push_back(pairs ? json::array({a, b}) : json(a + " " + b));
    return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
            {"added_tokens", added()}};
  }
  std::string merges_txt() const {
    std::string s = "#version: 0.2\n";
    for (auto& [a, b] : merges) s += a + " " + b + "\n";
    return s;
  }
  std::map<std::pair<std::string, std::string>, int> ranks() const {
    std::map<std::pair<std::string, std::string>, int> r;
    for (size_t i = 0; i < merges.size(); ++i) r.emplace(merges[i], static_cast<int>(i));
    return r;
  }
};

}  // namespace

TEST(QwenTiny, BothMergeFormatsAndVocabMerges) {
  Tiny t;
  TempDir dir;
  spit(dir.path() / "strings.json", t.tokenizer_json(false).dump());
  spit(dir.path() / "pairs.json", t.tokenizer_json(true).dump());
  fs::create_directories(dir.path() / "split");
  spit(dir.path() / "split" / "vocab.json", t.vocab.dump());
  spit(dir.path() / "split" / "merges.txt", t.merges_txt());
  json cfg = {{"eos_token", "<|end|>"}, {"added_tokens_decoder", json::object()}};
  for (const json& a : t.added())
    cfg["added_tokens_decoder"][std::to_string(a["id"].get<int>())] = {{"content", a["content"]},
                                                                       {"special", a["special"]}};
  spit(dir.path() / "split" / "tokenizer_config.json", cfg.dump());

  auto s = QwenTokenizer::from_tokenizer_json((dir.path() / "strings.json").string());
  auto p = QwenTokenizer::from_tokenizer_json((dir.path() / "pairs.json").string());
  auto v = QwenTokenizer::from_dir((dir.path() / "split").string());
  auto factory = make_tokenizer("qwen:" + (dir.path() / "split").string());
  EXPECT_EQ(factory->name(), "qwen");
  EXPECT_EQ(s->num_merges(), t.merges.size());
  EXPECT_EQ(v->eos_id(), 300);
  EXPECT_EQ(s->eos_id(), -1);  // no tokenizer_config.json, no <|endoftext|>
  EXPECT_EQ(s->vocab_size(), 303);

  const auto ranks = t.ranks();
  const std::vector<std::string> texts = {"hello world", "hello<|end|>aaaaaaa   world",
                                          "<x><y><x>hell<x", "  hello\n\n worldhello", ""};
  for (const std::string& text : texts) {
    const auto ids = s->encode(text);
    EXPECT_EQ(p->encode(text), ids) << text;
    EXPECT_EQ(v->encode(text), ids) << text;
    EXPECT_EQ(factory->encode(text), ids) << text;
    EXPECT_EQ(s->decode(ids), text);
  }
  // Expected ids built by hand from the naive BPE on the regex pieces.
  auto ids_of = [&](std::string_view w) {
    std::vector<int32_t> r;
    for (const std::string& sym : naive_bpe(w, ranks)) r.push_back(t.vocab.at(sym).get<int32_t>());
    return r;
  };
  std::vector<int32_t> want = ids_of("hello");
  for (int32_t id : ids_of(" world")) want.push_back(id);
  EXPECT_EQ(s->encode("hello world"), want);
  EXPECT_EQ(want, (std::vector<int32_t>{t.vocab["hello"].get<int32_t>(),
                                        t.vocab["Ġworld"].get<int32_t>()}));
  // Longest added token at the leftmost position wins.
  want = {302, 301};
  for (int32_t id : ids_of("hell")) want.push_back(id);
  want.push_back(301);
  EXPECT_EQ(s->encode("<x><y><x>hell<x>"), want);
  EXPECT_EQ(s->encode("aaaaaaa"), ids_of("aaaaaaa"));
  // Rank order, not greedy-longest: (a a) everywhere first, then (aa a) once.
  EXPECT_EQ(s->encode("aaaaaaa"),
            (std::vector<int32_t>{t.vocab["aa"].get<int32_t>(), t.vocab["aa"].get<int32_t>(),
                                  t.vocab["aaa"].get<int32_t>()}));
  EXPECT_TRUE(s->is_special(300));
  EXPECT_FALSE(s->is_special(301));
}

TEST(QwenTiny, BadFiles) {
  Tiny t;
  TempDir dir;
  const fs::path d = dir.path();
  auto write_split = [&](const std::string& vocab, const std::string& merges) {
    spit(d / "vocab.json", vocab);
    spit(d / "merges.txt", merges);
  };
  // Missing files.
  expect_error([&] { QwenTokenizer::from_dir(d.string()); },
               "neither tokenizer.json nor vocab.json");
  expect_error([&] { QwenTokenizer::from_dir((d / "nope").string()); }, "is not a directory");
  expect_error(
      [&] { QwenTokenizer::from_vocab_merges((d / "v.json").string(), (d / "m.txt").string()); },
      "does not exist");
  spit(d / "vocab.json", t.vocab.dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "merges.txt is missing");
  // Malformed JSON.
  write_split("{\"a\": 1, ", t.merges_txt());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "malformed JSON");
  write_split("[1, 2]", t.merges_txt());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "not a JSON object");
  json v = t.vocab;
  v["h"] = "seven";
  write_split(v.dump(), t.merges_txt());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "is not an integer");
  v["h"] = -4;
  write_split(v.dump(), t.merges_txt());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "outside [0,");
  v = t.vocab;
  v["zz"] = 0;  // id 0 twice
  write_split(v.dump(), t.merges_txt());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "id 0 is used by");
  // A vocabulary without all 256 byte symbols.
  v = t.vocab;
  v.erase("a");
  write_split(v.dump(), "");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "for byte 0x61");
  // Merges referencing unknown tokens, or making one.
  write_split(t.vocab.dump(), t.merges_txt() + "q xyz\n");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "'xyz' is not in the vocabulary");
  write_split(t.vocab.dump(), t.merges_txt() + "q r\n");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); },
               "the result 'qr' is not in the vocabulary");
  write_split(t.vocab.dump(), t.merges_txt() + "hello\n");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "not two tokens");
  // tokenizer.json problems.
  fs::remove(d / "vocab.json");
  fs::remove(d / "merges.txt");
  spit(d / "tokenizer.json", "{\"model\": {\"vocab\": {}}");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "malformed JSON");
  spit(d / "tokenizer.json", "{\"added_tokens\": []}");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "no \"model\" object");
  // The streaming reader bounds nesting as parse_json_limited does, in keys it skips too.
  spit(d / "tokenizer.json",
       "{\"normalizer\": " + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); },
               "[qwen_tokenizer] " + (d / "tokenizer.json").string() +
                   ": nested deeper than 64 levels of arrays and objects");
  json tj = t.tokenizer_json(true);
  tj["model"]["merges"].push_back(json::array({"a", "b", "c"}));
  spit(d / "tokenizer.json", tj.dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "neither \"a b\" nor");
  tj = t.tokenizer_json(false);
  tj["model"]["merges"].push_back("Ġworld nope");
  spit(d / "tokenizer.json", tj.dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "'nope' is not in the vocabulary");
  tj = t.tokenizer_json(false);
  tj["added_tokens"].push_back({{"id", 310}});
  spit(d / "tokenizer.json", tj.dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "needs 'id' and 'content'");
  tj = t.tokenizer_json(false);
  tj["model"]["vocab"] = json::array({"a"});
  spit(d / "tokenizer.json", tj.dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "model has no vocab object");
  tj = t.tokenizer_json(false);
  tj["model"]["vocab"]["Ġworld"] = {{"nested", 1}};
  spit(d / "tokenizer.json", tj.dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); },
               "id of token 'Ġworld' is not an integer");
  tj = t.tokenizer_json(false);
  tj["model"]["type"] = "WordPiece";
  spit(d / "tokenizer.json", tj.dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "is not BPE");
  tj = t.tokenizer_json(false);
  tj["added_tokens"].push_back({{"id", 301}, {"content", "<dup>"}});
  spit(d / "tokenizer.json", tj.dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "added token id 301 appears twice");
  tj = t.tokenizer_json(false);
  spit(d / "tokenizer.json", tj.dump());
  spit(d / "tokenizer_config.json", json({{"eos_token", "<nope>"}}).dump());
  expect_error([&] { QwenTokenizer::from_dir(d.string()); }, "eos_token '<nope>' is not a token");
  const std::string cfg = (d / "tokenizer_config.json").string();
  spit(cfg, "{");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); },
               "[json] tokenizer_config.json at " + cfg + ": invalid JSON at byte 2");
  // Wrongly typed fields: the file and the field, never nlohmann's bare type_error.
  const std::pair<json, std::string> typed[] = {
      {{{"eos_token", 5}},
       "field \"eos_token\" must be a string or an object with \"content\", got number 5"},
      {{{"eos_token", {{"content", false}}}},
       "field \"eos_token\" must be a string or an object with \"content\", got object "
       "{\"content\":false}"},
      {{{"add_bos_token", "yes"}},
       "field \"add_bos_token\" must be true or false, got string \"yes\""},
      {{{"added_tokens_decoder", {{"301", {{"content", "<x>"}, {"special", "yes"}}}}}},
       "field \"added_tokens_decoder.301.special\" must be true or false, got string \"yes\""},
      {{{"added_tokens_decoder", {{"301", "<x>"}}}},
       "field \"added_tokens_decoder.301\" must be an object with a string \"content\""},
      {{{"added_tokens_decoder", {{"-3", {{"content", "<x>"}}}}}},
       "field \"added_tokens_decoder\" key \"-3\" is not a token id"},
      {{{"chat_template", 7}}, "field \"chat_template\" must be a string or a list"},
      {json::array({1}), "must be a JSON object, got array [1]"},
  };
  for (const auto& [bad, want] : typed) {
    spit(cfg, bad.dump());
    expect_error([&] { QwenTokenizer::from_dir(d.string()); },
                 "[tokenizer] tokenizer_config.json at " + cfg + ": " + want);
  }
  // Too deep, in a key nobody reads: refused while parsing, naming the file.
  spit(cfg, "{\"unused\": " + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}");
  expect_error([&] { QwenTokenizer::from_dir(d.string()); },
               "[json] tokenizer_config.json at " + cfg +
                   ": nested deeper than 64 levels of arrays and objects");
  // An id with no token (a gap in the vocabulary) cannot be decoded.
  fs::remove(d / "tokenizer_config.json");
  tj = t.tokenizer_json(false);
  tj["added_tokens"] = json::array({{{"id", 400}, {"content", "<far>"}}});
  spit(d / "tokenizer.json", tj.dump());
  auto tok = QwenTokenizer::from_dir(d.string());
  EXPECT_EQ(tok->vocab_size(), 401);
  EXPECT_EQ(tok->decode(-1, 400), "<far>");
  expect_error([&] { tok->decode(-1, 350); }, "id 350 has no token");
}
