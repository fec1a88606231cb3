// Next-token sampling: greedy (temperature 0), temperature, top-k and top-p,
// seeded through Philox so a (seed, step) pair always gives the same token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "models/decoder.h"

namespace kiln::models {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  std::int64_t top_k = 0;    // 0: off
  double top_p = 1.0;        // 1: off
  std::uint64_t seed = 0;
};

// logits of one position (V). `draw` selects the random number (counter).
std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& o,
                          std::uint64_t draw);

// Generates up to max_new tokens after `prompt` with a KV cache (prefill in
// one pass, then one token at a time); calls on_token(id) for each new token
// and stops early when it returns false or the context is full.
std::vector<std::int32_t> generate_tokens(DecoderModel& model,
                                          const std::vector<std::int32_t>& prompt,
                                          std::int64_t max_new, const SamplingOptions& o,
                                          const std::function<bool(std::int32_t)>& on_token);

}  // namespace kiln::models
