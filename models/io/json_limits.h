// JSON from files and requests kiln does not control, parsed with bounds. nlohmann's DOM is built
// and copied and dumped by recursion, so a file of a million nested "[" (in a key nobody reads)
// would end the process with a stack overflow; here such text is refused while it is parsed,
// before any deep value exists, and every message names where the text came from.
#pragma once

#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace kiln::io {

struct JsonLimits {
  std::size_t max_bytes = 64u << 20;  // text longer than this is refused before parsing
  int max_depth = 64;                 // nesting of arrays/objects deeper than this is refused
};

// Parses `text` as JSON within `limits`. `what` names the source in every error ("config.json at
// /path", "request body"). Throws kiln::Error with a message starting "[json] <what>: ": too
// large (both sizes given), nested deeper than max_depth (refused on the first array or object
// past it), or not valid JSON (nlohmann's reason and the byte offset).
nlohmann::json parse_json_limited(std::string_view text, std::string_view what,
                                  const JsonLimits& limits = {});

// `v` as JSON text for an error message, cut to max_chars ("..." at the end): a value may be a
// whole object. Never throws on invalid UTF-8 in a string (replaced by U+FFFD).
std::string json_excerpt(const nlohmann::json& v, std::size_t max_chars = 120);

}  // namespace kiln::io
