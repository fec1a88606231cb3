// Tokenizers: byte and char round trips, and llama2.c's tokenizer.bin encoded
// exactly as run.c does, checked against a literal Python port of run.c's
// encode() (tests/models_io/llama2c_tok_ref.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kernels/common/error.h"
#include "models/io/tokenizer.h"
#include "tests/error_of.h"
#include "tests/test_data.h"
#include "tests/test_python.h"

namespace fs = std::filesystem;
using namespace kiln::io;
using kiln::test::expect_error;

namespace {

const std::string kData = test_shared_data();
const std::string kTokBin = kData + "/llama2c/tokenizer.bin";

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string to_hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (unsigned char c : s) {
    h.push_back(d[c >> 4]);
    h.push_back(d[c & 15]);
  }
  return h;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("kiln_tok_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Test strings: ASCII, odd whitespace, accents, CJK, emoji (incl. ZWJ
// sequences), invalid UTF-8, over-long continuation runs, NUL, text that
// spells special and byte pieces.
std::vector<std::string> cases() {
  return {
      "",
      "Once upon a time",
      "Hello, world!",
      "a",
      " ",
      "\n",
      "   leading spaces",
      "trailing spaces   ",
      "tab\tand\nnewline\r\nend",
      "multiple\n\n\nnewlines  and  double  spaces",
      "Ünïcödé text: naïve café, façade, Ångström",
      "日本語のテキストです。",
      "안녕하세요 세계",
      "Здравствуй, мир! Γειά σου Κόσμε",
      "emoji 😀🎉 family 👨‍👩‍👧 flag 🇫🇷",
      "mixed 123 456.789 numbers 1,000,000",
      "<s> </s> <unk> literal specials",
      "don't won't it's we'll I'm",
      "ligature \xef\xac\x81 \xe2\x84\x83 \xe2\x88\x91 math",
      std::string("bad utf8 \xff\xfe x \xc3 y \x80\x80 z"),
      std::string("\xe2\x82\x82\x82\x82\x82\x82 long continuation run"),
      std::string("nul\0byte", 8),
      std::string(300, 'x'),
      "\x01\x02\x1b[0m control bytes",
      "Lily and Ben went to the park. They saw a big red ball! \"Can we play?\" asked Lily.",
  };
}

}  // namespace

// ---- byte ---------------------------------------------------------------------

TEST(ByteTokenizer, RoundTripAllBytes) {
  ByteTokenizer t;
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.eos_id(), -1);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  auto ids = t.encode(all, true, true);  // no BOS/EOS tokens: flags ignored
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(t.decode(ids), all);
  EXPECT_EQ(t.decode(-1, 'A'), "A");
  EXPECT_THROW(t.decode(-1, 256), kiln::Error);
  EXPECT_THROW(t.decode(-1, -1), kiln::Error);
}

// ---- char ---------------------------------------------------------------------

TEST(CharTokenizer, TinyShakespeare) {
  std::string text = read_file(kData + "/text/tinyshakespeare.txt");
  ASSERT_EQ(text.size(), 1115394u);
  CharTokenizer t = CharTokenizer::from_text(text);
  std::set<unsigned char> distinct(text.begin(), text.end());  // reference: sorted distinct bytes
  EXPECT_EQ(t.vocab_size(), static_cast<int32_t>(distinct.size()));
  EXPECT_EQ(t.vocab_size(), 65);  // nanoGPT shakespeare_char
  int32_t i = 0;
  for (unsigned char c : distinct)
    EXPECT_EQ(t.decode(-1, i++), std::string(1, static_cast<char>(c)));
  std::string head = text.substr(0, 5000);
  auto ids = t.encode(head);
  ASSERT_EQ(ids.size(), head.size());
  for (size_t k = 0; k < head.size(); ++k)
    EXPECT_EQ(ids[k], std::distance(distinct.begin(), distinct.find(head[k])));
  EXPECT_EQ(t.decode(ids), head);

  CharTokenizer u = CharTokenizer::from_serialized(t.serialize());
  EXPECT_EQ(u.encode(head), ids);
  expect_error([&] { t.encode("First Citizen: 😀"); },
               "(0xf0) at byte 15 is not in the 65-character");
  expect_error([&] { t.encode("~"); }, "'~'");
  EXPECT_THROW(t.decode(-1, 65), kiln::Error);
}

TEST(CharTokenizer, BadInput) {
  expect_error([] { CharTokenizer::from_text(""); }, "empty training text");
  expect_error([] { CharTokenizer::from_serialized("ba"); }, "not strictly increasing");
  expect_error([] { CharTokenizer::from_serialized("aa"); }, "not strictly increasing");
  EXPECT_EQ(CharTokenizer::from_serialized("\n ab").vocab_size(), 4);
}

// ---- llama2.c -----------------------------------------------------------------

TEST(Llama2cTokenizer, LoadsRealVocab) {
  Llama2cTokenizer t(kTokBin);
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_EQ(t.max_token_length(), 27);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.piece(3), "<0x00>");
  EXPECT_EQ(t.piece(258), "<0xFF>");
  EXPECT_EQ(t.decode(-1, 3 + 'A'), "A");  // byte piece -> raw byte
  EXPECT_EQ(t.decode(-1, 3 + 0xE2), "\xe2");
  int32_t once = t.lookup(" Once");
  ASSERT_GE(once, 0);
  EXPECT_EQ(t.decode(1, once), "Once");   // leading space dropped after BOS
  EXPECT_EQ(t.decode(5, once), " Once");  // kept elsewhere
  EXPECT_THROW(t.decode(-1, 32000), kiln::Error);
  Llama2cTokenizer exact(kTokBin, 32000);
  EXPECT_EQ(exact.vocab_size(), 32000);
  expect_error([&] { Llama2cTokenizer(kTokBin, 31999); }, "trailing bytes");
}

TEST(Llama2cTokenizer, MatchesRunCReference) {
  if (!fs::exists(test_python())) GTEST_SKIP() << test_python() << " not found";
  Llama2cTokenizer t(kTokBin);
  TempDir tmp;
  // A longer stretch of real text as well, to exercise many merges.
  std::string story = read_file(kData + "/text/tinystories_valid_head.txt").substr(0, 1200);
  auto strs = cases();
  strs.push_back(story);
  nlohmann::json in = nlohmann::json::array();
  std::vector<std::pair<bool, bool>> flags;
  for (size_t i = 0; i < strs.size(); ++i) {
    bool bos = i % 3 != 1, eos = i % 4 == 2;
    flags.push_back({bos, eos});
    in.push_back({{"text_hex", to_hex(strs[i])}, {"bos", bos}, {"eos", eos}});
  }
  std::ofstream(tmp / "in.json") << in.dump();
  std::string cmd = test_python() + " " + std::string(KILN_SOURCE_DIR) +
                    "/tests/models_io/llama2c_tok_ref.py " + kTokBin + " " + (tmp / "in.json") +
                    " " + (tmp / "out.json");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto ref = nlohmann::json::parse(std::ifstream(tmp / "out.json"));
  ASSERT_EQ(ref.size(), strs.size());
  for (size_t i = 0; i < strs.size(); ++i) {
    auto ids = t.encode(strs[i], flags[i].first, flags[i].second);
    EXPECT_EQ(ids, ref[i].get<std::vector<int32_t>>()) << "case " << i << ": " << strs[i];
  }
}

TEST(Llama2cTokenizer, KnownEncoding) {
  // "Once upon a time" with BOS; the reference test covers the general case.
  Llama2cTokenizer t(kTokBin);
  std::vector<int32_t> ids = t.encode("Once upon a time", true, false);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(t.piece(ids[1]), " Once");
  EXPECT_EQ(t.piece(ids[2]), " upon");
  EXPECT_EQ(t.piece(ids[3]), " a");
  EXPECT_EQ(t.piece(ids[4]), " time");
  // The ids themselves, as llama2.c prints them for this prompt (also what the Python port gives).
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 9038, 2501, 263, 931}));
  EXPECT_TRUE(t.encode("", false, false).empty());
  EXPECT_EQ(t.encode("", true, true), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(t.encode(" ", false, false), std::vector<int32_t>{t.lookup("  ")});
}

TEST(Llama2cTokenizer, RoundTrip) {
  Llama2cTokenizer t(kTokBin);
  auto strs = cases();
  strs.push_back(read_file(kData + "/text/tinystories_valid_head.txt").substr(0, 20000));
  for (const std::string& s : strs) {
    for (bool bos : {false, true}) {
      auto ids = t.encode(s, bos, true);
      EXPECT_EQ(t.decode(ids), s) << s;
      for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < t.vocab_size());
    }
    // Streaming decode after BOS, as run.c prints it.
    auto ids = t.encode(s, true, false);
    std::string streamed;
    for (size_t k = 1; k < ids.size(); ++k) streamed += t.decode(ids[k - 1], ids[k]);
    EXPECT_EQ(streamed, s);
  }
}

TEST(Llama2cTokenizer, BadFiles) {
  TempDir tmp;
  std::string good = read_file(kTokBin);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(tmp / name, std::ios::binary) << bytes;
    return tmp / name;
  };
  expect_error([&] { Llama2cTokenizer(write("cut.bin", good.substr(0, good.size() - 3))); },
               "truncated");
  expect_error([&] { Llama2cTokenizer(write("cut2.bin", good.substr(0, 10))); }, "truncated");
  expect_error([&] { Llama2cTokenizer(write("tiny.bin", "ab")); }, "too small");
  std::string bad = good;
  int32_t huge = 1 << 30;
  std::memcpy(bad.data(), &huge, 4);
  expect_error([&] { Llama2cTokenizer(write("maxlen.bin", bad)); },
               "max_token_length = 1073741824");
  bad = good;
  int32_t len = 28;  // first token's length, beyond max_token_length 27
  std::memcpy(bad.data() + 8, &len, 4);
  expect_error([&] { Llama2cTokenizer(write("len.bin", bad)); }, "length 28 outside");
  bad = good;
  len = -5;
  std::memcpy(bad.data() + 8, &len, 4);
  expect_error([&] { Llama2cTokenizer(write("neg.bin", bad)); }, "length -5 outside");
  // Only the first 100 tokens: not enough for the byte pieces.
  size_t off = 4;
  for (int k = 0; k < 100; ++k) {
    int32_t n;
    std::memcpy(&n, good.data() + off + 4, 4);
    off += 8 + static_cast<size_t>(n);
  }
  expect_error([&] { Llama2cTokenizer(write("short.bin", good.substr(0, off))); },
               "need at least 259");
  expect_error([&] { Llama2cTokenizer(tmp / "missing.bin"); }, "cannot open");
}

// ---- factory ------------------------------------------------------------------

TEST(MakeTokenizer, Specs) {
  auto b = make_tokenizer("byte");
  EXPECT_EQ(b->name(), "byte");
  EXPECT_EQ(b->vocab_size(), 256);
  auto c = make_tokenizer("char", "hello world");
  EXPECT_EQ(c->name(), "char");
  EXPECT_EQ(c->vocab_size(), 8);  // " dehlorw"
  EXPECT_EQ(c->decode(c->encode("low")), "low");
  auto l = make_tokenizer("llama2c:" + kTokBin);
  EXPECT_EQ(l->name(), "llama2c");
  EXPECT_EQ(l->vocab_size(), 32000);
  EXPECT_EQ(l->decode(l->encode("Hi there", true, true)), "Hi there");
  expect_error([] { make_tokenizer("qwen"); }, "unknown tokenizer spec 'qwen'");
  expect_error([] { make_tokenizer("char", ""); }, "empty training text");
  expect_error([] { make_tokenizer("llama2c:"); }, "needs a path");
}
