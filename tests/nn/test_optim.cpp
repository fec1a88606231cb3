// Optimizers against torch.optim (torch 1.13 via /usr/bin/python3, tests/nn/torch_optim_ref.py),
// the cosine schedule, and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "nn/optim.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_python.h"

namespace kiln::nn {
namespace {

using V = std::vector<double>;

using test::random_uniform_vec;

// Runs the Python reference on a list of runs; fills the final params of each. Returns false
// (and the test skips) when torch is not importable.
enum class Torch { Ok, Missing, Failed };
Torch run_torch(const std::vector<nlohmann::json>& runs, const std::string& tag,
                std::vector<std::vector<V>>& out) {
  std::string in = std::string(KILN_BINARY_DIR) + "/test_nn_optim_" + tag + ".json";
  nlohmann::json j;
  j["runs"] = runs;
  std::ofstream(in) << j.dump();
  std::string cmd = test_python() + " " + std::string(KILN_SOURCE_DIR) +
                    "/tests/nn/torch_optim_ref.py " + in + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return Torch::Missing;
  std::string text;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  int rc = pclose(p);
  std::remove(in.c_str());
  if (rc != 0 && (text.find("No module named 'torch'") != std::string::npos || rc == 127 << 8))
    return Torch::Missing;
  if (rc != 0) {
    ADD_FAILURE() << "torch reference failed (rc " << rc << "): " << text;
    return Torch::Failed;
  }
  nlohmann::json res = nlohmann::json::parse(text);
  for (const auto& r : res["results"]) {
    std::vector<V> params;
    for (const auto& a : r["params"]) params.push_back(a.get<V>());
    out.push_back(std::move(params));
  }
  return Torch::Ok;
}

struct Problem {
  std::vector<std::pair<std::string, Tensor>> params;
  std::vector<std::vector<std::vector<float>>> grads;  // [step][param]
  V lrs;
  nlohmann::json cfg;
};

Problem make_problem(int steps) {
  Problem pr;
  std::vector<std::pair<std::string, Shape>> shapes = {
      {"w", {3, 5}}, {"b", {5}}, {"e", {2, 3, 4}}, {"n", {7}}};
  std::uint64_t seed = 1;
  for (auto& [name, shape] : shapes) {
    auto v = random_uniform_vec(shape_numel(shape), seed++);
    Tensor t = ops::from_vector(v, shape);
    t.set_requires_grad(true);
    pr.params.emplace_back(name, t);
    pr.cfg["params"].push_back({{"name", name},
                                {"shape", shape},
                                {"values", std::vector<double>(v.begin(), v.end())},
                                {"decay", shape.size() >= 2}});
  }
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> gs;
    nlohmann::json js = nlohmann::json::array();
    for (auto& [name, t] : pr.params) {
      auto g = random_uniform_vec(t.numel(), 100 + seed++, -2, 2);
      js.push_back(std::vector<double>(g.begin(), g.end()));
      gs.push_back(std::move(g));
    }
    pr.grads.push_back(std::move(gs));
    pr.cfg["grads"].push_back(js);
    pr.lrs.push_back(cosine_lr(s, 2, steps, 3e-2, 3e-3));
  }
  pr.cfg["lrs"] = pr.lrs;
  return pr;
}

void run_ours(Optimizer& opt, Problem& pr) {
  for (std::size_t s = 0; s < pr.grads.size(); ++s) {
    opt.lr = pr.lrs[s];
    for (std::size_t i = 0; i < pr.params.size(); ++i)
      pr.params[i].second.set_grad(ops::from_vector(pr.grads[s][i], pr.params[i].second.shape()));
    opt.step();
  }
}

void compare(const Problem& pr, const std::vector<V>& want) {
  ASSERT_EQ(want.size(), pr.params.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    auto got = pr.params[i].second.to_double_vector();
    ASSERT_EQ(got.size(), want[i].size());
    for (std::size_t j = 0; j < got.size(); ++j)
      EXPECT_NEAR(got[j], want[i][j], 1e-6 * std::max(1.0, std::abs(want[i][j])))
          << pr.params[i].first << "[" << j << "]";
  }
}

TEST(Optim, AdamWMatchesTorch) {
  Problem pr = make_problem(5);
  AdamWOptions o;
  o.lr = pr.lrs[0];
  o.beta1 = 0.85;
  o.beta2 = 0.97;
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  AdamW opt(pr.params, o);
  // Decay only on matrices and higher.
  for (const auto& s : opt.state()) EXPECT_EQ(s.decay, s.param.dim() >= 2) << s.name;
  for (const auto& s : opt.state())
    EXPECT_EQ(s.m.storage()->category(), MemCategory::OptimizerState);
  pr.cfg["optimizer"] = "adamw";
  pr.cfg["adamw"] = {
      {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
  std::vector<std::vector<V>> want;
  Torch st = run_torch({pr.cfg}, "adamw", want);
  if (st == Torch::Missing)
    FAIL() << test_python()
           << " has no torch: this independent reference must run "
              "(scripts/setup.sh installs python3-torch)";
  ASSERT_EQ(st, Torch::Ok);
  run_ours(opt, pr);
  EXPECT_EQ(opt.step_count, 5);
  compare(pr, want.at(0));
}

TEST(Optim, SgdMomentumNesterovMatchTorch) {
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  std::vector<Case> cases = {{0.9, 0.0, 0.05, false},
                             {0.9, 0.0, 0.05, true},
                             {0.8, 0.25, 0.0, false},
                             {0.0, 0.0, 0.1, false}};
  std::vector<Problem> problems;
  std::vector<nlohmann::json> runs;
  for (const Case& c : cases) {
    Problem pr = make_problem(5);
    pr.cfg["optimizer"] = "sgd";
    pr.cfg["sgd"] = {{"momentum", c.momentum},
                     {"dampening", c.dampening},
                     {"weight_decay", c.wd},
                     {"nesterov", c.nesterov}};
    runs.push_back(pr.cfg);
    problems.push_back(std::move(pr));
  }
  std::vector<std::vector<V>> want;
  Torch st = run_torch(runs, "sgd", want);
  if (st == Torch::Missing)
    FAIL() << test_python()
           << " has no torch: this independent reference must run "
              "(scripts/setup.sh installs python3-torch)";
  ASSERT_EQ(st, Torch::Ok);
  ASSERT_EQ(want.size(), cases.size());
  for (std::size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE(k);
    SgdOptions o;
    o.lr = problems[k].lrs[0];
    o.momentum = cases[k].momentum;
    o.dampening = cases[k].dampening;
    o.weight_decay = cases[k].wd;
    o.nesterov = cases[k].nesterov;
    Sgd opt(problems[k].params, o);
    EXPECT_EQ(opt.state()[0].m.defined(), cases[k].momentum != 0.0);
    run_ours(opt, problems[k]);
    compare(problems[k], want[k]);
  }
}

TEST(Optim, ZeroGradAndMissingGrads) {
  Problem pr = make_problem(1);
  AdamW opt(pr.params, AdamWOptions{});
  auto before = pr.params[0].second.to_double_vector();
  opt.step();  // no grads yet: nothing moves
  EXPECT_EQ(pr.params[0].second.to_double_vector(), before);
  pr.params[0].second.set_grad(ops::ones({3, 5}));
  Tensor g = pr.params[0].second.grad();
  opt.zero_grad();
  EXPECT_EQ(pr.params[0].second.grad().impl(), g.impl());  // memory kept
  for (double v : g.to_double_vector()) EXPECT_EQ(v, 0.0);
  // bf16 parameters get an f32 master copy (mixed precision); f64 ones (a checking mode) keep
  // f64 moments and no master in AdamW, and SGD, which has no f64 kernel, refuses them.
  Tensor bf = ops::zeros({2}, DType::BF16);
  bf.set_requires_grad(true);
  AdamW mixed({{"bf", bf}}, AdamWOptions{});
  ASSERT_TRUE(mixed.state()[0].master.defined());
  EXPECT_EQ(mixed.state()[0].master.dtype(), DType::F32);
  Tensor f64 = ops::zeros({2}, DType::F64);
  f64.set_requires_grad(true);
  AdamW exact({{"f64", f64}}, AdamWOptions{});
  EXPECT_FALSE(exact.state()[0].master.defined());
  EXPECT_EQ(exact.state()[0].m.dtype(), DType::F64);
  EXPECT_EQ(exact.state()[0].v.dtype(), DType::F64);
  f64.set_grad(ops::full({2}, 0.5, DType::F64));
  exact.step();  // first step: each weight moves by about -lr (g / |g|)
  for (double w : f64.to_double_vector()) EXPECT_NEAR(w, -AdamWOptions{}.lr, 1e-9);
  EXPECT_THROW(Sgd({{"f64", f64}}, SgdOptions{}), Error);
}

TEST(Optim, CosineSchedule) {
  const double mx = 1e-3, mn = 1e-4;
  const std::int64_t warm = 10, total = 110;
  for (std::int64_t s = 0; s < warm; ++s)
    EXPECT_DOUBLE_EQ(cosine_lr(s, warm, total, mx, mn), mx * (s + 1) / warm) << s;
  EXPECT_DOUBLE_EQ(cosine_lr(warm - 1, warm, total, mx, mn), mx);
  EXPECT_DOUBLE_EQ(cosine_lr(warm, warm, total, mx, mn), mx);
  EXPECT_NEAR(cosine_lr(60, warm, total, mx, mn), (mx + mn) / 2, 1e-15);  // midpoint
  double q = 0.5 * (1 + std::cos(std::numbers::pi * 0.25));
  EXPECT_NEAR(cosine_lr(35, warm, total, mx, mn), mn + q * (mx - mn), 1e-15);
  EXPECT_DOUBLE_EQ(cosine_lr(total, warm, total, mx, mn), mn);
  EXPECT_DOUBLE_EQ(cosine_lr(total + 50, warm, total, mx, mn), mn);
  // Monotone decay after warm-up.
  for (std::int64_t s = warm; s < total; ++s)
    EXPECT_LE(cosine_lr(s + 1, warm, total, mx, mn), cosine_lr(s, warm, total, mx, mn));
  // No warm-up.
  EXPECT_DOUBLE_EQ(cosine_lr(0, 0, 100, mx, mn), mx);
}

TEST(Optim, ClipGradNorm) {
  std::vector<Tensor> ps;
  double sq = 0;
  for (int i = 0; i < 3; ++i) {
    Tensor p = ops::zeros({4 + i});
    p.set_requires_grad(true);
    auto g = random_uniform_vec(4 + i, 50 + i, -3, 3);
    for (float v : g) sq += double(v) * v;
    p.set_grad(ops::from_vector(g, {4 + i}));
    ps.push_back(p);
  }
  Tensor nograd = ops::zeros({3});
  ps.push_back(nograd);  // no .grad: ignored
  double norm = std::sqrt(sq);
  std::vector<V> g0;
  for (int i = 0; i < 3; ++i) g0.push_back(ps[i].grad().to_double_vector());
  // Above the norm: unchanged, returns the norm.
  EXPECT_NEAR(clip_grad_norm(ps, norm * 2), norm, 1e-5 * norm);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ps[i].grad().to_double_vector(), g0[i]);
  // Below: scaled to max_norm, the direction kept; returns the norm before clipping.
  double max_norm = norm / 4;
  EXPECT_NEAR(clip_grad_norm(ps, max_norm), norm, 1e-5 * norm);
  double after = 0;
  for (int i = 0; i < 3; ++i) {
    auto g = ps[i].grad().to_double_vector();
    for (std::size_t j = 0; j < g.size(); ++j) {
      EXPECT_NEAR(g[j], g0[i][j] * max_norm / norm, 1e-6 * std::abs(g0[i][j]));
      after += g[j] * g[j];
    }
  }
  EXPECT_NEAR(std::sqrt(after), max_norm, 1e-6 * max_norm);
  // max_norm 0: measure only.
  EXPECT_NEAR(clip_grad_norm(ps, 0.0), max_norm, 1e-5 * max_norm);
}

}  // namespace
}  // namespace kiln::nn
