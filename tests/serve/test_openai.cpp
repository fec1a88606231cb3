// The OpenAI protocol pieces (serve/openai.h), without sockets: Qwen3's chat template, the
// <think> split, request fields checked against OpenAI's ranges, and the text stream that holds
// back incomplete UTF-8 and possible starts of stop strings.
#include <gtest/gtest.h>

#include "serve/openai.h"

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
  EXPECT_EQ(s.update("Hello"), "Hello");
  EXPECT_EQ(s.update("Hello \xE2\x82"), " ");  // the euro sign's first two bytes wait
  EXPECT_EQ(s.update("Hello \xE2\x82\xAC E"), "\xE2\x82\xAC ");  // "E" may start "END"
  EXPECT_EQ(s.update("Hello \xE2\x82\xAC EN"), "");
  EXPECT_EQ(s.update("Hello \xE2\x82\xAC ENDING"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "Hello \xE2\x82\xAC ");
  TextStream t({"zz"});
  EXPECT_EQ(t.update("abz"), "ab");
  EXPECT_EQ(t.update("abzq"), "zq");  // not a stop string after all
  EXPECT_EQ(t.update("abzq\xC3"), "");
  EXPECT_EQ(t.flush(), "");  // an incomplete UTF-8 tail at the end is dropped
  EXPECT_FALSE(t.stopped());
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
