// libFuzzer target: an HTTP request body as kiln serve reads it (serve/openai.h): the bounded JSON
// parser, then the chat messages, the template switch, the sampling fields and the stop strings
// of both endpoints, and the text and reasoning streams over the body's bytes (their outputs must
// add up: the text sent, the whole reply's reasoning split). Every refusal must be an HttpError
// (400) or a kiln::Error, never a crash or another exception.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "models/io/json_limits.h"
#include "serve/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = kiln::fuzz::as_view(data, size);
  kiln::fuzz::expect_clean([&] {
    nlohmann::json body;
    try {
      body = kiln::io::parse_json_limited(text, "request body", {.max_bytes = 1 << 20});
    } catch (const kiln::Error&) {
      return;
    }
    if (!body.is_object()) return;
    for (bool chat : {true, false}) {
      try {
        if (chat) {
          const auto messages = kiln::serve::parse_messages(body);
          (void)kiln::serve::qwen3_chat_prompt(messages, kiln::serve::enable_thinking(body));
        }
        (void)kiln::serve::sampling_from_body(body, chat, 1, 16);
        // The text stream and the reasoning split over the body's bytes in growing pieces: what
        // the stream sends is its text, and the streamed split adds up to the whole one.
        kiln::serve::TextStream stream(kiln::serve::stop_strings(body));
        kiln::serve::ReasoningStream reasoning;
        std::string sent;
        kiln::serve::ReasonedText streamed;
        for (std::size_t at = 0, n = 1; at < text.size(); at += n, n += 1 + n / 2) {
          const std::string_view piece = text.substr(at, n);
          sent += stream.push(piece);
          const kiln::serve::ReasonedText r = reasoning.push(piece);
          streamed.reasoning += r.reasoning;
          streamed.content += r.content;
        }
        sent += stream.flush();
        if (sent != stream.text()) __builtin_trap();
        const kiln::serve::ReasonedText r = reasoning.flush();
        streamed.reasoning += r.reasoning;
        streamed.content += r.content;
        const kiln::serve::ReasonedText whole = kiln::serve::split_reasoning(std::string(text));
        if (streamed.reasoning != whole.reasoning || streamed.content != whole.content)
          __builtin_trap();
      } catch (const kiln::serve::HttpError& e) {
        if (e.status != 400) __builtin_trap();
      }
    }
  });
  return 0;
}
