// The work of one training step on a batch, shared by Trainer::step() (models/trainer.h) and the
// budget's measured step (budget/dry_run.cpp), so that `kiln budget --measure` measures the
// allocations that `kiln train` makes:
//
//   forward (category Activations, Phase::Forward) -> backward (through grad_ready when set)
//   -> after_backward -> the loss read back (reduce_loss: the ranks' mean) -> clip -> update
//   -> zero_grad
//
// The loss is read after backward, so that on a GPU the host queues the backward pass while the
// forward still runs (item() waits for the device). A step whose loss or gradient norm is not
// finite makes no update: a NaN/inf would poison the weights and the AdamW moments for good. On
// the meta device nothing is read back: the loss counts as finite, so that the step makes every
// allocation of a real one.
#pragma once

#include <functional>

#include "autograd/engine.h"
#include "models/decoder.h"
#include "tensor/tensor.h"

namespace kiln::models {

struct TrainStepParts {
  GradReadyHook grad_ready;              // empty: none
  std::function<void()> after_backward;  // empty: nothing (data parallel: wait for the buckets)
  std::function<double(double)> reduce_loss;  // empty: this rank's loss
  std::function<double()> clip;               // clips the gradients; returns the norm before it
  std::function<void()> update;               // the optimizer step
  std::function<void()> zero_grad;
};

struct TrainStepResult {
  double loss = 0;  // the batch's loss, before the update (0 on meta)
  double norm = 0;  // the global gradient norm before clipping (NAN when the loss is not finite)
  bool skipped = false;
};

// x, y: (B, T) token ids on the model's device.
TrainStepResult run_train_step(DecoderModel& model, const Tensor& x, const Tensor& y,
                               const TrainStepParts& parts);

}  // namespace kiln::models
