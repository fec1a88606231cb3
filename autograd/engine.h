// The backward engine.
#pragma once

#include <vector>

#include "autograd/node.h"

namespace kiln {

// Backpropagates from `roots` (each with its upstream gradient; an undefined
// gradient for a scalar root means 1). Leaf gradients accumulate into .grad,
// charged to MemCategory::Gradients. The graph is consumed: saved tensors are
// released as nodes run.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {});
inline void backward(const Tensor& loss) { backward(std::vector<Tensor>{loss}); }

// Backpropagates from roots and returns the gradients w.r.t. `inputs`
// (which must be part of the graph); leaves accumulate as usual.
std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& inputs);

}  // namespace kiln
