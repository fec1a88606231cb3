// Reverse-mode autograd. Each differentiable op records a Node that holds what
// its backward needs and no more; the engine (engine.h) runs nodes in reverse
// topological order and calls release() right after each one, so saved
// activations are freed as backward proceeds.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "tensor/tensor.h"

namespace kiln {

class Node;

// Where the gradient of one op input goes: into another node's output
// `input_nr`, or into a leaf tensor's .grad.
struct Edge {
  std::shared_ptr<Node> fn;
  int input_nr = 0;
  std::shared_ptr<TensorImpl> leaf;  // set for leaves that require grad
  bool valid() const { return fn || leaf; }
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  // grads[i] is the gradient w.r.t. output i (undefined if none flowed).
  // Returns one gradient per input edge (undefined where not needed).
  virtual std::vector<Tensor> backward(std::vector<Tensor>& grads) = 0;
  // Drops saved tensors. Called by the engine right after backward().
  virtual void release() {}
  virtual std::string_view name() const = 0;
  virtual int num_outputs() const { return 1; }

  std::vector<Edge> next;
  std::uint64_t seq;  // creation order: later nodes run first
  // Input shapes are often needed to shape gradients; nodes keep them here.
};

// Grad mode is thread-local. NoGradGuard disables graph recording.
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// True if recording is on and any input needs a gradient.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
// The edge for an input: its grad_fn, or its leaf accumulator, or none.
Edge edge_of(const Tensor& t);
// Wires `node` to the inputs and makes it the grad_fn of the outputs.
void attach(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
            std::initializer_list<Tensor*> outputs);
// attach() for the common single-output op: returns `out` recorded by `node`.
template <typename N>
Tensor record(Tensor out, std::shared_ptr<N> node, std::initializer_list<const Tensor*> inputs) {
  attach(node, inputs, {&out});
  return out;
}

}  // namespace kiln
