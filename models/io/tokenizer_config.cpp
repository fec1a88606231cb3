#include "models/io/tokenizer_config.h"

#include <charconv>
#include <nlohmann/json.hpp>

#include "kernels/common/error.h"
#include "models/io/json_limits.h"
#include "models/io/mapped_file.h"

namespace kiln::io {

namespace {

using nlohmann::json;

// The one shape of every type error here: file, field (a path such as
// added_tokens_decoder.151643.special), what was expected, and the JSON type and value found.
[[noreturn]] void wrong_type(const std::string& source, std::string_view field,
                             std::string_view want, const json& v) {
  if (v.is_null()) fail("[tokenizer] {}: field \"{}\" must be {}, got null", source, field, want);
  fail("[tokenizer] {}: field \"{}\" must be {}, got {} {}", source, field, want, v.type_name(),
       json_excerpt(v));
}

// j[key], or nullptr when it is absent or null (HF writes null for "no such token").
const json* member(const json& j, const std::string& key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::optional<bool> opt_flag(const json& j, const std::string& key, const std::string& source,
                             const std::string& field) {
  const json* v = member(j, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(source, field, "true or false", *v);
  return v->get<bool>();
}

// A special token: "<|im_end|>", or the AddedToken form {"content": "<|im_end|>", "lstrip": ...}.
std::optional<std::string> opt_token(const json& j, const std::string& key,
                                     const std::string& source) {
  const json* v = member(j, key);
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  const json* content = v->is_object() ? member(*v, "content") : nullptr;
  if (!content || !content->is_string())
    wrong_type(source, key, "a string or an object with \"content\"", *v);
  return content->get<std::string>();
}

// A Jinja template, or named ones [{"name": "default", "template": "..."}, ...]. kiln's chat
// writes ChatML itself; the check only refuses a file no HF tokenizer would load.
void check_chat_template(const json& j, const std::string& source) {
  const json* t = member(j, "chat_template");
  if (!t || t->is_string()) return;
  const char* want = "a string or a list of {\"name\": string, \"template\": string}";
  if (!t->is_array()) wrong_type(source, "chat_template", want, *t);
  for (const json& e : *t) {
    const json* name = e.is_object() ? member(e, "name") : nullptr;
    const json* text = e.is_object() ? member(e, "template") : nullptr;
    if (!name || !name->is_string() || !text || !text->is_string())
      wrong_type(source, "chat_template", want, *t);
  }
}

// "added_tokens_decoder": {"151643": {"content": "<|endoftext|>", "special": true, ...}, ...}.
std::vector<AddedToken> added_tokens(const json& j, const std::string& source) {
  std::vector<AddedToken> added;
  const json* dec = member(j, "added_tokens_decoder");
  if (!dec) return added;
  if (!dec->is_object())
    wrong_type(source, "added_tokens_decoder", "an object of id: {\"content\": ...}", *dec);
  for (const auto& [key, v] : dec->items()) {
    std::int64_t id = -1;
    auto [p, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    KILN_CHECK(ec == std::errc() && p == key.data() + key.size() && id >= 0 && id < kQwenMaxVocab,
               "[tokenizer] {}: field \"added_tokens_decoder\" key \"{}\" is not a token id in "
               "[0, {})",
               source, key, kQwenMaxVocab);
    const std::string field = "added_tokens_decoder." + key;
    const json* content = v.is_object() ? member(v, "content") : nullptr;
    if (!content || !content->is_string())
      wrong_type(source, field, "an object with a string \"content\"", v);
    const bool special = opt_flag(v, "special", source, field + ".special").value_or(false);
    added.push_back({static_cast<std::int32_t>(id), content->get<std::string>(), special});
  }
  return added;
}

}  // namespace

TokenizerConfig read_tokenizer_config(const std::string& path) {
  const std::string source = "tokenizer_config.json at " + path;
  const std::string text = read_regular_file(path, "tokenizer", JsonLimits{}.max_bytes);
  const json j = parse_json_limited(text, source);
  KILN_CHECK(j.is_object(), "[tokenizer] {}: must be a JSON object, got {} {}", source,
             j.type_name(), json_excerpt(j));
  TokenizerConfig c;
  c.bos_token = opt_token(j, "bos_token", source);
  c.eos_token = opt_token(j, "eos_token", source);
  c.pad_token = opt_token(j, "pad_token", source);
  c.unk_token = opt_token(j, "unk_token", source);
  c.add_bos_token = opt_flag(j, "add_bos_token", source, "add_bos_token");
  c.add_eos_token = opt_flag(j, "add_eos_token", source, "add_eos_token");
  check_chat_template(j, source);
  c.added = added_tokens(j, source);
  return c;
}

}  // namespace kiln::io
