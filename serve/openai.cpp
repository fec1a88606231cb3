#include "serve/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>

namespace kiln::serve {

using nlohmann::json;

json error_body(const HttpError& e) {
  json err = {{"message", e.what()}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return {{"error", err}};
}

std::string qwen3_chat_prompt(const std::vector<ChatMessage>& messages, bool enable_thinking) {
  std::string out;
  for (const ChatMessage& m : messages)
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  out += "<|im_start|>assistant\n";
  if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  return out;
}

namespace {

HttpError bad(std::string message, std::string param) {
  return HttpError(400, std::move(message), "invalid_request_error", std::move(param));
}

// body[key] as a number in [lo, hi], or `dflt` when absent or null.
double number_in(const json& body, const char* key, double lo, double hi, double dflt) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  const json& v = body[key];
  if (!v.is_number())
    throw bad(fmt::format("'{}' must be a number, got {}", key, v.type_name()), key);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    throw bad(fmt::format("'{}' is {}; it must lie in [{}, {}]", key, x, lo, hi), key);
  return x;
}

std::int64_t integer_in(const json& body, const char* key, std::int64_t lo, std::int64_t hi,
                        std::int64_t dflt) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  const json& v = body[key];
  if (!v.is_number_integer())
    throw bad(fmt::format("'{}' must be an integer, got {}", key, v.type_name()), key);
  const auto x = v.get<std::int64_t>();
  if (x < lo || x > hi)
    throw bad(fmt::format("'{}' is {}; it must lie in [{}, {}]", key, x, lo, hi), key);
  return x;
}

// The whitespace trim() removes (and ReasoningStream trims as it streams).
constexpr std::string_view kSpace = " \t\r\n";

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(kSpace);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// The longest proper prefix of `s` that `text` ends with: bytes a stream holds back, since they
// may grow into `s` (a stop string, a closing tag).
std::size_t prefix_at_end(std::string_view text, std::string_view s) {
  for (std::size_t k = std::min(s.size() - 1, text.size()); k > 0; --k)
    if (text.substr(text.size() - k) == s.substr(0, k)) return k;
  return 0;
}

// Bytes at the end of s that start a UTF-8 sequence not yet complete.
std::size_t incomplete_utf8_tail(const std::string& s) {
  for (std::size_t back = 1; back <= std::min<std::size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

std::vector<ChatMessage> parse_messages(const json& body) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw bad("'messages' must be a non-empty array", "messages");
  std::vector<ChatMessage> out;
  for (std::size_t i = 0; i < body["messages"].size(); ++i) {
    const json& m = body["messages"][i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad(where + " needs a string 'role'", where + ".role");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      throw bad(fmt::format("{}.role '{}' is not supported (system, developer, user, assistant)",
                            where, role),
                where + ".role");
    std::string content;
    const json c = m.contains("content") ? m["content"] : json(nullptr);
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", json("")) != "text" || !part.contains("text") ||
            !part["text"].is_string())
          throw bad(where + ".content parts must be {\"type\": \"text\", \"text\": \"...\"}",
                    where + ".content");
        content += part["text"].get<std::string>();
      }
    } else {
      throw bad(where + ".content must be a string or an array of text parts", where + ".content");
    }
    out.push_back({role == "developer" ? "system" : role, std::move(content)});
  }
  return out;
}

bool enable_thinking(const json& body) {
  if (!body.contains("chat_template_kwargs") || body["chat_template_kwargs"].is_null()) return true;
  const json& k = body["chat_template_kwargs"];
  if (!k.is_object()) throw bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
  if (!k.contains("enable_thinking")) return true;
  if (!k["enable_thinking"].is_boolean())
    throw bad("'chat_template_kwargs.enable_thinking' must be a boolean",
              "chat_template_kwargs.enable_thinking");
  return k["enable_thinking"].get<bool>();
}

ReasonedText split_reasoning(const std::string& text) {
  // Only a reply that opens the block has reasoning (a stream cannot know otherwise before
  // "</think>" arrives, and kiln's Qwen3 template lets the model open it).
  const std::string open = "<think>", close = "</think>";
  if (!text.starts_with(open)) return {"", text};
  const std::string t = text.substr(open.size());
  const auto end = t.find(close);
  if (end == std::string::npos) return {trim(t), ""};
  return {trim(t.substr(0, end)), trim(t.substr(end + close.size()))};
}

void ReasoningStream::trimmed(std::string_view s, std::string& out) {
  for (const char c : s) {
    if (kSpace.find(c) != std::string_view::npos) {
      if (started_) space_ += c;
      continue;
    }
    out += space_;
    space_.clear();
    out += c;
    started_ = true;
  }
}

ReasonedText ReasoningStream::push(std::string_view piece) {
  static constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  ReasonedText out;
  held_.append(piece);
  for (;;) {
    switch (state_) {
      case State::Undecided:
        if (held_.size() < kOpen.size() && kOpen.starts_with(held_)) return out;  // may open
        state_ = held_.starts_with(kOpen) ? State::Thinking : State::Plain;
        if (state_ == State::Thinking) held_.erase(0, kOpen.size());
        break;
      case State::Thinking: {
        const std::size_t close = held_.find(kClose);
        if (close != std::string::npos) {
          trimmed(std::string_view(held_).substr(0, close), out.reasoning);
          held_.erase(0, close + kClose.size());
          state_ = State::Answer;
          space_.clear();
          started_ = false;
          break;
        }
        const std::size_t keep = prefix_at_end(held_, kClose);  // may start "</think>"
        trimmed(std::string_view(held_).substr(0, held_.size() - keep), out.reasoning);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      case State::Answer:
        trimmed(held_, out.content);
        held_.clear();
        return out;
      case State::Plain:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

ReasonedText ReasoningStream::flush() {
  ReasonedText out;
  if (state_ == State::Undecided) out.content = held_;           // shorter than "<think>"
  if (state_ == State::Thinking) trimmed(held_, out.reasoning);  // never closed
  held_.clear();
  space_.clear();  // trailing whitespace of the last part
  return out;
}

SamplingParams sampling_from_body(const json& body, bool chat, std::uint64_t default_seed,
                                  std::int64_t default_max_tokens) {
  SamplingParams p;
  p.sampling.temperature = number_in(body, "temperature", 0, 2, 1.0);
  p.sampling.top_p = number_in(body, "top_p", 0, 1, 1.0);
  if (p.sampling.top_p == 0) throw bad("'top_p' must be above 0", "top_p");
  p.sampling.top_k = integer_in(body, "top_k", -1, 1 << 24, 0);
  if (p.sampling.top_k < 0) p.sampling.top_k = 0;  // -1: off, as vLLM and llama.cpp read it
  p.sampling.min_p = number_in(body, "min_p", 0, 1, 0.0);
  p.presence_penalty = number_in(body, "presence_penalty", -2, 2, 0.0);
  p.frequency_penalty = number_in(body, "frequency_penalty", -2, 2, 0.0);
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) throw bad("'seed' must be an integer", "seed");
    p.sampling.seed = body["seed"].get<std::uint64_t>();
  } else {
    p.sampling.seed = default_seed;
  }
  const char* max_key =
      chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  p.max_tokens = integer_in(body, max_key, 1, std::int64_t{1} << 30, default_max_tokens);
  if (chat) {
    const bool want =
        body.contains("logprobs") && !body["logprobs"].is_null() &&
        (body["logprobs"].is_boolean() ? body["logprobs"].get<bool>()
                                       : throw bad("'logprobs' must be a boolean", "logprobs"));
    const auto top = integer_in(body, "top_logprobs", 0, 20, 0);
    if (top > 0 && !want) throw bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    p.top_logprobs = want ? static_cast<int>(top) : -1;
  } else {
    const auto n = integer_in(body, "logprobs", 0, 5, -1);
    p.top_logprobs = static_cast<int>(n);
  }
  const auto n = integer_in(body, "n", 1, 1, 1);
  (void)n;  // one choice per request; n > 1 is refused by the range above
  return p;
}

std::vector<std::string> stop_strings(const json& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const json& s = body["stop"];
  if (s.is_string())
    return s.get<std::string>().empty() ? std::vector<std::string>{}
                                        : std::vector{s.get<std::string>()};
  if (!s.is_array() || s.size() > 4)
    throw bad("'stop' must be a string or an array of at most 4 strings", "stop");
  std::vector<std::string> out;
  for (const json& x : s) {
    if (!x.is_string()) throw bad("'stop' must hold strings", "stop");
    if (!x.get<std::string>().empty()) out.push_back(x.get<std::string>());
  }
  return out;
}

std::string IncrementalDecoder::push(std::int32_t id) {
  ids_.push_back(id);
  const std::span<const std::int32_t> all(ids_);
  const std::string head = tok_.decode(all.subspan(head_, read_ - head_));
  const std::string window = tok_.decode(all.subspan(head_));
  if (window.size() >= head.size() && window.compare(0, head.size(), head) == 0) {
    head_ = read_;
    read_ = ids_.size();
    given_ += window.size() - head.size();
    return window.substr(head.size());
  }
  // Not a prefix-consistent window: the whole text, less what was given.
  const std::string full = tok_.decode(all);
  head_ = read_ = ids_.size();
  if (full.size() <= given_) return "";
  std::string out = full.substr(given_);
  given_ = full.size();
  return out;
}

std::string TextStream::push(std::string_view bytes) {
  if (stopped_) return "";
  pending_.append(bytes);
  std::size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    text_ += out;
    pending_.clear();
    return out;
  }
  std::size_t safe = pending_.size() - incomplete_utf8_tail(pending_);
  // Hold back a tail that may grow into a stop string.
  for (const std::string& s : stops_)
    safe = std::min(safe, pending_.size() - prefix_at_end(pending_, s));
  std::string out = pending_.substr(0, safe);
  pending_.erase(0, safe);
  text_ += out;
  return out;
}

std::string TextStream::flush() {
  if (stopped_) return "";
  std::string out = pending_.substr(0, pending_.size() - incomplete_utf8_tail(pending_));
  pending_.clear();
  text_ += out;
  return out;
}

}  // namespace kiln::serve
