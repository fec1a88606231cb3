// parse_json_limited: JSON from files and requests kiln does not control. Deep nesting is refused
// while parsing (a million "[" must not reach nlohmann's recursive copy, dump or destructor), the
// size limit comes before any parsing, and every message names the source.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/common/error.h"
#include "models/io/json_limits.h"
#include "tests/error_of.h"

using kiln::io::JsonLimits;
using kiln::io::parse_json_limited;
using kiln::test::error_of;
using nlohmann::json;

namespace {

// `levels` nested arrays around `inner`: "[[[inner]]]".
std::string nested(std::size_t levels, const std::string& inner = "") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

}  // namespace

TEST(JsonLimits, MillionDeepArraysRefusedQuicklyWithoutACrash) {
  const std::string text = nested(1'000'000);
  const auto start = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { parse_json_limited(text, "request body"); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(e, "[json] request body: nested deeper than 64 levels of arrays and objects");
  // Refused at the 65th "[", not after reading the other 999,935 and building them.
  EXPECT_LT(seconds, 0.5);
  // Objects count as levels too, and so does nesting inside an object's member.
  std::string objects;
  for (int i = 0; i < 100'000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(100'000, '}');
  EXPECT_EQ(error_of([&] { parse_json_limited(objects, "o.json"); }),
            "[json] o.json: nested deeper than 64 levels of arrays and objects");
  EXPECT_EQ(error_of([&] { parse_json_limited("{\"unused\": " + nested(1'000'000) + "}", "c"); }),
            "[json] c: nested deeper than 64 levels of arrays and objects");
}

TEST(JsonLimits, SixtyFourLevelsPassSixtyFiveRefused) {
  json j = parse_json_limited(nested(64, "7"), "x");
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(j.is_array()) << i;
    json inner = j[0];
    j = std::move(inner);
  }
  EXPECT_EQ(j, 7);
  EXPECT_EQ(error_of([&] { parse_json_limited(nested(65, "7"), "x"); }),
            "[json] x: nested deeper than 64 levels of arrays and objects");
  // Mixed: 63 arrays around an object is 64 levels; one more array inside it is 65.
  EXPECT_NO_THROW(parse_json_limited(nested(63, "{\"k\": 1}"), "x"));
  EXPECT_NE(error_of([&] { parse_json_limited(nested(63, "{\"k\": []}"), "x"); }), "");
  // Scalars have no depth; the limit is the caller's.
  EXPECT_EQ(parse_json_limited("\"s\"", "x"), "s");
  EXPECT_EQ(error_of([&] { parse_json_limited(nested(3), "x", {.max_depth = 2}); }),
            "[json] x: nested deeper than 2 levels of arrays and objects");
  EXPECT_NO_THROW(parse_json_limited(nested(2), "x", {.max_depth = 2}));
}

TEST(JsonLimits, SizeLimitRefusedBeforeParsing) {
  // Not JSON at all, so the size check must come first to give this message.
  const std::string text(1001, '!');
  EXPECT_EQ(error_of([&] { parse_json_limited(text, "request body", {.max_bytes = 1000}); }),
            "[json] request body: 1001 bytes is too large (limit 1000 bytes)");
  EXPECT_EQ(parse_json_limited("[1,2]", "x", {.max_bytes = 5}), json::array({1, 2}));
  EXPECT_EQ(JsonLimits{}.max_bytes, std::size_t{64} << 20);
  EXPECT_EQ(JsonLimits{}.max_depth, 64);
}

// nlohmann's byte offsets are 1-based and count the end of input as a byte: "{" fails at 2.
TEST(JsonLimits, InvalidJsonNamesTheSourceAndByte) {
  std::string e = error_of([&] { parse_json_limited("{\"a\": 1,", "config.json at /m/c.json"); });
  EXPECT_TRUE(e.starts_with("[json] config.json at /m/c.json: invalid JSON at byte 9: ")) << e;
  EXPECT_NE(e.find("unexpected end of input"), std::string::npos) << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;  // nlohmann's tag is dropped
  e = error_of([&] { parse_json_limited("", "request body"); });
  EXPECT_TRUE(e.starts_with("[json] request body: invalid JSON at byte 1: ")) << e;
  e = error_of([&] { parse_json_limited("[1] [2]", "b"); });
  EXPECT_TRUE(e.starts_with("[json] b: invalid JSON at byte 5: ")) << e;
  e = error_of([&] { parse_json_limited("\"\xff\"", "b"); });  // strings must be UTF-8
  EXPECT_TRUE(e.starts_with("[json] b: invalid JSON at byte 2: ")) << e;
}

TEST(JsonLimits, ValidJsonParsesAsNlohmannDoes) {
  const std::string text = R"({"a": [1, 2.5, "x", null, true], "b": {"c": {}}, "d": []})";
  EXPECT_EQ(parse_json_limited(text, "x"), json::parse(text));
}

TEST(JsonLimits, ExcerptIsShortAndNeverThrows) {
  EXPECT_EQ(kiln::io::json_excerpt(json("abc")), "\"abc\"");
  EXPECT_EQ(kiln::io::json_excerpt(json(std::string(200, 'x')), 10), "\"xxxxxx...");
  EXPECT_EQ(kiln::io::json_excerpt(json("\xff")), "\"\xef\xbf\xbd\"");  // U+FFFD, no type_error
}
