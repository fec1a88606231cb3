// libFuzzer target: an HTTP request body as kiln serve reads it (serve/openai.h): the bounded JSON
// parser, then the chat messages, the template switch, the sampling fields and the stop strings
// of both endpoints, and the text stream over the body's bytes with its stop strings. Every
// refusal must be an HttpError (400) or a kiln::Error, never a crash or another exception.
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
        kiln::serve::TextStream stream(kiln::serve::stop_strings(body));
        for (std::size_t n = 0; n <= text.size(); n += 1 + n / 2)
          (void)stream.update(std::string(text.substr(0, n)));
        (void)stream.flush();
        (void)kiln::serve::split_reasoning(std::string(text));
      } catch (const kiln::serve::HttpError& e) {
        if (e.status != 400) __builtin_trap();
      }
    }
  });
  return 0;
}
