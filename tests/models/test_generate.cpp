// Generation: sampling (temperature / top-k / top-p / min-p against float64
// probabilities, repetition penalty, masking, seeding), generation_config.json,
// GenerationSession (KV cache kept across calls = one prefill of the whole
// sequence, stop reasons, bf16, KV-cache memory), and bad input at the
// model-folder level through models::load_model: each a kiln::Error naming the
// file, tensor or field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "models/generation_config.h"
#include "models/sampling.h"
#include "tests/error_of.h"
#include "tests/test_data.h"
#include "tiny_hf.h"

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::test_hf;

namespace {

using kiln::test::error_of;

// Float64 reference of the sampling distribution: temperature, top-k, top-p, min-p.
std::vector<double> reference_probs(const std::vector<float>& logits,
                                    const models::SamplingOptions& o) {
  std::size_t V = logits.size();
  std::vector<std::size_t> order(V);
  for (std::size_t i = 0; i < V; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  std::size_t k = o.top_k > 0 ? std::min<std::size_t>(o.top_k, V) : V;
  std::vector<double> p(V, 0.0);
  double mx = logits[order[0]], z = 0;
  for (std::size_t r = 0; r < k; ++r) z += std::exp((logits[order[r]] - mx) / o.temperature);
  std::size_t keep = k;
  double cum = 0;
  for (std::size_t r = 0; r < k; ++r) {
    cum += std::exp((logits[order[r]] - mx) / o.temperature) / z;
    if (cum >= o.top_p) {
      keep = r + 1;
      break;
    }
  }
  double s = 0;
  for (std::size_t r = 0; r < keep; ++r) {
    double q = std::exp((logits[order[r]] - mx) / o.temperature);
    if (q < o.min_p) continue;  // relative to the top token, whose q is 1
    p[order[r]] = q;
    s += q;
  }
  for (auto& x : p) x /= s;
  return p;
}

std::vector<double> frequencies(const std::vector<float>& logits, const models::SamplingOptions& o,
                                int n) {
  std::vector<double> f(logits.size(), 0.0);
  for (int d = 0; d < n; ++d)
    f[models::sample_token(logits, o, static_cast<std::uint64_t>(d))] += 1;
  for (auto& x : f) x /= n;
  return f;
}

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_generate_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tiny Qwen3 folder on disk; returns its path.
  fs::path make_folder(const std::string& name, bool tied = false, std::int64_t ctx = 64) {
    models::DecoderModel m(tiny_qwen3(tied, ctx), 11);
    init_weights(m, 12);
    write_hf_folder(m, dir_ / name, {{"eos_token_id", {998, 999}}, {"do_sample", false}});
    return dir_ / name;
  }
  models::LoadedModel load(const fs::path& p, DType dt = DType::F32) {
    models::ModelSource s;
    s.model = p.string();
    s.dtype = dt;
    return models::load_model(s);
  }
  fs::path dir_;
};

std::vector<std::int32_t> run(models::GenerationSession& s, const std::vector<std::int32_t>& ids,
                              const models::GenerateOptions& o,
                              models::GenerationStats* st = nullptr) {
  std::vector<std::int32_t> out;
  auto r = s.generate(ids, o, [&](std::int32_t id) {
    out.push_back(id);
    return true;
  });
  if (st) *st = r;
  return out;
}

models::GenerateOptions greedy(std::int64_t n) {
  models::GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = n;
  return o;
}

// Raw safetensors bytes: u64 header length, header, data.
void write_raw(const fs::path& p, const std::string& header, std::size_t data_bytes,
               std::uint64_t header_len_override = 0) {
  std::ofstream f(p, std::ios::binary);
  std::uint64_t n = header_len_override ? header_len_override : header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  std::string data(data_bytes, '\0');
  f << data;
}

}  // namespace

// ---- sampling -------------------------------------------------------------------------------

TEST(Sampling, FrequenciesMatchFloat64Reference) {
  std::vector<float> logits = {1.0f, 2.5f, -0.5f, 2.0f, 0.3f, 1.7f, -3.0f, 2.2f};
  struct Case {
    double t;
    std::int64_t k;
    double p, min_p;
  };
  for (Case c : {Case{1.0, 0, 1.0, 0.0}, Case{0.7, 4, 1.0, 0.0}, Case{1.3, 0, 0.8, 0.0},
                 Case{1.0, 0, 1.0, 0.3}, Case{0.9, 6, 0.9, 0.2}}) {
    models::SamplingOptions o{c.t, c.k, c.p, /*seed=*/31, c.min_p};
    auto want = reference_probs(logits, o);
    auto got = frequencies(logits, o, 20000);
    for (std::size_t i = 0; i < logits.size(); ++i) {
      if (want[i] == 0.0)
        EXPECT_EQ(got[i], 0.0) << "token " << i << " must be filtered (t " << c.t << " k " << c.k
                               << " p " << c.p << " min_p " << c.min_p << ")";
      else  // 20000 draws: 4 sigma of a binomial is < 0.015
        EXPECT_NEAR(got[i], want[i], 0.015) << "token " << i << " (t " << c.t << " k " << c.k
                                            << " p " << c.p << " min_p " << c.min_p << ")";
    }
  }
}

TEST(Sampling, SeededDrawsRepeatAndSeedsDiffer) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = static_cast<float>(std::sin(i * 1.7));
  models::SamplingOptions a{1.0, 0, 1.0, 5}, b{1.0, 0, 1.0, 6};
  int differ = 0;
  for (std::uint64_t d = 0; d < 64; ++d) {
    EXPECT_EQ(models::sample_token(logits, a, d), models::sample_token(logits, a, d));
    differ += models::sample_token(logits, a, d) != models::sample_token(logits, b, d);
  }
  EXPECT_GT(differ, 32);
}

TEST(Sampling, MaskedIdsAreNeverDrawnAndGreedyIsArgmax) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> logits = {0.5f, 0.1f, ninf, 0.2f, ninf};
  for (std::uint64_t d = 0; d < 2000; ++d) {
    auto t = models::sample_token(logits, {2.0, 0, 1.0, 3}, d);
    EXPECT_TRUE(t != 2 && t != 4) << t;
  }
  EXPECT_EQ(models::sample_token(logits, {0.0, 0, 1.0, 0}, 0), 0);
  std::vector<float> all_masked = {ninf, ninf};
  EXPECT_THROW(models::sample_token(all_masked, {1.0, 0, 1.0, 0}, 0), Error);
  EXPECT_THROW(models::sample_token(logits, {1.0, 0, 1.0, 0, /*min_p=*/1.5}, 0), Error);
  EXPECT_THROW(models::sample_token(logits, {1.0, 0, 0.0, 0}, 0), Error);
}

TEST(Sampling, RepetitionPenaltyMatchesHfRule) {
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
  std::vector<std::int32_t> seen = {0, 1, 1, 4, 0};
  auto got = logits;
  models::apply_repetition_penalty(got, seen, 1.3);
  // Float64 reference: positive logits divided, negative (and zero) multiplied, once per id.
  std::vector<double> want = {2.0 / 1.3, -1.0 * 1.3, 0.5, 3.0, 0.0};
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  EXPECT_THROW(models::apply_repetition_penalty(got, std::vector<std::int32_t>{5}, 1.3), Error);
  EXPECT_THROW(models::apply_repetition_penalty(got, seen, 0.0), Error);
}

// ---- generation_config.json -------------------------------------------------------------------

TEST(GenerationConfig, ParsesIntOrListAndQwenDefaults) {
  auto g = models::parse_generation_config({{"eos_token_id", 7},
                                            {"temperature", 0.5},
                                            {"do_sample", true},
                                            {"min_p", 0.05},
                                            {"repetition_penalty", 1.1},
                                            {"max_new_tokens", 12}},
                                           "g.json");
  EXPECT_EQ(g.eos_token_ids, (std::vector<std::int32_t>{7}));
  EXPECT_EQ(g.max_new_tokens.value_or(0), 12);
  auto s = g.sampling(9);
  EXPECT_EQ(s.temperature, 0.5);
  EXPECT_EQ(s.min_p, 0.05);
  EXPECT_EQ(s.repetition_penalty, 1.1);
  EXPECT_EQ(s.seed, 9u);
  // do_sample false (HF's default) means greedy whatever the temperature.
  EXPECT_EQ(models::parse_generation_config({{"temperature", 0.7}}, "g").sampling(0).temperature,
            0.0);

  std::string real = test_shared_data() + "/qwen/Qwen3-0.6B/generation_config.json";
  ASSERT_TRUE(fs::exists(real)) << real;
  auto q = models::load_generation_config(real);
  EXPECT_EQ(q.eos_token_ids, (std::vector<std::int32_t>{151645, 151643}));
  EXPECT_TRUE(q.do_sample);
  EXPECT_EQ(q.temperature, 0.6);
  EXPECT_EQ(q.top_k, 20);
  EXPECT_EQ(q.top_p, 0.95);
  EXPECT_EQ(q.pad_token_id.value_or(-1), 151643);
}

TEST(GenerationConfig, BadFieldsAreNamed) {
  auto err = [](const nlohmann::json& j) {
    return error_of([&] { models::parse_generation_config(j, "gen.json"); });
  };
  EXPECT_NE(err({{"eos_token_id", "x"}}).find("eos_token_id"), std::string::npos);
  EXPECT_NE(err({{"eos_token_id", {1, -2}}}).find("eos_token_id"), std::string::npos);
  EXPECT_NE(err({{"top_p", 1.5}}).find("top_p"), std::string::npos);
  EXPECT_NE(err({{"top_p", 0}}).find("top_p"), std::string::npos);
  EXPECT_NE(err({{"top_k", -1}}).find("top_k"), std::string::npos);
  EXPECT_NE(err({{"do_sample", 1}}).find("do_sample"), std::string::npos);
  EXPECT_NE(err({{"temperature", "hot"}}).find("temperature"), std::string::npos);
  EXPECT_NE(err(nlohmann::json::array()).find("gen.json"), std::string::npos);
}

// ---- GenerationSession -------------------------------------------------------------------------

TEST_F(GenerateTest, CacheKeptAcrossCallsEqualsOnePrefill) {
  auto lm = load(make_folder("m"));
  models::DecoderModel& m = *lm.model;
  std::vector<std::int32_t> p1 = {5, 17, 300, 42}, p2 = {7, 8, 9};
  models::GenerationSession a(m, 40);
  auto g1 = run(a, p1, greedy(5));
  auto g2 = run(a, p2, greedy(5));
  ASSERT_EQ(g1.size(), 5u);
  // tokens(): prompt, generated (the last one pending), second prompt, generated.
  std::vector<std::int32_t> seq = p1;
  seq.insert(seq.end(), g1.begin(), g1.end());
  seq.insert(seq.end(), p2.begin(), p2.end());
  std::vector<std::int32_t> full = seq;
  full.insert(full.end(), g2.begin(), g2.end());
  EXPECT_EQ(a.tokens(), full);
  EXPECT_EQ(a.cached(), static_cast<std::int64_t>(full.size()) - 1);
  models::GenerationSession b(m, 40);
  EXPECT_EQ(run(b, seq, greedy(5)), g2);  // same tokens from one prefill of the whole sequence
  // After reset, the first call repeats.
  a.reset();
  EXPECT_EQ(run(a, p1, greedy(5)), g1);
}

TEST_F(GenerateTest, StopsAtEosMaxNewContextAndCallback) {
  auto lm = load(make_folder("m"));
  models::DecoderModel& m = *lm.model;
  std::vector<std::int32_t> p = {3, 1, 4, 1, 5};
  models::GenerationSession s0(m, 30);
  auto ref = run(s0, p, greedy(8));
  ASSERT_EQ(ref.size(), 8u);
  models::GenerationStats st;
  {
    models::GenerationSession s(m, 30);
    auto o = greedy(8);
    o.eos_ids = {ref[2]};
    auto got = run(s, p, o, &st);
    auto first = std::find(ref.begin(), ref.end(), ref[2]) - ref.begin();
    EXPECT_EQ(got, std::vector<std::int32_t>(ref.begin(), ref.begin() + first + 1));
    EXPECT_EQ(st.stop, models::StopReason::Eos);
  }
  {
    models::GenerationSession s(m, 30);
    EXPECT_EQ(run(s, p, greedy(3), &st).size(), 3u);
    EXPECT_EQ(st.stop, models::StopReason::MaxNewTokens);
    EXPECT_EQ(st.prompt_tokens, 5);
    EXPECT_EQ(st.new_tokens, 3);
  }
  {
    models::GenerationSession s(m, 8);  // 5 prompt + 3 new fill it
    auto got = run(s, p, greedy(20), &st);
    EXPECT_EQ(got, std::vector<std::int32_t>(ref.begin(), ref.begin() + 3));
    EXPECT_EQ(st.stop, models::StopReason::ContextFull);
    EXPECT_EQ(s.tokens().size(), 8u);
    EXPECT_THROW(run(s, {1}, greedy(1)), Error);  // nothing fits any more
  }
  {
    models::GenerationSession s(m, 30);
    int n = 0;
    st = s.generate(p, greedy(10), [&](std::int32_t) { return ++n < 2; });
    EXPECT_EQ(n, 2);
    EXPECT_EQ(st.stop, models::StopReason::Callback);
  }
}

TEST_F(GenerateTest, SampleLimitMasksHighIds) {
  auto lm = load(make_folder("m"));
  std::vector<std::int32_t> p = {10, 20, 30};
  models::GenerationSession s(*lm.model, 20);
  auto free_run = run(s, p, greedy(6));
  std::int32_t top = *std::max_element(free_run.begin(), free_run.end());
  ASSERT_GT(top, 0);
  models::GenerationSession t(*lm.model, 20);
  auto o = greedy(6);
  o.sample_limit = top;  // the highest id greedy chose is now out of reach
  for (auto id : run(t, p, o)) EXPECT_LT(id, top);
  // Sampled too.
  models::GenerationSession u(*lm.model, 40);
  o.sampling = {1.5, 0, 1.0, 4};
  o.max_new_tokens = 30;
  o.sample_limit = 100;
  for (auto id : run(u, p, o)) EXPECT_LT(id, 100);
}

TEST_F(GenerateTest, SeededSamplingRepeats) {
  auto lm = load(make_folder("m"));
  models::GenerateOptions o;
  o.sampling = {0.9, 50, 0.95, 123, 0.02, 1.2};
  o.max_new_tokens = 12;
  models::GenerationSession a(*lm.model, 20), b(*lm.model, 20);
  EXPECT_EQ(run(a, {1, 2, 3}, o), run(b, {1, 2, 3}, o));
}

TEST_F(GenerateTest, Bf16ModelRunsWithBf16KvCache) {
  fs::path d = make_folder("m");
  auto f32 = load(d);
  auto bf = load(d, DType::BF16);
  EXPECT_EQ(bf.model->lm_head_weight().dtype(), DType::BF16);
  MemoryTracker& tr = MemoryTracker::get(DeviceType::CPU);
  std::int64_t kv0 = tr.stats().current[static_cast<std::size_t>(MemCategory::KVCache)];
  models::GenerationSession s(*bf.model, 24);
  std::int64_t kv1 = tr.stats().current[static_cast<std::size_t>(MemCategory::KVCache)];
  const auto& c = bf.model->cfg;
  EXPECT_EQ(kv1 - kv0, 2 * c.n_layers * 24 * c.kv_dim() * 2);  // K and V, 2 bytes each
  EXPECT_EQ(s.cache().k[0].dtype(), DType::BF16);
  auto toks = run(s, {4, 5, 6, 7}, greedy(8));
  EXPECT_EQ(toks.size(), 8u);
  for (auto id : toks) EXPECT_TRUE(id >= 0 && id < c.vocab_size);
  // bf16 logits track f32 ones to bf16 precision.
  NoGradGuard ng;
  Tensor ids = ops::from_vector(std::vector<std::int32_t>{4, 5, 6, 7}, {1, 4});
  auto a = f32.model->forward(ids).to_double_vector();
  auto b = bf.model->forward(ids).to_double_vector();
  double scale = max_abs(a);
  EXPECT_LT(max_abs_diff(a, b), 0.05 * scale) << "max |logit| " << scale;
}

// An f16 folder with --dtype f16: the weights are used in place from the mapping (no Weights
// bytes allocated for them), the KV cache is f16, and the logits track the f32 model's on the same
// (f16-exact) weights to f16 precision, both through the GEMV (4 tokens) and through the widening
// GEMM (7 tokens). Bound: rounding the logits to f16 alone costs up to 2^-11 (4.9e-4) of the
// largest one; the f16 activations rounded before them (norms, projections, attention, MLP, in
// 2 layers) add a few such units: 6 x 2^-11 = 0.003 of the largest logit (measured: 6.6e-4),
// where a dropped or misread weight is off by O(1).
TEST_F(GenerateTest, F16ModelRunsInPlaceWithF16KvCache) {
  models::DecoderModel src(tiny_qwen3(false, 64), 11);
  init_weights(src, 12);
  write_hf_folder(src, dir_ / "f16", nullptr, DType::F16);
  auto f32 = load(dir_ / "f16");
  MemoryTracker& tr = MemoryTracker::get(DeviceType::CPU);
  const auto weights = [&] {
    return tr.stats().current[static_cast<std::size_t>(MemCategory::Weights)];
  };
  const std::int64_t w0 = weights();
  auto h = load(dir_ / "f16", DType::F16);
  EXPECT_EQ(weights(), w0) << "f16 weights must be used in place from the mapped file";
  EXPECT_EQ(h.model->lm_head_weight().dtype(), DType::F16);
  models::GenerationSession s(*h.model, 24);
  EXPECT_EQ(s.cache().k[0].dtype(), DType::F16);
  auto toks = run(s, {4, 5, 6, 7}, greedy(8));
  EXPECT_EQ(toks.size(), 8u);
  NoGradGuard ng;
  for (const std::vector<std::int32_t>& p :
       {std::vector<std::int32_t>{4, 5, 6, 7}, std::vector<std::int32_t>{4, 5, 6, 7, 8, 9, 10}}) {
    Tensor ids = ops::from_vector(p, {1, static_cast<std::int64_t>(p.size())});
    auto a = f32.model->forward(ids).to_double_vector();
    auto b = h.model->forward(ids).to_double_vector();
    const double scale = max_abs(a);
    EXPECT_LT(max_abs_diff(a, b), 0.003 * scale) << p.size() << " tokens, max |logit| " << scale;
  }
}

// ---- bad input at the model-folder level ----------------------------------------------------

TEST_F(GenerateTest, PromptTooLongAndIdOutOfRangeAreClearErrors) {
  auto lm = load(make_folder("m", false, /*ctx=*/16));
  models::GenerationSession s(*lm.model, 16);
  std::vector<std::int32_t> p(16, 3);
  std::string e = error_of([&] { run(s, p, greedy(1)); });
  EXPECT_NE(e.find("no room"), std::string::npos) << e;
  EXPECT_NE(e.find("16"), std::string::npos) << e;
  e = error_of([&] { run(s, {1, 1000}, greedy(1)); });
  EXPECT_NE(e.find("token id 1000 out of range [0, 1000)"), std::string::npos) << e;
  e = error_of([&] { run(s, {-1}, greedy(1)); });
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  EXPECT_TRUE(s.tokens().empty());  // nothing half-done
  // The model's own guard, and a cache larger than the context.
  EXPECT_THROW(models::GenerationSession(*lm.model, 17), Error);
}

TEST_F(GenerateTest, TruncatedShardNamesTheFile) {
  fs::path d = make_folder("m");
  fs::path shard = d / "model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  std::string e = error_of([&] { load(d); });
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
}

TEST_F(GenerateTest, HeaderLengthPastEndNamesTheFile) {
  fs::path d = make_folder("m");
  fs::path shard = d / "model-00001-of-00002.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    std::uint64_t n = fs::file_size(shard) + 1;
    f.write(reinterpret_cast<const char*>(&n), 8);
  }
  std::string e = error_of([&] { load(d); });
  EXPECT_NE(e.find("model-00001-of-00002.safetensors"), std::string::npos) << e;
}

TEST_F(GenerateTest, OverlappingOffsetsNameTheFile) {
  fs::path d = dir_ / "m";
  fs::create_directories(d);
  write_json(d / "config.json", hf_config_json(tiny_qwen3(false)));
  write_raw(d / "model.safetensors",
            R"({"model.norm.weight":{"dtype":"F32","shape":[64],"data_offsets":[0,256]},)"
            R"("model.embed_tokens.weight":{"dtype":"F32","shape":[2],"data_offsets":[248,256]}})",
            256);
  std::string e = error_of([&] { load(d); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;
}

TEST_F(GenerateTest, UnknownDtypeNamesTheFile) {
  fs::path d = dir_ / "m";
  fs::create_directories(d);
  write_json(d / "config.json", hf_config_json(tiny_qwen3(false)));
  write_raw(d / "model.safetensors",
            R"({"model.norm.weight":{"dtype":"Q4_K","shape":[64],"data_offsets":[0,256]}})", 256);
  std::string e = error_of([&] { load(d); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("Q4_K"), std::string::npos) << e;
}

TEST_F(GenerateTest, MissingTensorAndShapeMismatchAreListed) {
  // Missing: model.norm.weight dropped from the (single-file) checkpoint.
  {
    models::DecoderModel m(tiny_qwen3(false), 1);
    fs::path d = dir_ / "missing";
    fs::create_directories(d);
    write_json(d / "config.json", hf_config_json(m.cfg));
    io::SafetensorsWriter w;
    for (const auto& [name, p] : m.named_parameters())
      if (name != "model.norm.weight") w.add(name, "F32", p.shape(), p.raw_data(), p.nbytes());
    w.write((d / "model.safetensors").string());
    std::string e = error_of([&] { load(d); });
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
    EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
  }
  // Shape mismatch: weights of intermediate_size 96 under a config that says 160.
  {
    models::ModelConfig small = tiny_qwen3(false);
    small.hidden_dim = 96;
    models::DecoderModel m(small, 1);
    fs::path d = dir_ / "shape";
    write_hf_folder(m, d);
    write_json(d / "config.json", hf_config_json(tiny_qwen3(false)));
    std::string e = error_of([&] { load(d); });
    EXPECT_NE(e.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("shape"), std::string::npos) << e;
  }
}

TEST_F(GenerateTest, BadConfigNamesFileAndField) {
  fs::path d = make_folder("m");
  auto j = hf_config_json(tiny_qwen3(false));
  j["num_key_value_heads"] = 3;
  write_json(d / "config.json", j);
  std::string e = error_of([&] { load(d); });
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("num_key_value_heads"), std::string::npos) << e;
  j = hf_config_json(tiny_qwen3(false));
  j.erase("hidden_size");
  write_json(d / "config.json", j);
  e = error_of([&] { load(d); });
  EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
  // A bad generation_config.json is named too.
  write_json(d / "config.json", hf_config_json(tiny_qwen3(false)));
  write_json(d / "generation_config.json", {{"eos_token_id", 5000}});
  e = error_of([&] { load(d); });
  EXPECT_NE(e.find("eos_token_id 5000"), std::string::npos) << e;
  std::string missing = error_of([&] { load(dir_ / "nope"); });
  EXPECT_NE(missing.find("nope"), std::string::npos) << missing;
}

// hidden_act picks the gated MLP's activation; one kiln lacks is refused by name, with the file
// (never ignored: that would silently compute a different model).
TEST_F(GenerateTest, HiddenActPicksTheMlpActivationOrIsRefusedByName) {
  using models::MlpActivation;
  const fs::path cfg = dir_ / "config.json";
  auto j = hf_config_json(tiny_qwen3(false));
  const std::pair<const char*, MlpActivation> known[] = {
      {"silu", MlpActivation::Silu},
      {"gelu", MlpActivation::Gelu},
      {"gelu_pytorch_tanh", MlpActivation::GeluTanh}};
  for (auto [name, act] : known) {
    j["hidden_act"] = name;
    write_json(cfg, j);
    models::ModelConfig c = models::load_hf_config(cfg.string());
    EXPECT_EQ(c.hidden_act, act) << name;
    EXPECT_EQ(c.mlp_kind, models::MlpKind::Gated) << name;
    EXPECT_EQ(models::ModelConfig::from_json(c.to_json()).hidden_act, act) << name;
  }
  j.erase("hidden_act");  // HF's default: silu
  write_json(cfg, j);
  EXPECT_EQ(models::load_hf_config(cfg.string()).hidden_act, MlpActivation::Silu);
  j["hidden_act"] = "relu2";
  write_json(cfg, j);
  std::string e = error_of([&] { models::load_hf_config(cfg.string()); });
  EXPECT_NE(e.find("[config] " + cfg.string() +
                   ": hidden_act \"relu2\" is not supported (kiln implements silu, "
                   "gelu_pytorch_tanh, gelu)"),
            std::string::npos)
      << e;
  // A model folder, as `kiln generate --model DIR` loads it.
  fs::path d = make_folder("m");
  j["hidden_act"] = "gelu_new";
  write_json(d / "config.json", j);
  e = error_of([&] { load(d); });
  EXPECT_NE(e.find("hidden_act \"gelu_new\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find((d / "config.json").string()), std::string::npos) << e;
}

TEST_F(GenerateTest, RandomWeightsFromConfigAndFolderTokenizerLookup) {
  // --random-weights --config: the tiny config with seeded weights; same seed, same weights.
  fs::path d = dir_ / "cfg";
  fs::create_directories(d);
  write_json(d / "config.json", hf_config_json(tiny_qwen3(true)));
  models::ModelSource s;
  s.random_weights = true;
  s.config = (d / "config.json").string();
  s.weights_seed = 3;
  s.dtype = DType::BF16;
  auto a = models::load_model(s);
  auto b = models::load_model(s);
  EXPECT_EQ(a.model->lm_head_weight().dtype(), DType::BF16);
  EXPECT_EQ(a.model->lm_head_weight().to_float_vector(),
            b.model->lm_head_weight().to_float_vector());
  EXPECT_EQ(a.tokenizer, nullptr);  // no tokenizer files next to it or above
  s.random_weights = false;
  EXPECT_NE(error_of([&] { models::load_model(s); }).find("no model"), std::string::npos);
}
