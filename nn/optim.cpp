#include "nn/optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <span>
#include <vector>

namespace kiln::nn {

void Optimizer::zero_grad() {
  for (auto& s : state_) {
    Tensor g = s.param.grad();
    if (g.defined()) ops::fill_(g, 0.0);
  }
}

void Optimizer::add_param(const std::string& name, const Tensor& p, int moments) {
  KILN_CHECK(is_floating(p.dtype()),
             "[optimizer] parameter {} is {}; expected f32, bf16, f16 or f64", name,
             dtype_name(p.dtype()));
  // f64 parameters (a checking mode, CPU AdamW only) keep f64 moments and need no master.
  const bool f64 = p.dtype() == DType::F64;
  ParamState s{name, p, Tensor(), Tensor(), p.dim() >= 2, Tensor()};
  if (p.dtype() != DType::F32 && !f64) {
    MemoryScope scope(MemCategory::MasterWeights);
    s.master = p.to(DType::F32);
    if (s.master.same_storage(p)) s.master = s.master.clone();
  }
  MemoryScope scope(MemCategory::OptimizerState);
  Tensor& w = s.weights();
  const DType moment_dtype = f64 ? DType::F64 : DType::F32;
  if (moments >= 1) s.m = ops::zeros(w.shape(), moment_dtype, w.device());
  if (moments >= 2) s.v = ops::zeros(w.shape(), moment_dtype, w.device());
  state_.push_back(std::move(s));
}

template <typename F>
void Optimizer::update_one(ParamState& s, const Tensor& g, F&& update) {
  if (!s.master.defined()) {
    update(s.param, g, s);
    return;
  }
  MemoryScope scratch(MemCategory::Temporaries);
  Tensor g32 = g.to(DType::F32);
  update(s.master, g32, s);
  s.param.copy_(s.master);  // round the updated master into bf16/f16
}

template <typename F>
void Optimizer::for_each_update(F&& update) {
  PhaseScope phase(Phase::Optimizer);
  step_count++;
  for (auto& s : state_) {
    Tensor g = s.param.grad();
    if (g.defined()) update_one(s, g, update);
  }
}

AdamW::AdamW(const std::vector<std::pair<std::string, Tensor>>& params, const AdamWOptions& o)
    : opt(o) {
  lr = o.lr;
  for (const auto& [name, p] : params) add_param(name, p, 2);
}

void AdamW::step() {
  PhaseScope phase(Phase::Optimizer);
  step_count++;
  std::vector<ops::AdamWTensors> batch;
  for (auto& s : state_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    batch.push_back({s.param, g, s.master, s.m, s.v, s.decay ? opt.weight_decay : 0.0});
  }
  // One multi-tensor step per device (adamw_multi_step_ takes one device at a time).
  while (!batch.empty()) {
    const Device d = batch.front().param.device();
    auto same = std::stable_partition(batch.begin(), batch.end(), [&](const ops::AdamWTensors& it) {
      return it.param.device() == d;
    });
    ops::adamw_multi_step_(std::span(batch.begin(), same), lr, opt.beta1, opt.beta2, opt.eps,
                           step_count);
    batch.erase(batch.begin(), same);
  }
}

Sgd::Sgd(const std::vector<std::pair<std::string, Tensor>>& params, const SgdOptions& o) : opt(o) {
  lr = o.lr;
  for (const auto& [name, p] : params) {
    KILN_CHECK(p.dtype() != DType::F64, "[sgd] parameter {} is f64; SGD has f32 kernels only",
               name);
    add_param(name, p, o.momentum != 0.0 ? 1 : 0);
  }
}

void Sgd::step() {
  for_each_update([&](Tensor& w, const Tensor& g, ParamState& s) {
    ops::sgd_step_(w, g, s.m, lr, opt.momentum, opt.dampening, s.decay ? opt.weight_decay : 0.0,
                   opt.nesterov, step_count);
  });
}

double cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t total, double max_lr,
                 double min_lr) {
  if (warmup > 0 && step < warmup)
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min_lr;
  double progress = static_cast<double>(step - warmup) /
                    static_cast<double>(std::max<std::int64_t>(total - warmup, 1));
  double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return min_lr + coeff * (max_lr - min_lr);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  double sq = 0.0;
  std::vector<Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  // One multi-tensor sum per device (on CUDA: one launch and one sync for all gradients).
  while (!grads.empty()) {
    const Device d = grads.front().device();
    auto same = std::stable_partition(grads.begin(), grads.end(),
                                      [&](const Tensor& g) { return g.device() == d; });
    sq += ops::sum_squares_multi(std::span<const Tensor>(grads.begin(), same));
    grads.erase(grads.begin(), same);
  }
  double norm = std::sqrt(sq);
  if (max_norm > 0.0 && norm > max_norm) {
    double scale = max_norm / (norm + 1e-6);
    for (const auto& p : params) {
      Tensor g = p.grad();
      if (g.defined()) ops::scale_(g, scale);
    }
  }
  return norm;
}

}  // namespace kiln::nn
