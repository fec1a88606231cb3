// Optimizers, learning-rate schedules and gradient clipping.
//
// AdamW follows PyTorch: decoupled weight decay (p -= lr * wd * p), bias
// correction, and no decay on parameters with fewer than 2 dims (norm weights
// and biases). Moments are f32 and charged to MemCategory::OptimizerState.
#pragma once

#include <string>
#include <vector>

#include "nn/module.h"

namespace kiln::nn {

struct ParamState {
  std::string name;
  Tensor param;
  Tensor m, v;  // AdamW moments, or SGD momentum in m
  bool decay = true;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad();
  double lr = 1e-3;
  std::int64_t step_count = 0;
  std::vector<ParamState>& state() { return state_; }
  const std::vector<ParamState>& state() const { return state_; }

 protected:
  std::vector<ParamState> state_;
};

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

class AdamW : public Optimizer {
 public:
  AdamW(const std::vector<std::pair<std::string, Tensor>>& params, const AdamWOptions& o);
  void step() override;
  AdamWOptions opt;
};

struct SgdOptions {
  double lr = 1e-2, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

class Sgd : public Optimizer {
 public:
  Sgd(const std::vector<std::pair<std::string, Tensor>>& params, const SgdOptions& o);
  void step() override;
  SgdOptions opt;
};

// Linear warm-up from 0 over `warmup` steps, then cosine decay from max_lr to
// min_lr at `total` steps, constant after.
double cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t total, double max_lr,
                 double min_lr);

// Scales all gradients so their global L2 norm is at most max_norm (if
// max_norm > 0). Returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace kiln::nn
