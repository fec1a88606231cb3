#include "models/train_step.h"

#include <cmath>
#include <optional>

#include "tensor/memory.h"

namespace kiln::models {

TrainStepResult run_train_step(DecoderModel& model, const Tensor& x, const Tensor& y,
                               const TrainStepParts& parts) {
  Tensor loss;
  {
    MemoryScope scope(MemCategory::Activations);
    PhaseScope phase(Phase::Forward);
    loss = model.loss(x, y);
  }
  {
    std::optional<GradReadyHookScope> hook;
    if (parts.grad_ready) hook.emplace(parts.grad_ready);
    backward(loss);
  }
  if (parts.after_backward) parts.after_backward();
  TrainStepResult r;
  if (!loss.device().is_meta()) {
    r.loss = loss.item();
    if (parts.reduce_loss) r.loss = parts.reduce_loss(r.loss);
  }
  loss = Tensor();
  r.norm = std::isfinite(r.loss) ? parts.clip() : NAN;
  r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.norm);
  if (!r.skipped) parts.update();
  parts.zero_grad();
  return r;
}

}  // namespace kiln::models
