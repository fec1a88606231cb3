#include "serve/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "models/sampling.h"
#include "serve/batch_forward.h"
#include "serve/serve_budget.h"
#include "tensor/ops.h"

namespace kiln::serve {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::None:
      break;
  }
  return "none";
}

bool Request::next(TokenEvent& out) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty() || finish_ != FinishReason::None; });
  if (events_.empty()) return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

FinishReason Request::finish() const {
  std::lock_guard lock(mu_);
  return finish_;
}

void Request::push(TokenEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

void Request::close(FinishReason r) {
  {
    std::lock_guard lock(mu_);
    finish_ = r;
  }
  cv_.notify_all();
}

struct Engine::Sequence {
  std::shared_ptr<Request> req;
  std::vector<std::int32_t> blocks;  // reserved at admission for prompt + max_tokens
  std::vector<std::int32_t> tokens;  // prompt, then every sampled token
  std::int64_t cached = 0;           // positions whose keys and values are in the pool
  std::int64_t generated = 0;        // sampled tokens (the random-number counter)
  std::int64_t published = 0;        // leading full blocks offered to the prefix cache
  std::unordered_map<std::int32_t, std::int64_t> counts;  // generated ids, for the penalties
};

namespace {

// The pool's shape follows the serving budget's rules (ServeBudgetSpec::resolved): one set of
// checks and defaults for the budget and the engine that the budget describes.
EngineOptions resolved(EngineOptions o, const models::DecoderModel& m) {
  ServeBudgetSpec shape;
  shape.cfg = m.cfg;
  shape.seqs = o.max_seqs;
  shape.context = o.context;
  shape.block_size = o.block_size;
  shape.num_blocks = o.num_blocks;
  shape.max_batch_tokens = o.max_batch_tokens;
  shape = shape.resolved();
  o.context = shape.context;
  o.num_blocks = shape.num_blocks;
  KILN_CHECK(o.prefill_chunk > 0, "[serve] prefill_chunk must be positive");
  KILN_CHECK(o.max_queue >= 0, "[serve] max_queue must not be negative");
  return o;
}

// OpenAI's penalties: logit -= frequency * count + presence * (count > 0), for generated ids.
void apply_penalties(std::vector<float>& logits, const SamplingParams& p,
                     const std::unordered_map<std::int32_t, std::int64_t>& counts) {
  if (p.presence_penalty == 0 && p.frequency_penalty == 0) return;
  for (const auto& [id, n] : counts)
    logits[id] -=
        static_cast<float>(p.frequency_penalty * static_cast<double>(n) + p.presence_penalty);
}

// log softmax of the logits at `id`, and the n most likely ids with theirs.
void fill_logprobs(const std::vector<float>& logits, int n, TokenEvent& e) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float x : logits) z += std::exp(static_cast<double>(x) - m);
  const double lz = m + std::log(z);
  e.logprob = static_cast<float>(logits[e.id] - lz);
  if (n <= 0) return;
  std::vector<std::int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(n), idx.size());
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  for (std::size_t i = 0; i < k; ++i)
    e.top.emplace_back(idx[i], static_cast<float>(logits[idx[i]] - lz));
}

}  // namespace

Engine::Engine(const models::DecoderModel& model, EngineOptions o)
    : model_(model),
      opt_(resolved(o, model)),
      pool_(model.cfg, opt_.num_blocks, opt_.block_size, model.dtype(), model.device()) {
  metrics_.blocks_free = pool_.free_blocks();
}

Engine::~Engine() {
  {
    std::lock_guard lock(mu_);
    for (auto& s : running_) s->req->cancel();
    for (auto& r : queue_) r->cancel();
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& s : running_) s->req->close(FinishReason::Cancelled);
  for (auto& r : queue_) r->close(FinishReason::Cancelled);
}

std::shared_ptr<Request> Engine::submit(std::vector<std::int32_t> prompt, SamplingParams p) {
  const std::int64_t V = model_.cfg.vocab_size;
  KILN_CHECK(!prompt.empty(), "[serve] the prompt is empty");
  for (std::int32_t id : prompt)
    KILN_CHECK(id >= 0 && id < V, "[serve] token id {} outside [0, {})", id, V);
  const auto n = static_cast<std::int64_t>(prompt.size());
  KILN_CHECK(n < opt_.context,
             "[serve] the prompt has {} tokens; the context is {} (room for at least one more is "
             "needed)",
             n, opt_.context);
  KILN_CHECK(p.max_tokens >= 1, "[serve] max_tokens must be at least 1, got {}", p.max_tokens);
  p.max_tokens = std::min(p.max_tokens, opt_.context - n);
  KILN_CHECK(pool_.blocks_for(n + p.max_tokens) <= pool_.num_blocks(),
             "[serve] prompt {} + max_tokens {} needs {} KV blocks; the pool has {}", n,
             p.max_tokens, pool_.blocks_for(n + p.max_tokens), pool_.num_blocks());
  auto req = std::make_shared<Request>(std::move(prompt), std::move(p));
  {
    std::lock_guard lock(mu_);
    if (static_cast<std::int64_t>(queue_.size()) >= opt_.max_queue)
      throw QueueFull(fmt::format("[serve] {} requests are waiting (--max-queue); try again later",
                                  queue_.size()));
    queue_.push_back(req);
    ++metrics_.requests;
    metrics_.prompt_tokens += n;
    metrics_.queued = static_cast<std::int64_t>(queue_.size());
  }
  cv_.notify_all();
  return req;
}

void Engine::finish(Sequence& s, FinishReason r) {
  pool_.release(s.blocks);
  s.blocks.clear();
  s.req->close(r);
}

void Engine::admit_locked() {
  while (!queue_.empty() && static_cast<std::int64_t>(running_.size()) < opt_.max_seqs) {
    std::shared_ptr<Request> req = queue_.front();
    if (req->cancelled()) {
      queue_.pop_front();
      req->close(FinishReason::Cancelled);
      continue;
    }
    const auto n = static_cast<std::int64_t>(req->prompt.size());
    // Reuse whole cached blocks of the prompt, but never its last token: its logits are needed.
    std::vector<std::int32_t> shared = pool_.match_prefix(req->prompt, (n - 1) / opt_.block_size);
    const std::int64_t need =
        pool_.blocks_for(n + req->params.max_tokens) - static_cast<std::int64_t>(shared.size());
    std::vector<std::int32_t> blocks = pool_.allocate(need);
    if (blocks.empty()) {  // first come, first served: wait for blocks to free
      pool_.release(shared);
      break;
    }
    queue_.pop_front();
    auto s = std::make_unique<Sequence>();
    s->req = std::move(req);
    s->cached = static_cast<std::int64_t>(shared.size()) * opt_.block_size;
    s->published = static_cast<std::int64_t>(shared.size());
    metrics_.prefix_hit_tokens += s->cached;
    s->blocks = std::move(shared);
    s->blocks.insert(s->blocks.end(), blocks.begin(), blocks.end());
    s->tokens = s->req->prompt;
    running_.push_back(std::move(s));
  }
}

bool Engine::step() {
  {
    std::lock_guard lock(mu_);
    // 1. cancelled sequences leave; 2. the queue joins.
    for (auto& s : running_)
      if (s->req->cancelled()) finish(*s, FinishReason::Cancelled);
    std::erase_if(running_, [](const auto& s) { return s->blocks.empty(); });
    admit_locked();
    metrics_.queued = static_cast<std::int64_t>(queue_.size());
  }
  if (running_.empty()) {
    std::lock_guard lock(mu_);
    metrics_.running = 0;
    metrics_.blocks_used = pool_.used_blocks();
    metrics_.blocks_free = pool_.free_blocks();
    metrics_.blocks_cached = pool_.evictable_blocks();
    return false;
  }
  // 3. the rows: every decode token first, then prompt chunks while the budget lasts.
  const auto S = static_cast<std::int64_t>(running_.size());
  const std::int64_t max_blocks = pool_.blocks_for(opt_.context);
  BatchRows rows;
  rows.tables = ops::zeros({S, max_blocks}, DType::I32);
  std::int32_t* tb = rows.tables.data<std::int32_t>();
  std::vector<std::int64_t> added(static_cast<std::size_t>(S), 0);
  std::vector<std::int64_t> logits_of;  // sequence of each logits row
  for (std::int64_t i = 0; i < S; ++i)
    std::copy(running_[i]->blocks.begin(), running_[i]->blocks.end(), tb + i * max_blocks);
  std::int64_t budget = opt_.max_batch_tokens;
  auto add_rows = [&](std::int64_t i, std::int64_t n) {
    Sequence& s = *running_[i];
    for (std::int64_t j = 0; j < n; ++j) {
      rows.tokens.push_back(s.tokens[s.cached + j]);
      rows.seq.push_back(static_cast<std::int32_t>(i));
      rows.pos.push_back(static_cast<std::int32_t>(s.cached + j));
    }
    added[i] = n;
    budget -= n;
    if (s.cached + n == static_cast<std::int64_t>(s.tokens.size())) {
      rows.logits_rows.push_back(static_cast<std::int64_t>(rows.tokens.size()) - 1);
      logits_of.push_back(i);
    }
  };
  const auto prompt_len = [&](std::int64_t i) {
    return static_cast<std::int64_t>(running_[i]->req->prompt.size());
  };
  for (std::int64_t i = 0; i < S; ++i)
    if (running_[i]->cached >= prompt_len(i)) add_rows(i, 1);
  for (std::int64_t i = 0; i < S && budget > 0; ++i) {
    const Sequence& s = *running_[i];
    if (s.cached >= prompt_len(i)) continue;
    add_rows(i, std::min({opt_.prefill_chunk, prompt_len(i) - s.cached, budget}));
  }
  const Tensor logits = forward_rows(model_, pool_, rows);
  // 4. sampling, per sequence, from its own (seed, counter).
  const std::int64_t V = logits.size(1);
  std::int64_t new_tokens = 0;
  for (std::int64_t i = 0; i < S; ++i) {
    Sequence& s = *running_[i];
    s.cached += added[i];
    // Every block now full of computed positions joins the prefix cache.
    for (; (s.published + 1) * opt_.block_size <= s.cached; ++s.published) {
      const std::int64_t b = s.published;
      pool_.publish(b > 0 ? s.blocks[b - 1] : -1, s.tokens.data() + b * opt_.block_size,
                    s.blocks[b]);
    }
  }
  for (std::size_t r = 0; r < logits_of.size(); ++r) {
    Sequence& s = *running_[logits_of[r]];
    const SamplingParams& p = s.req->params;
    // Only the first sample_limit ids are candidates (as GenerationSession limits them).
    const float* row = logits.data<float>() + static_cast<std::int64_t>(r) * V;
    std::vector<float> l(row, row + (p.sample_limit > 0 ? std::min(p.sample_limit, V) : V));
    apply_penalties(l, p, s.counts);
    TokenEvent e;
    e.id = models::sample_token(l, p.sampling, static_cast<std::uint64_t>(s.generated));
    if (p.top_logprobs >= 0) fill_logprobs(l, p.top_logprobs, e);
    ++s.generated;
    ++s.counts[e.id];
    s.tokens.push_back(e.id);
    ++new_tokens;
    const bool stop = std::find(p.stop_ids.begin(), p.stop_ids.end(), e.id) != p.stop_ids.end();
    s.req->push(std::move(e));
    if (stop)
      finish(s, FinishReason::Stop);
    else if (s.generated >= p.max_tokens)
      finish(s, FinishReason::Length);
  }
  std::lock_guard lock(mu_);
  std::erase_if(running_, [](const auto& s) { return s->blocks.empty(); });
  metrics_.generated_tokens += new_tokens;
  ++metrics_.iterations;
  metrics_.running = static_cast<std::int64_t>(running_.size());
  metrics_.blocks_used = pool_.used_blocks();
  metrics_.blocks_free = pool_.free_blocks();
  metrics_.blocks_cached = pool_.evictable_blocks();
  return true;
}

void Engine::start() {
  thread_ = std::thread([this] {
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !running_.empty(); });
        if (stop_ && queue_.empty() && running_.empty()) return;
      }
      try {
        step();
      } catch (const std::exception& e) {
        // A failed forward ends the requests it served, never the server.
        fmt::print(stderr, "kiln serve: iteration failed: {}\n", e.what());
        std::lock_guard lock(mu_);
        for (auto& s : running_) finish(*s, FinishReason::Cancelled);
        running_.clear();
      }
    }
  });
}

void Engine::drain_and_stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lock(mu_);
  return metrics_;
}

}  // namespace kiln::serve
