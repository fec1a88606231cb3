// The serving engine: continuous batching over the paged KV pool.
//
// Requests wait in a bounded queue. Each iteration (step()):
//   1. cancelled sequences leave and their blocks go back to the pool at once;
//   2. queued requests join while a sequence slot is free and the pool can hold their prompt plus
//      max_tokens (blocks are reserved at admission, so a running sequence never runs out); the
//      longest run of whole prompt blocks already in the prefix cache is reused, not recomputed;
//   3. one forward (serve/batch_forward.h) runs the decode token of every running sequence plus
//      prompt chunks of the prefilling ones, up to max_batch_tokens rows, so a long prompt is
//      spread over iterations and never stalls the streams;
//   4. every sequence whose row produced logits samples its next token, which goes to its
//      request's event queue; a finished sequence leaves and frees its blocks.
// A token depends only on its own request (prompt, sampling parameters, seed): the forward is
// batch-invariant and each request draws its random numbers from its own (seed, counter).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "models/decoder.h"
#include "models/sampling.h"
#include "serve/kv_pool.h"

namespace kiln::serve {

struct SamplingParams {
  // temperature, top_k, top_p, min_p and the seed, as kiln generate samples them (its repetition
  // penalty is not OpenAI's and stays at 1).
  models::SamplingOptions sampling;
  double presence_penalty = 0, frequency_penalty = 0;  // OpenAI's, on the logits
  std::int64_t max_tokens = 16;
  std::vector<std::int32_t> stop_ids;  // EOS and the like: generation ends after sampling one
  int top_logprobs = -1;               // -1: no logprobs; 0..20: the chosen token's and n more
  // > 0: ids >= sample_limit are never sampled nor listed (a tokenizer with fewer ids than the
  // model's padded vocabulary cannot print them).
  std::int64_t sample_limit = 0;
};

struct TokenEvent {
  std::int32_t id = 0;
  float logprob = 0;                                // log p(id), when logprobs were asked
  std::vector<std::pair<std::int32_t, float>> top;  // the top_logprobs most likely, best first
};

enum class FinishReason { None, Stop, Length, Cancelled };
std::string_view finish_reason_name(FinishReason r);

// One request's channel between the engine thread and its client.
class Request {
 public:
  Request(std::vector<std::int32_t> prompt, SamplingParams p)
      : prompt(std::move(prompt)), params(std::move(p)) {}
  const std::vector<std::int32_t> prompt;
  const SamplingParams params;

  // Client side: waits for the next token (true) or the end (false, finish() says why).
  bool next(TokenEvent& out);
  // Client side: stop generating; the engine frees the blocks at its next iteration.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  FinishReason finish() const;

  // Engine side.
  void push(TokenEvent e);
  void close(FinishReason r);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  FinishReason finish_ = FinishReason::None;
  std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
  std::int64_t max_seqs = 8;            // sequences decoding at once
  std::int64_t context = 0;             // per sequence (0: the model's max_seq_len)
  std::int64_t block_size = 16;         // KV positions per block
  std::int64_t num_blocks = 0;          // pool size (0: max_seqs full contexts)
  std::int64_t max_batch_tokens = 256;  // rows per forward
  std::int64_t prefill_chunk = 64;      // prompt rows a sequence adds per iteration, at most
  std::int64_t max_queue = 64;          // waiting requests; more are refused (QueueFull)
};

struct EngineMetrics {
  std::int64_t requests = 0, prompt_tokens = 0, generated_tokens = 0;
  std::int64_t running = 0, queued = 0, blocks_used = 0, blocks_free = 0, iterations = 0;
  std::int64_t blocks_cached = 0;      // held only by the prefix cache (reusable, evictable)
  std::int64_t prefix_hit_tokens = 0;  // prompt tokens taken from the prefix cache
};

// Thrown by submit() when the queue is full (HTTP 429).
struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  Engine(const models::DecoderModel& model, EngineOptions o);
  ~Engine();

  // Checks the request (ids in range, a prompt, room in the context: kiln::Error, HTTP 400) and
  // queues it (QueueFull when max_queue are waiting).
  std::shared_ptr<Request> submit(std::vector<std::int32_t> prompt, SamplingParams p);

  // One iteration; false when there was nothing to do. Tests call it directly; start() runs it
  // on a thread.
  bool step();
  void start();
  // Cancels nothing: waits until every queued and running request has finished, then stops the
  // thread (SIGTERM's drain).
  void drain_and_stop();

  EngineMetrics metrics() const;
  const EngineOptions& options() const { return opt_; }
  const KvPool& pool() const { return pool_; }

 private:
  struct Sequence;
  void admit_locked();
  void finish(Sequence& s, FinishReason r);

  const models::DecoderModel& model_;
  EngineOptions opt_;
  KvPool pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::vector<std::unique_ptr<Sequence>> running_;
  EngineMetrics metrics_;
  std::thread thread_;
  bool stop_ = false;
};

}  // namespace kiln::serve
