#include "models/sampling.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/node.h"
#include "kernels/common/philox.h"

namespace kiln::models {

std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& o,
                          std::uint64_t draw) {
  KILN_CHECK(!logits.empty(), "[sample] empty logits");
  KILN_CHECK(o.temperature >= 0 && std::isfinite(o.temperature),
             "[sample] temperature {} must be >= 0", o.temperature);
  KILN_CHECK(o.top_k >= 0, "[sample] top_k {} must be >= 0", o.top_k);
  KILN_CHECK(o.top_p > 0 && o.top_p <= 1, "[sample] top_p {} must be in (0, 1]", o.top_p);
  KILN_CHECK(o.min_p >= 0 && o.min_p <= 1, "[sample] min_p {} must be in [0, 1]", o.min_p);
  auto V = static_cast<std::int64_t>(logits.size());
  if (o.temperature == 0.0) {  // first maximum, as argmax in run.c and torch
    // Refused like sampling refuses: NaN logits have no maximum, and argmax would quietly emit
    // token 0 for a model whose numbers have gone bad.
    auto it = std::max_element(logits.begin(), logits.end());
    const bool has_nan =
        std::any_of(logits.begin(), logits.end(), [](float x) { return std::isnan(x); });
    KILN_CHECK(!has_nan && std::isfinite(*it),
               "[sample] greedy decoding: the logits are not finite (max {}{}); the model's "
               "weights or inputs produce NaN/inf",
               *it, has_nan ? ", NaN present" : "");
    return static_cast<std::int32_t>(it - logits.begin());
  }
  std::vector<std::int32_t> idx(static_cast<std::size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  // Candidates sorted by logit, highest first (ties: lower id first).
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(static_cast<std::size_t>(k));
  double mx = logits[idx[0]];
  KILN_CHECK(std::isfinite(mx), "[sample] no finite logit to sample from (max {})", mx);
  std::vector<double> p(idx.size());
  double sum = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) {
    p[i] = std::exp((logits[idx[i]] - mx) / o.temperature);  // -inf -> 0
    sum += p[i];
  }
  for (auto& x : p) x /= sum;
  std::size_t keep = p.size();
  if (o.top_p < 1.0) {  // smallest prefix whose mass reaches top_p
    double cum = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (o.min_p > 0.0) {  // relative to the most likely token, so renormalising first changes nothing
    double floor = o.min_p * p[0];
    std::size_t n = 0;
    while (n < keep && p[n] >= floor) ++n;
    keep = std::max<std::size_t>(n, 1);
  }
  while (keep > 1 && p[keep - 1] == 0.0) --keep;  // masked (-inf) or underflowed ids
  p.resize(keep);
  double s = std::accumulate(p.begin(), p.end(), 0.0);
  Philox4 r = philox_block(o.seed, draw);
  // 53 random bits -> u in [0, 1), scaled to the kept mass.
  double u = (static_cast<double>(r.v[0] >> 11) * 0x1p-21 + static_cast<double>(r.v[1])) * 0x1p-32;
  u *= s;
  double cum = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    cum += p[i];
    if (u < cum) return idx[i];
  }
  return idx[p.size() - 1];
}

void apply_repetition_penalty(std::span<float> logits, std::span<const std::int32_t> ids,
                              double penalty) {
  KILN_CHECK(penalty > 0 && std::isfinite(penalty), "[sample] repetition_penalty {} must be > 0",
             penalty);
  if (penalty == 1.0) return;
  std::vector<std::uint8_t> done(logits.size(), 0);
  auto pf = static_cast<float>(penalty);
  for (std::int32_t id : ids) {
    KILN_CHECK(id >= 0 && static_cast<std::size_t>(id) < logits.size(),
               "[sample] token id {} out of range [0, {})", id, logits.size());
    if (done[id]) continue;
    done[id] = 1;
    float& l = logits[id];
    l = l > 0 ? l / pf : l * pf;
  }
}

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eos:
      return "eos";
    case StopReason::MaxNewTokens:
      return "max-new-tokens";
    case StopReason::ContextFull:
      return "context full";
    case StopReason::Callback:
      return "stopped";
  }
  return "?";
}

double GenerationStats::prefill_tokens_per_s() const {
  return prefill_s > 0 ? static_cast<double>(prompt_tokens) / prefill_s : 0.0;
}

double GenerationStats::decode_tokens_per_s() const {
  return decode_s > 0 && new_tokens > 1 ? static_cast<double>(new_tokens - 1) / decode_s : 0.0;
}

GenerationSession::GenerationSession(DecoderModel& model, std::int64_t context)
    : model_(model),
      cache_(model.cfg, 1, context, model.dtype(), model.device()),
      seen_flag_(static_cast<std::size_t>(model.cfg.vocab_size), 0) {}

void GenerationSession::reset() {
  cache_.len = 0;
  tokens_.clear();
  pending_ = false;
  for (auto id : seen_) seen_flag_[id] = 0;
  seen_.clear();
}

std::vector<float> GenerationSession::forward_last(std::span<const std::int32_t> ids) {
  NoGradGuard no_grad;
  std::int64_t T = static_cast<std::int64_t>(ids.size());
  Tensor x;
  {
    MemoryScope in(MemCategory::Inputs);
    // Built on the host, then moved to the model's device: on CUDA (or the meta device that
    // simulates it) a host id tensor would be refused by the embedding as a mixed-device op.
    x = ops::from_vector(std::vector<std::int32_t>(ids.begin(), ids.end()), {1, T})
            .to(model_.device());
  }
  Tensor logits;
  {
    MemoryScope scope(MemCategory::Activations);
    Tensor h = model_.hidden(x, cache_.len, &cache_);
    // Only the last position's logits: (1, 1, V), never (1, T, V).
    Tensor last = h.narrow(1, T - 1, 1);
    MemoryScope lscope(MemCategory::Logits);
    MemLabelScope label("lm_head");
    logits = model_.logits(last);
  }
  return logits.to_float_vector();
}

GenerationStats GenerationSession::generate(std::span<const std::int32_t> ids,
                                            const GenerateOptions& o,
                                            const std::function<bool(std::int32_t)>& on_token) {
  using Clock = std::chrono::steady_clock;
  const std::int64_t V = model_.cfg.vocab_size;
  KILN_CHECK(o.max_new_tokens >= 1, "[generate] max_new_tokens {} must be >= 1", o.max_new_tokens);
  for (auto id : ids)
    KILN_CHECK(id >= 0 && id < V,
               "[generate] token id {} out of range [0, {}) (the model's vocab_size)", id, V);
  std::int64_t feed_n = static_cast<std::int64_t>(ids.size()) + (pending_ ? 1 : 0);
  KILN_CHECK(feed_n > 0, "[generate] empty prompt");
  std::int64_t seq_after = static_cast<std::int64_t>(tokens_.size() + ids.size());
  KILN_CHECK(seq_after < cache_.capacity,
             "[generate] prompt of {} tokens ({} in the sequence with the history) leaves no room "
             "for a new token in the context of {} (max_position_embeddings {})",
             ids.size(), seq_after, cache_.capacity, model_.cfg.max_seq_len);
  // Sampling ids limited to the tokenizer's range.
  std::int64_t limit = o.sample_limit > 0 ? std::min(o.sample_limit, V) : V;
  auto remember = [&](std::int32_t id) {
    tokens_.push_back(id);
    if (!seen_flag_[id]) {
      seen_flag_[id] = 1;
      seen_.push_back(id);
    }
  };
  std::vector<std::int32_t> feed;
  if (pending_) feed.push_back(tokens_.back());
  for (auto id : ids) {
    feed.push_back(id);
    remember(id);
  }
  pending_ = false;

  GenerationStats st;
  st.prompt_tokens = feed_n;
  auto t0 = Clock::now();
  auto t_first = t0;
  for (std::int64_t i = 0;; ++i) {
    std::vector<float> row;
    {
      PhaseScope phase(i == 0 ? Phase::Prefill : Phase::Decode);
      row = forward_last(feed);
    }
    for (std::int64_t v = limit; v < V; ++v) row[v] = -std::numeric_limits<float>::infinity();
    apply_repetition_penalty(row, seen_, o.sampling.repetition_penalty);
    std::int32_t next = sample_token(row, o.sampling, draws_++);
    remember(next);
    pending_ = true;
    ++st.new_tokens;
    if (i == 0) t_first = Clock::now();
    bool go = on_token(next);
    if (std::find(o.eos_ids.begin(), o.eos_ids.end(), next) != o.eos_ids.end()) {
      st.stop = StopReason::Eos;
      break;
    }
    if (!go) {
      st.stop = StopReason::Callback;
      break;
    }
    if (st.new_tokens >= o.max_new_tokens) {
      st.stop = StopReason::MaxNewTokens;
      break;
    }
    if (static_cast<std::int64_t>(tokens_.size()) >= cache_.capacity) {
      st.stop = StopReason::ContextFull;
      break;
    }
    feed.assign(1, next);
    pending_ = false;
  }
  auto t1 = Clock::now();
  st.prefill_s = std::chrono::duration<double>(t_first - t0).count();
  st.decode_s = std::chrono::duration<double>(t1 - t_first).count();
  return st;
}

std::vector<std::int32_t> generate_tokens(DecoderModel& model,
                                          const std::vector<std::int32_t>& prompt,
                                          std::int64_t max_new, const SamplingOptions& o,
                                          const std::function<bool(std::int32_t)>& on_token) {
  KILN_CHECK(!prompt.empty(), "[generate] empty prompt");
  std::int64_t ctx = model.cfg.max_seq_len;
  auto P = static_cast<std::int64_t>(prompt.size());
  KILN_CHECK(P < ctx, "[generate] prompt of {} tokens does not fit the context of {}", P, ctx);
  std::vector<std::int32_t> out;
  if (max_new <= 0) return out;
  // P + min(...): no overflow for any max_new (INT64_MAX means "until the context is full").
  GenerationSession s(model, P + std::min(max_new, ctx - P));
  GenerateOptions g;
  g.sampling = o;
  g.max_new_tokens = max_new;
  s.generate(prompt, g, [&](std::int32_t id) {
    out.push_back(id);
    return on_token(id);
  });
  return out;
}

}  // namespace kiln::models
