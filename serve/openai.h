// The OpenAI protocol as `kiln serve` speaks it: request bodies to prompts and sampling
// parameters, the Qwen3 chat template, <think> blocks split into reasoning_content, and errors as
// OpenAI error objects. Pure functions on JSON and strings, no sockets.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "models/io/tokenizer.h"
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

// split_reasoning as the text streams: a reply that opens with "<think>" gives reasoning until
// "</think>", then content, each trimmed of surrounding whitespace (held back until a non-space
// byte follows); any other reply is content, as it comes. Only a possible "<think>" or
// "</think>" and held whitespace wait, so the work per piece is the piece's. Concatenated, the
// pushes and the flush give split_reasoning(the whole text).
class ReasoningStream {
 public:
  ReasonedText push(std::string_view piece);
  ReasonedText flush();  // the end of the reply: what is still held

 private:
  enum class State { Undecided, Thinking, Answer, Plain };
  void trimmed(std::string_view s, std::string& out);  // appends s, whitespace trimmed
  State state_ = State::Undecided;
  std::string held_;      // bytes that may still be (the start of) a tag
  std::string space_;     // whitespace inside the current part, sent once text follows it
  bool started_ = false;  // the current part has had a non-space byte
};

// The sampling fields (temperature, top_p, top_k, min_p, seed, max_tokens /
// max_completion_tokens, presence_penalty, frequency_penalty, logprobs, top_logprobs), checked
// against OpenAI's ranges. `chat` picks the chat form of logprobs (a bool plus top_logprobs)
// over the completions form (an integer). A request without a seed gets `default_seed`.
SamplingParams sampling_from_body(const nlohmann::json& body, bool chat, std::uint64_t default_seed,
                                  std::int64_t default_max_tokens);

// "stop": a string or up to 4 strings.
std::vector<std::string> stop_strings(const nlohmann::json& body);

// Decodes a growing list of generated ids a step at a time: each push() decodes the window from
// the token before the last step's tokens to the end, not the whole list, and returns the bytes
// past what that window's head already gave (vLLM's incremental detokenization). The pieces add
// up to tok.decode(all ids) for tokenizers whose decode is the pieces of each token in context
// (byte-level BPE; SentencePiece, whose leading-space rule only touches a window's first token,
// whose text an earlier step gave). A window that does not extend its head's text is decoded
// again in full against what was given. Constant work per token, where decoding every id at
// every step was quadratic in the length of the answer.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const io::Tokenizer& tok) : tok_(tok) {}
  std::string push(std::int32_t id);

 private:
  const io::Tokenizer& tok_;
  std::vector<std::int32_t> ids_;
  std::size_t head_ = 0, read_ = 0;  // window start; ids before read_ have been given
  std::size_t given_ = 0;            // bytes given so far
};

// Streams text out of decoded pieces: the bytes that are safe to send now (complete UTF-8, and
// not a possible start of a stop string), and whether a stop string was hit (the text is then
// cut before it). Held-back bytes are the only ones searched and copied again: a stop string
// cannot start in text already sent, since any suffix that could begin one was held back.
class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends the next decoded bytes; returns the bytes that may be sent now.
  std::string push(std::string_view bytes);
  // At the end: whatever was held back (an incomplete UTF-8 tail is dropped).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // sent text, stop string excluded

 private:
  std::vector<std::string> stops_;
  std::string text_;     // sent
  std::string pending_;  // received, held back
  bool stopped_ = false;
};

}  // namespace kiln::serve
