// kiln sample: text from a training checkpoint (models/checkpoint.h).
#include <fmt/format.h>

#include <iostream>

#include "apps/commands.h"
#include "apps/flags.h"
#include "models/checkpoint.h"
#include "models/config.h"
#include "models/data.h"
#include "models/io/tokenizer.h"
#include "models/sampling.h"

namespace kiln::apps {

namespace {

struct SampleOptions {
  std::string ckpt, prompt = "\n";
  double temperature = 0.8, top_p = 1.0;
  std::int64_t top_k = 0, max_new = 500;
  std::uint64_t seed = 1;
};

}  // namespace

Run add_sample_command(CLI::App& app) {
  auto o = std::make_shared<SampleOptions>();
  app.add_option("--ckpt", o->ckpt, "Checkpoint written by kiln train (final.h5 or ckpt.h5)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--prompt", o->prompt, "Text to continue")->capture_default_str();
  app.add_option("--temperature", o->temperature, "0: greedy")
      ->capture_default_str()
      ->check(real_in(0, 1e6));
  app.add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(int_in(0, models::kMaxVocab));
  app.add_option("--top-p", o->top_p, "Nucleus sampling mass (1: off)")
      ->capture_default_str()
      ->check(real_in(0, 1, /*lo_open=*/true));
  app.add_option("--max-new-tokens", o->max_new, "Tokens to generate")
      ->capture_default_str()
      ->check(int_in(1, INT64_MAX));
  app.add_option("--seed", o->seed, "Sampling seed")->capture_default_str()->check(uint64_flag());
  return [o] {
    models::CheckpointMeta meta = models::read_checkpoint_meta(o->ckpt);
    auto tok = models::run_tokenizer(meta.state.tokenizer_spec, meta.state.tokenizer_data, "");
    models::DecoderModel model(meta.config, 0);
    models::load_checkpoint(o->ckpt, model, nullptr);
    model.eval();
    std::vector<std::int32_t> ids = tok->encode(o->prompt, tok->bos_id() >= 0, false);
    KILN_CHECK(!ids.empty(), "[sample] the prompt encodes to no tokens");
    std::cout << o->prompt << std::flush;
    std::int32_t prev = ids.back();
    models::SamplingOptions so{o->temperature, o->top_k, o->top_p, o->seed};
    models::generate_tokens(model, ids, o->max_new, so, [&](std::int32_t id) {
      if (id == tok->eos_id()) return false;
      std::cout << tok->decode(prev, id) << std::flush;
      prev = id;
      return true;
    });
    std::cout << '\n';
    return 0;
  };
}

}  // namespace kiln::apps
