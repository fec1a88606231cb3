// The OpenAI protocol pieces (serve/openai.h), without sockets: Qwen3's chat template, the
// <think> split, request fields checked against OpenAI's ranges, and the text stream that holds
// back incomplete UTF-8 and possible starts of stop strings.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "models/io/qwen_tokenizer.h"
#include "models/io/tokenizer.h"
#include "serve/openai.h"
#include "tests/test_data.h"

namespace kiln::serve {
namespace {

using nlohmann::json;

TEST(ServeOpenAi, Qwen3ChatTemplateWithAndWithoutThinking) {
  const std::vector<ChatMessage> m = {{"system", "S"}, {"user", "U"}};
  EXPECT_EQ(qwen3_chat_prompt(m, true),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(qwen3_chat_prompt(m, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  const json body = {
      {"messages",
       {{{"role", "developer"}, {"content", "D"}},
        {{"role", "user"},
         {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
      {"chat_template_kwargs", {{"enable_thinking", false}}}};
  const std::vector<ChatMessage> parsed = parse_messages(body);
  ASSERT_EQ(parsed.size(), 2u);
  EXPECT_EQ(parsed[0].role, "system");  // developer is OpenAI's newer name for system
  EXPECT_EQ(parsed[1].content, "ab");
  EXPECT_FALSE(enable_thinking(body));
  EXPECT_TRUE(enable_thinking(json::object()));
}

TEST(ServeOpenAi, ThinkBlocksBecomeReasoningContent) {
  ReasonedText r = split_reasoning("<think>\nweigh it\n</think>\n\nThe answer.");
  EXPECT_EQ(r.reasoning, "weigh it");
  EXPECT_EQ(r.content, "The answer.");
  r = split_reasoning("<think>still thinking");  // cut off by max_tokens
  EXPECT_EQ(r.reasoning, "still thinking");
  EXPECT_EQ(r.content, "");
  r = split_reasoning("Plain text.");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Plain text.");
  r = split_reasoning("no opening tag</think> after");  // only a reply that opens the block
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "no opening tag</think> after");
}

// Streamed in pieces of every size (so that "<think>", "</think>" and the whitespace around them
// are split every way), the reasoning and content add up to split_reasoning of the whole text.
TEST(ServeOpenAi, ReasoningStreamAddsUpToSplitReasoning) {
  const std::vector<std::string> texts = {
      "<think>\nweigh it\n</think>\n\nThe answer.",
      "<think>still thinking",
      "<think>a </thi",
      "Plain text.",
      " <think>not a block</think>",
      "<th",
      "<think>",
      "<think></think>",
      "<think>\n\n</think>  \n",
      "<think> x  y </think> a  b \n</think> c ",
      "<thinker> is a word",
  };
  for (const std::string& text : texts)
    for (std::size_t step : {1, 2, 3, 5, 7, 8, 64}) {
      ReasoningStream rs;
      ReasonedText got;
      for (std::size_t i = 0; i < text.size(); i += step) {
        const ReasonedText t = rs.push(std::string_view(text).substr(i, step));
        got.reasoning += t.reasoning;
        got.content += t.content;
      }
      const ReasonedText t = rs.flush();
      got.reasoning += t.reasoning;
      got.content += t.content;
      const ReasonedText want = split_reasoning(text);
      EXPECT_EQ(got.reasoning, want.reasoning) << "'" << text << "' in pieces of " << step;
      EXPECT_EQ(got.content, want.content) << "'" << text << "' in pieces of " << step;
    }
}

TEST(ServeOpenAi, SamplingFieldsAreCheckedByName) {
  const SamplingParams p = sampling_from_body({{"temperature", 0.5},
                                               {"top_p", 0.9},
                                               {"top_k", 40},
                                               {"min_p", 0.1},
                                               {"seed", 7},
                                               {"max_completion_tokens", 12},
                                               {"presence_penalty", 1.0},
                                               {"logprobs", true},
                                               {"top_logprobs", 3}},
                                              true, 99, 256);
  EXPECT_EQ(p.sampling.temperature, 0.5);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_EQ(p.sampling.seed, 7u);
  EXPECT_EQ(p.max_tokens, 12);
  EXPECT_EQ(p.presence_penalty, 1.0);
  EXPECT_EQ(p.top_logprobs, 3);
  EXPECT_EQ(sampling_from_body(json::object(), false, 99, 256).sampling.seed, 99u);
  EXPECT_EQ(sampling_from_body(json::object(), false, 99, 256).max_tokens, 256);
  EXPECT_EQ(sampling_from_body({{"logprobs", 2}}, false, 1, 1).top_logprobs, 2);
  auto message = [](const json& body, bool chat) {
    try {
      sampling_from_body(body, chat, 0, 16);
    } catch (const HttpError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param + ": " + e.what();
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{"temperature", 3}}, false),
            "temperature: 'temperature' is 3; it must lie in [0, 2]");
  EXPECT_EQ(message({{"top_p", "high"}}, false), "top_p: 'top_p' must be a number, got string");
  EXPECT_EQ(message({{"max_tokens", 0}}, false),
            "max_tokens: 'max_tokens' is 0; it must lie in [1, 1073741824]");
  EXPECT_EQ(message({{"top_logprobs", 2}}, true),
            "top_logprobs: 'top_logprobs' needs 'logprobs': true");
  EXPECT_EQ(message({{"n", 2}}, false), "n: 'n' is 2; it must lie in [1, 1]");
  EXPECT_EQ(stop_strings({{"stop", {"a", "b"}}}), (std::vector<std::string>{"a", "b"}));
  EXPECT_THROW(stop_strings({{"stop", {"1", "2", "3", "4", "5"}}}), HttpError);
}

TEST(ServeOpenAi, TextStreamHoldsBackPartialUtf8AndStopPrefixes) {
  TextStream s({"END"});
  EXPECT_EQ(s.push("Hello"), "Hello");
  EXPECT_EQ(s.push(" \xE2\x82"), " ");           // the euro sign's first two bytes wait
  EXPECT_EQ(s.push("\xAC E"), "\xE2\x82\xAC ");  // "E" may start "END"
  EXPECT_EQ(s.push("N"), "");
  EXPECT_EQ(s.push("DING"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.push("more"), "");
  EXPECT_EQ(s.text(), "Hello \xE2\x82\xAC ");
  TextStream t({"zz"});
  EXPECT_EQ(t.push("abz"), "ab");
  EXPECT_EQ(t.push("q"), "zq");  // not a stop string after all
  EXPECT_EQ(t.push("\xC3"), "");
  EXPECT_EQ(t.flush(), "");  // an incomplete UTF-8 tail at the end is dropped
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(t.text(), "abzq");
  // A stop string arriving in pieces, and one inside a single piece with text before it.
  TextStream u({"<|x|>", "##"});
  EXPECT_EQ(u.push("a<|"), "a");
  EXPECT_EQ(u.push("x"), "");
  EXPECT_EQ(u.push("|>tail"), "");
  EXPECT_TRUE(u.stopped());
  EXPECT_EQ(u.text(), "a");
  TextStream v({"##"});
  EXPECT_EQ(v.push("one two ## three"), "one two ");
  EXPECT_TRUE(v.stopped());
}

// The incremental pieces add up to the whole decode, for the Qwen byte-level BPE (multi-byte
// characters split across tokens included) and for llama2.c's SentencePiece (the leading space
// of the first token dropped, every later one kept).
TEST(ServeOpenAi, IncrementalDecoderPiecesAddUpToTheWholeDecode) {
  auto check = [](const io::Tokenizer& tok, const std::string& text) {
    const std::vector<std::int32_t> ids = tok.encode(text);
    ASSERT_GT(ids.size(), 3u);
    IncrementalDecoder d(tok);
    std::string joined;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      joined += d.push(ids[i]);
      const std::span<const std::int32_t> so_far(ids.data(), i + 1);
      EXPECT_EQ(joined, tok.decode(so_far)) << tok.name() << " after " << i + 1 << " tokens";
    }
  };
  const std::string text =
      "Once upon a time, 小猫 sat on a mat: \xE2\x82\xAC 3.14 \xF0\x9F\x98\x80!";
  const auto qwen = io::QwenTokenizer::from_vocab_merges(test_shared_data() + "/qwen/vocab.json",
                                                         test_shared_data() + "/qwen/merges.txt");
  check(*qwen, text);
  const std::string llama = test_shared_data() + "/llama2c/tokenizer.bin";
  if (std::filesystem::exists(llama))
    check(io::Llama2cTokenizer(llama), "Once upon a time, a cat sat.");
  check(io::ByteTokenizer(), text);
}

TEST(ServeOpenAi, ErrorsAreOpenAiObjects) {
  const json e = error_body(
      HttpError(404, "no such model", "invalid_request_error", "model", "model_not_found"));
  EXPECT_EQ(e["error"]["message"], "no such model");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "model");
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  EXPECT_TRUE(error_body(HttpError(400, "x"))["error"]["param"].is_null());
}

}  // namespace
}  // namespace kiln::serve
