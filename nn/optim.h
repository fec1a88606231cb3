// Optimizers, learning-rate schedules and gradient clipping.
//
// AdamW follows PyTorch: decoupled weight decay (p -= lr * wd * p), bias
// correction, and no decay on parameters with fewer than 2 dims (norm weights
// and biases). Moments are f32 and charged to MemCategory::OptimizerState.
//
// Mixed precision: a bf16/f16 parameter gets an f32 master copy (charged to
// MemCategory::MasterWeights); the update runs on the master and is rounded
// back into the parameter. Gradients keep the parameter's dtype, so bf16
// training costs 2 (weights) + 2 (grads) + 4 (master) + 4 + 4 (moments) = 16
// bytes per parameter. bf16 has fp32's exponent range, so no loss scaling.
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
  Tensor master;  // f32 master copy of a bf16/f16 parameter (else undefined)
  // The f32 values the update works on: the master copy or the parameter.
  Tensor& weights() { return master.defined() ? master : param; }
  const Tensor& weights() const { return master.defined() ? master : param; }
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
  // Adds a parameter: f32 master copy if it is low-precision, and `moments`
  // zero f32 buffers (charged to OptimizerState).
  void add_param(const std::string& name, const Tensor& p, int moments);
  // Runs `update(weights_f32, grad_f32, state)` for each parameter with a gradient.
  template <typename F>
  void for_each_update(F&& update);
  // One parameter of for_each_update: a low-precision parameter's gradient goes to f32 scratch,
  // the update runs on the master, which is then rounded back into the parameter.
  template <typename F>
  void update_one(ParamState& s, const Tensor& g, F&& update);
  std::vector<ParamState> state_;
};

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// step(): one ops::adamw_multi_step_ call per device for every parameter with a gradient. On
// CUDA that is a single launch; on the CPU the kernel goes item by item. Gradients are read as
// they are (bf16 gradients as bf16, no f32 copies), and masters are updated and rounded into
// their parameters in the same kernel.
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
// max_norm > 0). Returns the norm before clipping. The squares are summed by one
// ops::sum_squares_multi per device: on the CPU tensor by tensor, in order, in
// double; on CUDA in one launch with a single sync.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace kiln::nn
