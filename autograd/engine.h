// The backward engine.
#pragma once

#include <functional>
#include <vector>

#include "autograd/node.h"

namespace kiln {

// Backpropagates from `roots` (each with its upstream gradient; an undefined
// gradient for a scalar root means 1). Leaf gradients accumulate into .grad,
// charged to MemCategory::Gradients. The graph is consumed: saved tensors are
// released as nodes run.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {});
inline void backward(const Tensor& loss) { backward(std::vector<Tensor>{loss}); }

// Called during backward, on the thread that runs it, once for each leaf that requires grad as
// soon as its .grad is final for this pass: every node with an edge to the leaf has run. Data
// parallelism (nn/data_parallel.h) starts a bucket's all-reduce here, so that it overlaps the rest
// of backward. Leaves that no node reached are not reported.
using GradReadyHook = std::function<void(TensorImpl* leaf)>;
// Installs `hook` for the backward passes run by this thread while the scope lives.
class GradReadyHookScope {
 public:
  explicit GradReadyHookScope(GradReadyHook hook);
  ~GradReadyHookScope();
  GradReadyHookScope(const GradReadyHookScope&) = delete;
  GradReadyHookScope& operator=(const GradReadyHookScope&) = delete;

 private:
  GradReadyHook prev_;
};

// Backpropagates from roots and returns the gradients w.r.t. `inputs`
// (which must be part of the graph); leaves accumulate as usual.
std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& inputs);

}  // namespace kiln
