#include "models/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/node.h"
#include "kernels/common/philox.h"

namespace kiln::models {

std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& o,
                          std::uint64_t draw) {
  KILN_CHECK(!logits.empty(), "[sample] empty logits");
  KILN_CHECK(o.temperature >= 0, "[sample] temperature {} must be >= 0", o.temperature);
  KILN_CHECK(o.top_p > 0 && o.top_p <= 1, "[sample] top_p {} must be in (0, 1]", o.top_p);
  auto V = static_cast<std::int64_t>(logits.size());
  if (o.temperature == 0.0)
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<std::int32_t> idx(static_cast<std::size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  // Candidates sorted by logit, highest first (ties: lower id first).
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(static_cast<std::size_t>(k));
  std::vector<double> p(idx.size());
  double mx = logits[idx[0]], sum = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) {
    p[i] = std::exp((logits[idx[i]] - mx) / o.temperature);
    sum += p[i];
  }
  for (auto& x : p) x /= sum;
  if (o.top_p < 1.0) {
    double cum = 0;
    std::size_t keep = p.size();
    for (std::size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
    p.resize(keep);
    double s = std::accumulate(p.begin(), p.end(), 0.0);
    for (auto& x : p) x /= s;
  }
  Philox4 r = philox_block(o.seed, draw);
  double u = (static_cast<double>(r.v[0] >> 11) * 0x1p-21 + static_cast<double>(r.v[1])) * 0x1p-32;
  double cum = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    cum += p[i];
    if (u < cum) return idx[i];
  }
  return idx[p.size() - 1];
}

std::vector<std::int32_t> generate_tokens(DecoderModel& model,
                                          const std::vector<std::int32_t>& prompt,
                                          std::int64_t max_new, const SamplingOptions& o,
                                          const std::function<bool(std::int32_t)>& on_token) {
  KILN_CHECK(!prompt.empty(), "[generate] empty prompt");
  std::int64_t ctx = model.cfg.max_seq_len;
  KILN_CHECK(static_cast<std::int64_t>(prompt.size()) < ctx,
             "[generate] prompt of {} tokens does not fit the context of {}", prompt.size(), ctx);
  for (auto id : prompt)
    KILN_CHECK(id >= 0 && id < model.cfg.vocab_size, "[generate] token id {} out of range [0, {})",
               id, model.cfg.vocab_size);
  NoGradGuard no_grad;
  DType dt = model.lm_head_weight().dtype();
  Device dev = model.lm_head_weight().device();
  std::int64_t total = std::min<std::int64_t>(ctx, static_cast<std::int64_t>(prompt.size()) + max_new);
  KVCache cache(model.cfg, 1, total, dt, dev);
  std::vector<std::int32_t> out;
  Tensor ids = ops::from_vector(prompt, {1, static_cast<std::int64_t>(prompt.size())});
  std::int64_t pos = 0;
  for (std::int64_t i = 0; i < max_new && pos + ids.size(1) <= total; ++i) {
    Tensor logits;
    {
      PhaseScope phase(i == 0 ? Phase::Prefill : Phase::Decode);
      MemoryScope scope(MemCategory::Activations);
      Tensor h = model.hidden(ids, pos, &cache);
      Tensor last = h.narrow(1, h.size(1) - 1, 1);
      logits = ops::linear(last, model.lm_head_weight(), Tensor());
    }
    pos += ids.size(1);
    std::vector<float> row = logits.to_float_vector();
    std::int32_t next = sample_token(row, o, static_cast<std::uint64_t>(i));
    out.push_back(next);
    if (!on_token(next)) break;
    ids = ops::from_vector(std::vector<std::int32_t>{next}, {1, 1});
  }
  return out;
}

}  // namespace kiln::models
