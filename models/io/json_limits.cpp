#include "models/io/json_limits.h"

#include <nlohmann/json.hpp>
#include <string>

#include "kernels/common/error.h"

namespace kiln::io {

namespace {

// nlohmann's reason without its "[json.exception.parse_error.101] " tag: the message already
// says which file and that it is JSON, and scripts that look for "json.exception" treat it as an
// uncaught library error.
std::string reason(const nlohmann::json::exception& e) {
  std::string s = e.what();
  if (s.starts_with("[json.exception.")) {
    const std::size_t end = s.find("] ");
    if (end != std::string::npos) s.erase(0, end + 2);
  }
  return s;
}

}  // namespace

nlohmann::json parse_json_limited(std::string_view text, std::string_view what,
                                  const JsonLimits& limits) {
  KILN_CHECK(text.size() <= limits.max_bytes, "[json] {}: {} bytes is too large (limit {} bytes)",
             what, text.size(), limits.max_bytes);
  // `depth` is the number of arrays and objects around the one that starts (0 for the outermost),
  // so the new one is at nesting level depth + 1. Throwing here stops the parser before it reads
  // further; returning false would only drop the value and parse the rest of the nesting.
  const nlohmann::json::parser_callback_t bound = [&](int depth,
                                                      nlohmann::json::parse_event_t event,
                                                      nlohmann::json&) {
    using E = nlohmann::json::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= limits.max_depth)
      fail("[json] {}: nested deeper than {} levels of arrays and objects", what, limits.max_depth);
    return true;
  };
  const char* begin = text.empty() ? "" : text.data();  // no null pointer into the adapter
  try {
    return nlohmann::json::parse(begin, begin + text.size(), bound);
  } catch (const nlohmann::json::parse_error& e) {
    fail("[json] {}: invalid JSON at byte {}: {}", what, e.byte, reason(e));
  } catch (const nlohmann::json::exception& e) {
    fail("[json] {}: invalid JSON: {}", what, reason(e));
  }
}

std::string json_excerpt(const nlohmann::json& v, std::size_t max_chars) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
  return s;
}

}  // namespace kiln::io
