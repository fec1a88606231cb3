// The serving engine (serve/engine.h): continuous batching over the paged KV pool gives the same
// tokens as the one-sequence GenerationSession, the same tokens and log-probabilities for a
// request alone or among 15 others (batch invariance, f32 and bf16), frees a cancelled request's
// blocks at the next iteration, and refuses bad requests by name.
#include <gtest/gtest.h>

#include <map>

#include "kernels/cpu/quantize.h"
#include "kernels/cuda/runtime.h"
#include "models/sampling.h"
#include "serve/engine.h"
#include "tests/models/tiny_hf.h"

namespace kiln::serve {
namespace {

std::unique_ptr<models::DecoderModel> tiny_model(DType dt) {
  auto m = std::make_unique<models::DecoderModel>(test_hf::tiny_qwen3(false, 96), 1, DType::F32);
  test_hf::init_weights(*m, 7);
  if (dt != DType::F32) m->to(dt);
  return m;
}

struct Output {
  std::vector<std::int32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<std::int32_t, float>>> top;
  FinishReason finish = FinishReason::None;
  bool operator==(const Output&) const = default;
};

Output collect(Request& r) {
  Output o;
  TokenEvent e;
  while (r.next(e)) {
    o.ids.push_back(e.id);
    o.logprobs.push_back(e.logprob);
    o.top.push_back(e.top);
  }
  o.finish = r.finish();
  return o;
}

std::vector<std::int32_t> prompt_of(int i) {
  std::vector<std::int32_t> p;
  for (int j = 0; j < 3 + (i * 7) % 29; ++j) p.push_back((i * 131 + j * 17) % 1000);
  return p;
}

SamplingParams params_of(int i) {
  SamplingParams p;
  p.sampling.temperature = i % 4 == 0 ? 0.0 : 0.9;
  p.sampling.top_k = i % 3 == 0 ? 50 : 0;
  p.sampling.top_p = i % 5 == 0 ? 0.9 : 1.0;
  p.sampling.seed = 1000 + i;
  p.max_tokens = 6 + i % 5;
  p.presence_penalty = i % 2 ? 0.5 : 0.0;
  p.frequency_penalty = i % 3 ? 0.25 : 0.0;
  p.top_logprobs = 3;
  return p;
}

void run_until_idle(Engine& e) {
  while (e.step()) {
  }
}

TEST(ServeEngine, GreedyEqualsTheGenerationSession) {
  auto m = tiny_model(DType::F32);
  const std::vector<std::int32_t> prompt = prompt_of(3);
  std::vector<std::int32_t> ref;
  models::SamplingOptions so;
  so.temperature = 0;
  models::generate_tokens(*m, prompt, 20, so, [&](std::int32_t id) {
    ref.push_back(id);
    return true;
  });
  Engine e(*m, {.max_seqs = 2, .context = 96, .prefill_chunk = 5});
  SamplingParams p;
  p.sampling.temperature = 0;
  p.max_tokens = 20;
  auto r = e.submit(prompt, p);
  run_until_idle(e);
  const Output o = collect(*r);
  EXPECT_EQ(o.ids, ref);
  EXPECT_EQ(o.finish, FinishReason::Length);
  EXPECT_EQ(e.metrics().blocks_used, 0);
}

// Every request alone in its own engine, then all 16 at once with small prefill chunks (so
// prompts, decode rows and sequences mix in every iteration): the same tokens, bit for bit the
// same log-probabilities.
TEST(ServeEngine, SixteenConcurrentRequestsEqualTheirSoloRuns) {
  for (DType dt : {DType::F32, DType::BF16}) {
    auto m = tiny_model(dt);
    std::vector<Output> solo;
    for (int i = 0; i < 16; ++i) {
      Engine e(*m, {.max_seqs = 1, .context = 96});
      auto r = e.submit(prompt_of(i), params_of(i));
      run_until_idle(e);
      solo.push_back(collect(*r));
    }
    Engine e(*m, {.max_seqs = 16, .context = 96, .max_batch_tokens = 24, .prefill_chunk = 3});
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 16; ++i) reqs.push_back(e.submit(prompt_of(i), params_of(i)));
    run_until_idle(e);
    for (int i = 0; i < 16; ++i) {
      const Output o = collect(*reqs[i]);
      EXPECT_EQ(o.ids, solo[i].ids) << dtype_name(dt) << " request " << i;
      EXPECT_EQ(o.logprobs, solo[i].logprobs) << dtype_name(dt) << " request " << i;
      EXPECT_EQ(o.top, solo[i].top) << dtype_name(dt) << " request " << i;
      EXPECT_FALSE(o.ids.empty());
    }
    EXPECT_GT(e.metrics().iterations, 0);
    EXPECT_EQ(e.metrics().blocks_used, 0);
  }
}

// The same with every Linear weight in Q8_0 (the int8 GEMV, tiles of up to 8 rows with no
// padding): a request's tokens and log-probabilities do not depend on its neighbours.
TEST(ServeEngine, QuantizedWeightsKeepTheBatchInvariance) {
  for (DType dt : {DType::F32, DType::BF16}) {
    auto m = tiny_model(DType::F32);
    std::map<std::string, Tensor> blocks;
    for (const auto& [name, lin] : m->linears()) {
      const Tensor w = lin->weight.contiguous();
      Tensor b = Tensor::empty({w.numel() / 32 * 34}, DType::Bool);
      cpu::quantize_blocks(quant::QuantType::Q8_0, w.data<float>(), w.numel(),
                           b.data<std::uint8_t>());
      blocks[name] = b;
    }
    if (dt != DType::F32) m->to(dt);
    for (const auto& [name, lin] : m->linears())
      lin->set_quantized_weight(blocks.at(name), quant::QuantType::Q8_0);
    std::vector<Output> solo;
    for (int i = 0; i < 12; ++i) {
      Engine e(*m, {.max_seqs = 1, .context = 96});
      auto r = e.submit(prompt_of(i), params_of(i));
      run_until_idle(e);
      solo.push_back(collect(*r));
    }
    Engine e(*m, {.max_seqs = 12, .context = 96, .max_batch_tokens = 20, .prefill_chunk = 3});
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 12; ++i) reqs.push_back(e.submit(prompt_of(i), params_of(i)));
    run_until_idle(e);
    for (int i = 0; i < 12; ++i)
      EXPECT_EQ(collect(*reqs[i]), solo[i]) << dtype_name(dt) << " request " << i;
  }
}

TEST(ServeEngine, StopIdsEndTheSequenceAndCancelFreesBlocksAtOnce) {
  auto m = tiny_model(DType::F32);
  Engine e(*m, {.max_seqs = 4, .context = 96, .block_size = 8});
  SamplingParams greedy;
  greedy.sampling.temperature = 0;
  greedy.max_tokens = 10;
  auto first = e.submit(prompt_of(1), greedy);
  run_until_idle(e);
  const Output ref = collect(*first);
  ASSERT_GE(ref.ids.size(), 3u);
  SamplingParams stop = greedy;
  stop.stop_ids = {ref.ids[2]};
  auto stopped = e.submit(prompt_of(1), stop);
  run_until_idle(e);
  const Output o = collect(*stopped);
  EXPECT_EQ(o.finish, FinishReason::Stop);
  EXPECT_EQ(o.ids.back(), ref.ids[2]);

  SamplingParams longp = greedy;
  longp.max_tokens = 60;
  auto r = e.submit(prompt_of(2), longp);
  e.step();
  e.step();
  // prompt 2 has 3 + 14 = 17 tokens, + 60: ceil(77 / 8) = 10 blocks held.
  EXPECT_EQ(e.pool().used_blocks(), 10);
  r->cancel();
  e.step();
  EXPECT_EQ(e.pool().used_blocks(), 0);
  EXPECT_EQ(r->finish(), FinishReason::Cancelled);
}

// A tokenizer with fewer ids than the model's padded vocabulary: ids past it are never sampled
// nor listed among the top log-probabilities.
TEST(ServeEngine, SampleLimitKeepsIdsTheTokenizerCanPrint) {
  auto m = tiny_model(DType::F32);
  Engine e(*m, {.max_seqs = 2, .context = 96});
  SamplingParams p = params_of(1);
  p.max_tokens = 30;
  p.sample_limit = 10;
  p.top_logprobs = 15;  // more than the 10 allowed ids: only 10 come back
  auto r = e.submit(prompt_of(5), p);
  run_until_idle(e);
  const Output o = collect(*r);
  ASSERT_EQ(o.ids.size(), 30u);
  for (std::size_t i = 0; i < o.ids.size(); ++i) {
    EXPECT_LT(o.ids[i], 10);
    EXPECT_EQ(o.top[i].size(), 10u);
    for (const auto& [id, lp] : o.top[i]) EXPECT_LT(id, 10);
  }
}

TEST(ServeEngine, RefusesBadRequestsByName) {
  auto m = tiny_model(DType::F32);
  Engine e(*m, {.max_seqs = 1, .context = 32, .max_queue = 1});
  auto message = [&](std::vector<std::int32_t> prompt, SamplingParams p) {
    try {
      e.submit(std::move(prompt), p);
    } catch (const std::exception& x) {
      return std::string(x.what());
    }
    return std::string("no error");
  };
  SamplingParams p;
  EXPECT_EQ(message({}, p), "[serve] the prompt is empty");
  EXPECT_EQ(message({1, 1000}, p), "[serve] token id 1000 outside [0, 1000)");
  EXPECT_EQ(message(std::vector<std::int32_t>(32, 1), p),
            "[serve] the prompt has 32 tokens; the context is 32 (room for at least one more is "
            "needed)");
  p.max_tokens = 0;
  EXPECT_EQ(message({1}, p), "[serve] max_tokens must be at least 1, got 0");
  p.max_tokens = 4;
  EXPECT_EQ(message({1}, p), "no error");  // queued, not run
  EXPECT_THROW(e.submit({1}, p), QueueFull);
}

// Requests sharing a long system prompt: in one engine, later ones reuse the cached blocks of
// the first, and every output still equals the request's run alone in a fresh engine.
TEST(ServeEngine, PrefixCacheReusesSharedPromptsWithoutChangingOutputs) {
  auto m = tiny_model(DType::F32);
  std::vector<std::int32_t> system;
  for (int j = 0; j < 27; ++j) system.push_back((j * 37 + 11) % 1000);
  auto prompt = [&](int i) {
    std::vector<std::int32_t> p = system;
    for (int j = 0; j <= i; ++j) p.push_back((i * 53 + j) % 1000);
    return p;
  };
  std::vector<Output> solo;
  for (int i = 0; i < 4; ++i) {
    Engine e(*m, {.max_seqs = 1, .context = 96, .block_size = 8});
    auto r = e.submit(prompt(i), params_of(i));
    run_until_idle(e);
    solo.push_back(collect(*r));
  }
  Engine e(*m, {.max_seqs = 4, .context = 96, .block_size = 8});
  auto first = e.submit(prompt(0), params_of(0));
  run_until_idle(e);
  EXPECT_EQ(collect(*first), solo[0]);
  EXPECT_EQ(e.metrics().prefix_hit_tokens, 0);
  EXPECT_GT(e.metrics().blocks_cached, 0);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(e.submit(prompt(i), params_of(i)));
  run_until_idle(e);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(collect(*reqs[i]), solo[i]) << "request " << i;
  // 27 shared tokens = 3 whole blocks of 8 for each of the 4 (request 0's whole prompt, 28
  // tokens, also has only 3: its last token is always computed).
  EXPECT_EQ(e.metrics().prefix_hit_tokens, 4 * 24);
  EXPECT_EQ(e.metrics().blocks_used, 0);
}

// The engine on a GPU: the same model on CUDA (weights copied from the CPU model's) gives the
// CPU engine's greedy tokens and, in f32, its log-probabilities within rounding; the CUDA
// paged attention, the padded 4-row Linear tiles and the row-wise ops keep a request's output
// bit for bit the same alone or among 7 others.
std::unique_ptr<models::DecoderModel> tiny_model_on(Device dev, DType dt) {
  auto m =
      std::make_unique<models::DecoderModel>(test_hf::tiny_qwen3(false, 96), 1, DType::F32, dev);
  test_hf::init_weights(*m, 7);  // randn on the host, copied onto dev: the CPU model's weights
  if (dt != DType::F32) m->to(dt);
  return m;
}

TEST(CudaServe, EngineMatchesTheCpuEngineAndTheGenerationSession) {
  if (cuda::device_count() == 0)
    GTEST_SKIP() << "no CUDA device: the serving engine on CUDA not run";
  auto gpu = tiny_model_on(Device::cuda(0), DType::F32);
  auto cpu = tiny_model_on(Device::cpu(), DType::F32);
  SamplingParams p;
  p.sampling.temperature = 0;
  p.max_tokens = 20;
  p.top_logprobs = 3;
  std::vector<std::int32_t> ref;
  models::generate_tokens(*gpu, prompt_of(3), 20, p.sampling, [&](std::int32_t id) {
    ref.push_back(id);
    return true;
  });
  Output on_gpu, on_cpu;
  for (auto* m : {gpu.get(), cpu.get()}) {
    Engine e(*m, {.max_seqs = 2, .context = 96, .prefill_chunk = 5});
    auto r = e.submit(prompt_of(3), p);
    run_until_idle(e);
    (m == gpu.get() ? on_gpu : on_cpu) = collect(*r);
    EXPECT_EQ(e.metrics().blocks_used, 0);
  }
  EXPECT_EQ(on_gpu.ids, ref);
  EXPECT_EQ(on_gpu.ids, on_cpu.ids);
  ASSERT_EQ(on_gpu.logprobs.size(), on_cpu.logprobs.size());
  for (std::size_t i = 0; i < on_gpu.logprobs.size(); ++i)
    EXPECT_NEAR(on_gpu.logprobs[i], on_cpu.logprobs[i], 1e-3) << "token " << i;
}

TEST(CudaServe, EightConcurrentRequestsEqualTheirSoloRuns) {
  if (cuda::device_count() == 0)
    GTEST_SKIP() << "no CUDA device: the serving engine on CUDA not run";
  for (DType dt : {DType::F32, DType::BF16}) {
    auto m = tiny_model_on(Device::cuda(0), dt);
    std::vector<Output> solo;
    for (int i = 0; i < 8; ++i) {
      Engine e(*m, {.max_seqs = 1, .context = 96});
      auto r = e.submit(prompt_of(i), params_of(i));
      run_until_idle(e);
      solo.push_back(collect(*r));
    }
    Engine e(*m, {.max_seqs = 8, .context = 96, .max_batch_tokens = 24, .prefill_chunk = 3});
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 8; ++i) reqs.push_back(e.submit(prompt_of(i), params_of(i)));
    run_until_idle(e);
    for (int i = 0; i < 8; ++i) {
      const Output o = collect(*reqs[i]);
      EXPECT_FALSE(o.ids.empty());
      EXPECT_EQ(o, solo[i]) << dtype_name(dt) << " request " << i;
    }
    EXPECT_EQ(e.metrics().blocks_used, 0);
  }
}

TEST(ServeKvPool, PublishedBlocksAreMatchedByContentAndEvictedLeastRecentlyUsed) {
  const models::ModelConfig c = test_hf::tiny_qwen3(false);
  KvPool pool(c, 4, 2, DType::F32, Device::cpu());
  const std::vector<std::int32_t> toks = {5, 6, 7, 8, 9};
  std::vector<std::int32_t> a = pool.allocate(3);
  pool.publish(-1, toks.data(), a[0]);
  pool.publish(a[0], toks.data() + 2, a[1]);
  EXPECT_EQ(pool.cached_blocks(), 2);
  // Another prefix with the same first block but a different second.
  const std::vector<std::int32_t> other = {5, 6, 7, 9};
  std::vector<std::int32_t> m = pool.match_prefix(other, 10);
  EXPECT_EQ(m, std::vector<std::int32_t>{a[0]});
  pool.release(m);
  EXPECT_EQ(pool.match_prefix(toks, 1).size(), 1u);  // max_blocks caps it
  pool.release({a[0]});
  pool.release(a);  // the sequence ends: the two published blocks stay, cached
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.evictable_blocks(), 2);
  EXPECT_EQ(pool.free_blocks(), 2);
  m = pool.match_prefix(toks, 10);
  EXPECT_EQ(m, (std::vector<std::int32_t>{a[0], a[1]}));
  pool.release(m);
  // Four blocks wanted: both cached ones are evicted (the oldest first) to make room.
  const std::vector<std::int32_t> all = pool.allocate(4);
  EXPECT_EQ(all.size(), 4u);
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_TRUE(pool.match_prefix(toks, 10).empty());
}

TEST(ServeKvPool, BlocksComeAndGoThroughTheFreeList) {
  const models::ModelConfig c = test_hf::tiny_qwen3(false);
  KvPool pool(c, 5, 16, DType::F32, Device::cpu());
  EXPECT_EQ(kv_block_bytes(c, 16, DType::F32), 2 * 2 * 16 * 2 * 16 * 4);
  EXPECT_EQ(pool.k.size(), 2u);
  EXPECT_EQ(pool.k[0].shape(), Shape({5, 16, 2, 16}));
  const std::vector<std::int32_t> a = pool.allocate(3);
  EXPECT_EQ(a.size(), 3u);
  EXPECT_TRUE(pool.allocate(3).empty());  // only 2 left: nothing taken
  EXPECT_EQ(pool.free_blocks(), 2);
  pool.release(a);
  EXPECT_EQ(pool.free_blocks(), 5);
  EXPECT_THROW(pool.release({a[0]}), std::exception);  // not held any more
  EXPECT_EQ(pool.blocks_for(33), 3);
}

}  // namespace
}  // namespace kiln::serve
