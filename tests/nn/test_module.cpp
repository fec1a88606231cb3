// Module on a real decoder: Hugging Face names, preset parameter counts (closed form), state
// dicts, dtype conversion in place, train/eval, a leak check over training steps and the
// weights/gradients/optimizer-state memory identity on stories15M.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "nn/optim.h"

namespace kiln::nn {
namespace {

using models::DecoderModel;
using models::ModelConfig;

std::int64_t round64(std::int64_t n) { return (n + 63) / 64 * 64; }

ModelConfig tiny(bool tied = true) {
  ModelConfig c;
  c.name = "tiny";
  c.vocab_size = 32;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.hidden_dim = 24;
  c.max_seq_len = 16;
  c.tie_embeddings = tied;
  return c;
}

// The closed-form parameter count of the decoder.
std::int64_t closed_form(const ModelConfig& c) {
  std::int64_t C = c.dim, hd = c.head_dim ? c.head_dim : c.dim / c.n_heads;
  std::int64_t qd = c.n_heads * hd, kvd = c.n_kv_heads * hd;
  std::int64_t layer = C * qd + 2 * C * kvd + qd * C  // q, k, v, o
                       + 3 * C * c.hidden_dim         // gate, up, down
                       + 2 * C;                       // two RMSNorms
  if (c.qk_norm) layer += 2 * hd;
  if (c.qkv_bias) layer += qd + 2 * kvd;
  std::int64_t n = c.vocab_size * C + c.n_layers * layer + C;
  if (!c.tie_embeddings) n += c.vocab_size * C;
  return n;
}

std::map<std::string, Shape> name_shapes(const Module& m) {
  std::map<std::string, Shape> out;
  for (auto& [n, t] : m.named_parameters()) out[n] = t.shape();
  return out;
}

std::int64_t cat(DeviceType d, MemCategory c) {
  return MemoryTracker::get(d).stats().current[static_cast<std::size_t>(c)];
}

Tensor ids_tensor(std::int64_t B, std::int64_t T, std::int64_t vocab, int shift) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(B * T));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>((i * 7 + shift) % vocab);
  return ops::from_vector(v, {B, T});
}

// ---- names ----------------------------------------------------------------------------------

TEST(Module, HuggingFaceNames) {
  DecoderModel m(tiny(), 1);
  auto ns = name_shapes(m);
  std::map<std::string, Shape> want = {{"model.embed_tokens.weight", {32, 16}},
                                       {"model.norm.weight", {16}}};
  for (int l = 0; l < 2; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    want[p + "input_layernorm.weight"] = {16};
    want[p + "post_attention_layernorm.weight"] = {16};
    want[p + "self_attn.q_proj.weight"] = {16, 16};
    want[p + "self_attn.k_proj.weight"] = {8, 16};
    want[p + "self_attn.v_proj.weight"] = {8, 16};
    want[p + "self_attn.o_proj.weight"] = {16, 16};
    want[p + "mlp.gate_proj.weight"] = {24, 16};
    want[p + "mlp.up_proj.weight"] = {24, 16};
    want[p + "mlp.down_proj.weight"] = {16, 24};
  }
  EXPECT_EQ(ns, want);
  auto np = m.named_parameters();
  EXPECT_EQ(np.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(np.back().first, "model.norm.weight");
  for (auto& [n, t] : np) {
    EXPECT_TRUE(t.requires_grad()) << n;
    EXPECT_EQ(t.storage()->category(), MemCategory::Weights) << n;
  }
  EXPECT_EQ(m.lm_head, nullptr);
  EXPECT_EQ(m.lm_head_weight().impl(), m.model->embed_tokens->weight.impl());

  DecoderModel u(tiny(false), 1);
  auto un = name_shapes(u);
  ASSERT_TRUE(un.count("lm_head.weight"));
  EXPECT_EQ(un["lm_head.weight"], (Shape{32, 16}));
  EXPECT_EQ(un.size(), want.size() + 1);

  ModelConfig q = tiny(false);  // Qwen3-like: QK-norm, untied, rotate-half
  q.qk_norm = true;
  q.rope_style = ops::RopeStyle::RotateHalf;
  DecoderModel qm(q, 1);
  auto qn = name_shapes(qm);
  EXPECT_EQ(qn["model.layers.1.self_attn.q_norm.weight"], (Shape{4}));
  EXPECT_EQ(qn["model.layers.1.self_attn.k_norm.weight"], (Shape{4}));
  EXPECT_EQ(qn.size(), want.size() + 1 + 4);
  EXPECT_EQ(qm.num_parameters(), closed_form(q));

  ModelConfig b = tiny();  // Qwen2-like: biases on q/k/v only
  b.qkv_bias = true;
  DecoderModel bm(b, 1);
  auto bn = name_shapes(bm);
  EXPECT_EQ(bn["model.layers.0.self_attn.q_proj.bias"], (Shape{16}));
  EXPECT_EQ(bn["model.layers.0.self_attn.k_proj.bias"], (Shape{8}));
  EXPECT_EQ(bn["model.layers.0.self_attn.v_proj.bias"], (Shape{8}));
  EXPECT_FALSE(bn.count("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_EQ(bn.size(), want.size() + 6);
  EXPECT_EQ(bm.num_parameters(), closed_form(b));
}

TEST(Module, PresetParameterCounts) {
  // llama2.c's published sizes and the closed form.
  struct Case {
    const char* name;
    std::int64_t count;
    Device device;
  };
  for (Case c :
       {Case{"stories260K", 260032, Device::cpu()}, Case{"stories15M", 15191712, Device::meta()},
        Case{"stories42M", 41689600, Device::meta()},
        Case{"stories110M", 109529856, Device::meta()}}) {
    ModelConfig cfg = models::preset(c.name);
    EXPECT_EQ(closed_form(cfg), c.count) << c.name;
    std::int64_t w0 = cat(DeviceType::Meta, MemCategory::Weights);
    DecoderModel m(cfg, 7, DType::F32, c.device);
    EXPECT_EQ(m.num_parameters(), c.count) << c.name;
    if (c.device.is_meta()) {
      // Real allocation decisions, no memory: the meta tracker holds exactly the weights.
      std::int64_t want = 0;
      for (auto& [n, t] : m.named_parameters()) {
        EXPECT_EQ(t.raw_data(), nullptr);
        want += round64(t.numel() * 4);
      }
      EXPECT_EQ(cat(DeviceType::Meta, MemCategory::Weights) - w0, want) << c.name;
    }
  }
}

// ---- state dicts, dtype, modes ----------------------------------------------------------------

TEST(Module, StateDictRoundTrip) {
  DecoderModel a(tiny(false), 1), b(tiny(false), 2);
  Tensor ids = ids_tensor(2, 5, 32, 3);
  Tensor la, lb;
  {
    NoGradGuard ng;
    la = a.forward(ids);
    lb = b.forward(ids);
  }
  EXPECT_NE(la.to_double_vector(), lb.to_double_vector());
  auto sd = a.state_dict();
  EXPECT_EQ(sd.size(), a.named_parameters().size());
  b.load_state_dict(sd);
  for (auto& [n, t] : b.named_parameters()) {
    EXPECT_EQ(t.to_double_vector(), sd.at(n).to_double_vector()) << n;
    EXPECT_FALSE(t.same_storage(sd.at(n))) << n;  // a copy, not an alias
    EXPECT_TRUE(t.requires_grad()) << n;
    // DecoderModel gives each tensor its full HF name, for messages.
    EXPECT_EQ(n, t.name());
  }
  {
    NoGradGuard ng;
    EXPECT_EQ(b.forward(ids).to_double_vector(), la.to_double_vector());
  }
  // A bf16 state dict loads with conversion into the f32 model.
  std::map<std::string, Tensor> sd16;
  for (auto& [n, t] : sd) sd16[n] = t.to(DType::BF16);
  b.load_state_dict(sd16);
  for (auto& [n, t] : b.named_parameters()) {
    EXPECT_EQ(t.dtype(), DType::F32);
    EXPECT_EQ(t.to_double_vector(), sd16.at(n).to_double_vector()) << n;
  }
}

// Without grad recording a decoder layer runs its residual add and post-attention RMSNorm as one
// op (ops::add_rmsnorm); with it, as ag::add then ag::rmsnorm. The logits are the same bits.
TEST(Module, InferenceForwardEqualsTheRecordedForwardBitForBit) {
  for (DType dt : {DType::F32, DType::BF16}) {
    DecoderModel m(tiny(false), 4, dt);
    Tensor ids = ids_tensor(2, 7, 32, 5);
    const Tensor recorded = m.forward(ids);
    EXPECT_TRUE(recorded.requires_grad());
    NoGradGuard ng;
    const Tensor inference = m.forward(ids);
    EXPECT_FALSE(inference.requires_grad());
    EXPECT_EQ(inference.to_double_vector(), recorded.to_double_vector()) << dtype_name(dt);
  }
}

TEST(Module, StrictMismatchListsEverything) {
  DecoderModel m(tiny(), 1);
  auto sd = m.state_dict();
  sd.erase("model.layers.1.mlp.up_proj.weight");
  sd["model.layers.9.extra.weight"] = ops::zeros({2});
  sd["model.norm.weight"] = ops::zeros({17});
  try {
    m.load_state_dict(sd);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[load_state_dict]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing: model.layers.1.mlp.up_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected: model.layers.9.extra.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.norm.weight (file (17,), model (16,))"), std::string::npos) << msg;
  }
  // Nothing was loaded by the failed call.
  EXPECT_EQ(m.model->norm->weight.to_double_vector(), std::vector<double>(16, 1.0));
  // Non-strict: missing and unexpected names are fine, a wrong shape is not.
  sd["model.norm.weight"] = ops::full({16}, 2.0);
  EXPECT_NO_THROW(m.load_state_dict(sd, false));
  EXPECT_EQ(m.model->norm->weight.to_double_vector(), std::vector<double>(16, 2.0));
  sd["model.norm.weight"] = ops::zeros({3});
  EXPECT_THROW(m.load_state_dict(sd, false), Error);
}

TEST(Module, ToDtypeInPlace) {
  DecoderModel m(tiny(), 1);
  Tensor held = m.model->layers->items[0]->self_attn->q_proj->weight;  // another handle
  auto before = held.to_double_vector();
  held.set_grad(ops::zeros(held.shape()));
  m.to(DType::BF16);
  EXPECT_EQ(held.dtype(), DType::BF16);
  EXPECT_FALSE(held.grad().defined());  // stale f32 gradient dropped
  EXPECT_TRUE(held.requires_grad());
  EXPECT_EQ(held.name(), "model.layers.0.self_attn.q_proj.weight");
  auto after = held.to_double_vector();
  for (std::size_t i = 0; i < before.size(); ++i)
    EXPECT_NEAR(after[i], before[i], 4e-3 * std::abs(before[i]));
  for (auto& [n, t] : m.named_parameters()) {
    EXPECT_EQ(t.dtype(), DType::BF16) << n;
    EXPECT_EQ(t.storage()->category(), MemCategory::Weights) << n;
  }
  // Back to f32: the bf16 values exactly.
  m.to(DType::F32);
  EXPECT_EQ(held.dtype(), DType::F32);
  EXPECT_EQ(held.to_double_vector(), after);
  m.to(Device::cpu(), DType::F64);
  EXPECT_EQ(m.model->norm->weight.dtype(), DType::F64);
}

TEST(Module, TrainEvalFlags) {
  DecoderModel m(tiny(), 1);
  EXPECT_TRUE(m.is_training());
  m.eval();
  EXPECT_FALSE(m.is_training());
  EXPECT_FALSE(m.model->is_training());
  EXPECT_FALSE(m.model->layers->items[1]->mlp->is_training());
  EXPECT_FALSE(m.model->layers->items[0]->self_attn->q_proj->is_training());
  m.train();
  EXPECT_TRUE(m.model->layers->items[1]->self_attn->is_training());
  m.model->layers->items[0]->train(false);  // a subtree only
  EXPECT_FALSE(m.model->layers->items[0]->mlp->is_training());
  EXPECT_TRUE(m.model->layers->items[1]->mlp->is_training());
  EXPECT_TRUE(m.is_training());
}

TEST(Module, ZeroGradKeepsBuffers) {
  DecoderModel m(tiny(), 1);
  Tensor ids = ids_tensor(1, 6, 32, 0), tg = ids_tensor(1, 6, 32, 1);
  backward(m.loss(ids, tg));
  std::vector<TensorImpl*> bufs;
  for (auto& [n, t] : m.named_parameters()) {
    ASSERT_TRUE(t.grad().defined()) << n;
    EXPECT_EQ(t.grad().storage()->category(), MemCategory::Gradients) << n;
    bufs.push_back(t.grad().impl());
  }
  m.zero_grad();
  std::size_t i = 0;
  for (auto& [n, t] : m.named_parameters()) {
    EXPECT_EQ(t.grad().impl(), bufs[i++]) << n;
    for (double g : t.grad().to_double_vector()) ASSERT_EQ(g, 0.0) << n;
  }
}

// ---- memory -----------------------------------------------------------------------------------

// One training step: forward under MemoryScope(Activations), backward, AdamW step, zero_grad.
void train_step(DecoderModel& m, AdamW& opt, const Tensor& ids, const Tensor& tg) {
  Tensor loss;
  {
    PhaseScope ph(Phase::Forward);
    MemoryScope act(MemCategory::Activations);
    loss = m.loss(ids, tg);
  }
  backward(loss);
  loss = Tensor();
  opt.step();
  opt.zero_grad();
}

TEST(Memory, NoLeakAcrossTrainingSteps) {
  const auto C = DeviceType::CPU;
  DecoderModel m(tiny(false), 3);
  AdamW opt(m.named_parameters(), AdamWOptions{});
  Tensor ids, tg;
  {
    MemoryScope in(MemCategory::Inputs);
    ids = ids_tensor(2, 7, 32, 0);
    tg = ids_tensor(2, 7, 32, 5);
  }
  std::int64_t act0 = cat(C, MemCategory::Activations), tmp0 = cat(C, MemCategory::Temporaries);
  train_step(m, opt, ids, tg);
  auto base = MemoryTracker::get(C).stats().current;
  EXPECT_EQ(cat(C, MemCategory::Activations), act0);
  EXPECT_EQ(cat(C, MemCategory::Temporaries), tmp0);
  for (int s = 0; s < 3; ++s) {
    train_step(m, opt, ids, tg);
    auto now = MemoryTracker::get(C).stats().current;
    for (std::size_t i = 0; i < kNumMemCategories; ++i)
      EXPECT_EQ(now[i], base[i]) << "step " << s << " category "
                                 << mem_category_name(static_cast<MemCategory>(i));
  }
  // With recomputation too.
  m.recompute = true;
  train_step(m, opt, ids, tg);
  auto now = MemoryTracker::get(C).stats().current;
  for (std::size_t i = 0; i < kNumMemCategories; ++i) EXPECT_EQ(now[i], base[i]) << i;
}

// The dry run on meta charges exactly what the CPU run charges, category by category, at the end
// of a step and at its peak.
TEST(Memory, MetaDryRunMatchesCpuStep) {
  auto run = [](Device d) {
    auto& tr = MemoryTracker::get(d.type);
    auto base = tr.stats();
    std::vector<std::int64_t> out;
    {
      DecoderModel m(tiny(false), 1, DType::F32, d);
      AdamW opt(m.named_parameters(), AdamWOptions{});
      Tensor ids, tg;
      {
        MemoryScope in(MemCategory::Inputs);
        ids = Tensor::empty({2, 7}, DType::I32, d);
        tg = Tensor::empty({2, 7}, DType::I32, d);
        if (d.is_cpu()) {
          ops::fill_(ids, 3);
          ops::fill_(tg, 4);
        }
      }
      tr.reset_peaks();
      train_step(m, opt, ids, tg);
      auto s = tr.stats();
      for (std::size_t i = 0; i < kNumMemCategories; ++i) {
        out.push_back(s.current[i] - base.current[i]);
        out.push_back(s.at_peak[i] - base.current[i]);
      }
      out.push_back(s.total_peak - base.total);
      out.push_back(static_cast<std::int64_t>(s.peak_phase));
    }
    out.push_back(tr.stats().total - base.total);
    return out;
  };
  auto cpu = run(Device::cpu());
  auto meta = run(Device::meta());
  EXPECT_EQ(cpu, meta);
  EXPECT_EQ(meta.back(), 0);
}

TEST(Memory, Stories15MIdentity) {
  const auto C = DeviceType::CPU;
  std::int64_t w0 = cat(C, MemCategory::Weights), g0 = cat(C, MemCategory::Gradients),
               o0 = cat(C, MemCategory::OptimizerState);
  ModelConfig cfg = models::preset("stories15M");
  DecoderModel m(cfg, 11, DType::F32, Device::cpu());
  std::int64_t want = 0, params = 0;
  for (auto& [n, t] : m.named_parameters()) {
    want += round64(t.numel() * 4);
    params += t.numel();
  }
  EXPECT_EQ(params, 15191712);
  EXPECT_GE(want, 4 * params);
  EXPECT_LT(want - 4 * params, 64 * static_cast<std::int64_t>(m.named_parameters().size()));
  EXPECT_EQ(cat(C, MemCategory::Weights) - w0, want);
  AdamW opt(m.named_parameters(), AdamWOptions{});
  Tensor ids = ids_tensor(1, 8, cfg.vocab_size, 1), tg = ids_tensor(1, 8, cfg.vocab_size, 2);
  train_step(m, opt, ids, tg);
  EXPECT_EQ(cat(C, MemCategory::Weights) - w0, want);
  EXPECT_EQ(cat(C, MemCategory::Gradients) - g0, want);
  EXPECT_EQ(cat(C, MemCategory::OptimizerState) - o0, 2 * want);
}

}  // namespace
}  // namespace kiln::nn
