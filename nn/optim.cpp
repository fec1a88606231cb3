#include "nn/optim.h"

#include <cmath>
#include <numbers>

namespace kiln::nn {

void Optimizer::zero_grad() {
  for (auto& s : state_) {
    Tensor g = s.param.grad();
    if (g.defined()) ops::fill_(g, 0.0);
  }
}

AdamW::AdamW(const std::vector<std::pair<std::string, Tensor>>& params, const AdamWOptions& o)
    : opt(o) {
  lr = o.lr;
  MemoryScope scope(MemCategory::OptimizerState);
  for (const auto& [name, p] : params) {
    KILN_CHECK(p.dtype() == DType::F32, "[adamw] parameter {} is {}, expected f32 master weights",
               name, dtype_name(p.dtype()));
    ParamState s{name, p, ops::zeros_like(p), ops::zeros_like(p), p.dim() >= 2};
    state_.push_back(std::move(s));
  }
}

void AdamW::step() {
  PhaseScope phase(Phase::Optimizer);
  step_count++;
  for (auto& s : state_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    ops::adamw_step_(s.param, g, s.m, s.v, lr, opt.beta1, opt.beta2, opt.eps,
                     s.decay ? opt.weight_decay : 0.0, step_count);
  }
}

Sgd::Sgd(const std::vector<std::pair<std::string, Tensor>>& params, const SgdOptions& o) : opt(o) {
  lr = o.lr;
  MemoryScope scope(MemCategory::OptimizerState);
  for (const auto& [name, p] : params) {
    KILN_CHECK(p.dtype() == DType::F32, "[sgd] parameter {} is {}, expected f32", name,
               dtype_name(p.dtype()));
    ParamState s{name, p, o.momentum != 0.0 ? ops::zeros_like(p) : Tensor(), Tensor(),
                 p.dim() >= 2};
    state_.push_back(std::move(s));
  }
}

void Sgd::step() {
  PhaseScope phase(Phase::Optimizer);
  step_count++;
  for (auto& s : state_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    ops::sgd_step_(s.param, g, s.m, lr, opt.momentum, opt.dampening,
                   s.decay ? opt.weight_decay : 0.0, opt.nesterov, step_count);
  }
}

double cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t total, double max_lr,
                 double min_lr) {
  if (warmup > 0 && step < warmup)
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min_lr;
  double progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<std::int64_t>(total - warmup, 1));
  double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return min_lr + coeff * (max_lr - min_lr);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  double sq = 0.0;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (g.defined()) sq += ops::sum_squares(g);
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
