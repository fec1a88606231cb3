// The OpenAI protocol as `kiln serve` speaks it: request bodies to prompts and sampling
// parameters, the Qwen3 chat template, <think> blocks split into reasoning_content, and errors as
// OpenAI error objects. Pure functions on JSON and strings, no sockets.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "serve/engine.h"

namespace kiln::serve {

// An error the client gets as {"error": {"message", "type", "param", "code"}} with `status`.
struct HttpError : std::runtime_error {
  HttpError(int status, std::string message, std::string type = "invalid_request_error",
            std::string param = "", std::string code = "")
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};

nlohmann::json error_body(const HttpError& e);

struct ChatMessage {
  std::string role, content;
};

// Qwen3's ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
// "<|im_start|>assistant\n", plus an empty "<think>\n\n</think>\n\n" when thinking is off (the
// template's enable_thinking=False).
std::string qwen3_chat_prompt(const std::vector<ChatMessage>& messages, bool enable_thinking);

// "messages" of a chat request: roles system, user, assistant; content a string or an array of
// {"type": "text", "text": ...} parts. Anything else is a 400 naming the field.
std::vector<ChatMessage> parse_messages(const nlohmann::json& body);

// `chat_template_kwargs.enable_thinking` (default true, as Qwen3's template).
bool enable_thinking(const nlohmann::json& body);

// Text generated after the template: "<think>R</think>C" -> {R, C} (trimmed), else {"", text}.
// A reply cut off inside its <think> block is all reasoning.
struct ReasonedText {
  std::string reasoning, content;
};
ReasonedText split_reasoning(const std::string& text);

// The sampling fields (temperature, top_p, top_k, min_p, seed, max_tokens /
// max_completion_tokens, presence_penalty, frequency_penalty, logprobs, top_logprobs), checked
// against OpenAI's ranges. `chat` picks the chat form of logprobs (a bool plus top_logprobs)
// over the completions form (an integer). A request without a seed gets `default_seed`.
SamplingParams sampling_from_body(const nlohmann::json& body, bool chat, std::uint64_t default_seed,
                                  std::int64_t default_max_tokens);

// "stop": a string or up to 4 strings.
std::vector<std::string> stop_strings(const nlohmann::json& body);

// Streams text out of token ids: the bytes that are safe to send now (complete UTF-8, and not a
// possible start of a stop string), and whether a stop string was hit (the text is then cut
// before it).
class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // The full decoded text so far; returns the new bytes that may be sent.
  std::string update(const std::string& text);
  // At the end: whatever was held back (an incomplete UTF-8 tail is dropped).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // sent text, stop string excluded

 private:
  std::vector<std::string> stops_;
  std::string text_, pending_;
  bool stopped_ = false;
};

}  // namespace kiln::serve
