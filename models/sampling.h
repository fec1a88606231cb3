// Next-token sampling and generation with a KV cache.
//
// sample_token: greedy (temperature 0), temperature, top-k, top-p and min-p,
// seeded through Philox so a (seed, draw) pair always gives the same token.
// Order as in HF transformers: repetition penalty on the raw logits, then
// temperature, top-k, top-p (on the top-k renormalised distribution), min-p.
//
// GenerationSession: one sequence with a preallocated KV cache (model dtype,
// MemCategory::KVCache); prefill in one pass, then one token at a time. The
// last sampled token stays pending (not yet in the cache), so a later call
// continues the same sequence: that is how `kiln chat` keeps its cache across
// turns.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
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
  double min_p = 0.0;               // 0: off; keep tokens with p >= min_p * max p
  double repetition_penalty = 1.0;  // 1: off; see apply_repetition_penalty
};

// logits of one position (V). `draw` selects the random number (counter).
// -inf logits (masked ids) are never drawn.
std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& o,
                          std::uint64_t draw);

// CTRL / HF repetition penalty, in place: for every id in `ids` (repeats
// count once) logit /= penalty if logit > 0, else logit *= penalty.
void apply_repetition_penalty(std::span<float> logits, std::span<const std::int32_t> ids,
                              double penalty);

enum class StopReason { Eos, MaxNewTokens, ContextFull, Callback };
std::string_view stop_reason_name(StopReason r);

struct GenerateOptions {
  SamplingOptions sampling;
  std::int64_t max_new_tokens = 256;
  std::vector<std::int32_t> eos_ids;  // stop after sampling one of these
  // > 0: ids >= sample_limit are never sampled (a tokenizer with fewer ids than
  // the model's padded vocabulary cannot print them).
  std::int64_t sample_limit = 0;
};

struct GenerationStats {
  std::int64_t prompt_tokens = 0;  // prefilled by this call (pending token included)
  std::int64_t new_tokens = 0;     // sampled by this call, EOS included
  double prefill_s = 0;            // prefill forward + first sample = time to first token
  double decode_s = 0;             // everything after the first token
  StopReason stop = StopReason::MaxNewTokens;

  double ttft_s() const { return prefill_s; }
  double prefill_tokens_per_s() const;
  // Tokens after the first, over decode_s (the first comes from the prefill).
  double decode_tokens_per_s() const;
};

class GenerationSession {
 public:
  // Preallocates a KV cache of `context` tokens (<= the model's max_seq_len)
  // in the dtype and on the device of the model's LM head.
  GenerationSession(DecoderModel& model, std::int64_t context);

  // Appends the pending token (if any) and `ids` to the sequence, prefills them
  // in one forward pass, then samples up to max_new_tokens, feeding each back
  // one at a time. on_token(id) sees every sampled token (EOS included);
  // returning false stops. The sequence (prompt + generated) never exceeds the
  // context. Throws, before touching the cache, when an id is out of
  // [0, vocab_size) or when the new tokens leave no room for one more.
  GenerationStats generate(std::span<const std::int32_t> ids, const GenerateOptions& o,
                           const std::function<bool(std::int32_t)>& on_token);

  // The whole sequence so far: cached tokens, then the pending one.
  const std::vector<std::int32_t>& tokens() const { return tokens_; }
  std::int64_t context() const { return cache_.capacity; }
  std::int64_t cached() const { return cache_.len; }
  const KVCache& cache() const { return cache_; }
  // Forgets the sequence (keeps the cache's memory).
  void reset();

 private:
  // Logits (V floats) of the last position after feeding ids at the cache's end.
  std::vector<float> forward_last(std::span<const std::int32_t> ids);

  DecoderModel& model_;
  KVCache cache_;
  std::vector<std::int32_t> tokens_;
  bool pending_ = false;            // tokens_.back() is sampled but not yet in the cache
  std::vector<std::int32_t> seen_;  // distinct ids of tokens_, for the repetition penalty
  std::vector<std::uint8_t> seen_flag_;
  std::uint64_t draws_ = 0;  // sampling counter, continues across calls
};

// Generates up to max_new tokens after `prompt` (one session sized for
// prompt + max_new); calls on_token(id) for each new token and stops early
// when it returns false or the context is full.
std::vector<std::int32_t> generate_tokens(DecoderModel& model,
                                          const std::vector<std::int32_t>& prompt,
                                          std::int64_t max_new, const SamplingOptions& o,
                                          const std::function<bool(std::int32_t)>& on_token);

}  // namespace kiln::models
