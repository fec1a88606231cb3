// For backward kernels that accumulate (+=) straight into a parameter's
// gradient, as llm.c does: the .grad buffer of a leaf edge, allocated as zeros
// (MemCategory::Gradients) on first use. Undefined for non-leaf edges, whose
// gradient the node must return instead.
#pragma once

#include "autograd/node.h"

namespace kiln {

Tensor leaf_grad_buffer(const Edge& e);

}  // namespace kiln
