// kiln tokenize: text -> token ids, or ids -> text, with a Hugging Face model folder's Qwen
// tokenizer (--model DIR) or any tokenizer spec (--tokenizer byte | llama2c:PATH | qwen:DIR).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "apps/commands.h"
#include "apps/flags.h"
#include "kernels/common/error.h"
#include "models/io/mapped_file.h"
#include "models/io/qwen_tokenizer.h"
#include "models/io/tokenizer.h"

namespace kiln::apps {

namespace {

struct TokenizeOptions {
  std::string model, spec, text, file, decode;
  bool pieces = false, eos = false;
};

// Bytes shown printable: ASCII as is, \n \t \r escaped, other bytes as \xHH.
std::string escape(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\\')
      out += "\\\\";
    else if (c >= 0x20 && c < 0x7f)
      out.push_back(static_cast<char>(c));
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

}  // namespace

Run add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* model = app.add_option("--model", o->model,
                               "Model folder with tokenizer.json, or vocab.json + merges.txt "
                               "[+ tokenizer_config.json]");
  auto* spec =
      app.add_option("--tokenizer", o->spec, "Tokenizer spec: byte, llama2c:PATH, qwen:DIR");
  model->excludes(spec);
  auto* text = app.add_option("--text", o->text, "Text to encode");
  auto* file =
      app.add_option("--file", o->file, "Encode this file's bytes")->check(CLI::ExistingFile);
  auto* dec = app.add_option("--decode", o->decode, "Token ids to decode, e.g. 1,2,3");
  text->excludes(file)->excludes(dec);
  file->excludes(dec);
  app.add_flag("--pieces", o->pieces, "Encode: one line per token, id and its bytes (escaped)");
  app.add_flag("--eos", o->eos, "Encode: append the EOS token");
  return [o, text, file, dec] {
    KILN_CHECK(!o->model.empty() || !o->spec.empty(),
               "[tokenize] give --model DIR or --tokenizer SPEC");
    KILN_CHECK(text->count() + file->count() + dec->count() == 1,
               "[tokenize] give one of --text, --file or --decode");
    std::unique_ptr<io::Tokenizer> tok =
        o->model.empty() ? io::make_tokenizer(o->spec) : io::QwenTokenizer::from_dir(o->model);
    if (dec->count()) {
      std::cout << tok->decode(parse_token_ids(o->decode, "[tokenize] --decode")) << std::flush;
      return 0;
    }
    std::string input = o->text;
    if (file->count()) {
      input = io::read_regular_file(o->file, "tokenize");  // --file /dev/zero: refused
    }
    const std::vector<int32_t> ids = tok->encode(input, tok->bos_id() >= 0, o->eos);
    if (o->pieces) {
      int32_t prev = -1;
      for (int32_t id : ids) {
        std::cout << fmt::format("{}\t{}\n", id, escape(tok->decode(prev, id)));
        prev = id;
      }
    } else {
      std::cout << fmt::format("{}\n", fmt::join(ids, " "));
    }
    return 0;
  };
}

}  // namespace kiln::apps
