#include "autograd/engine.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/grad_buffer.h"
#include "tensor/ops.h"

namespace kiln {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<std::uint64_t> g_seq{0};
// Leaves whose gradient is returned by grad() instead of accumulated.
thread_local std::unordered_map<TensorImpl*, Tensor>* t_capture = nullptr;
thread_local GradReadyHook t_grad_ready;
}  // namespace

GradReadyHookScope::GradReadyHookScope(GradReadyHook hook) : prev_(std::move(t_grad_ready)) {
  t_grad_ready = std::move(hook);
}
GradReadyHookScope::~GradReadyHookScope() { t_grad_ready = std::move(prev_); }

Node::Node() : seq(g_seq.fetch_add(1)) {}

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.impl()->output_nr, nullptr};
  return {nullptr, 0, t.impl_ptr()};
}

void attach(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
            std::initializer_list<Tensor*> outputs) {
  node->next.clear();
  for (const Tensor* t : inputs) node->next.push_back(t ? edge_of(*t) : Edge{});
  int i = 0;
  for (Tensor* o : outputs) {
    o->impl()->requires_grad = true;
    o->impl()->grad_fn = node;
    o->impl()->output_nr = i++;
  }
}

Tensor leaf_grad_buffer(const Edge& e) {
  if (!e.leaf) return {};
  if (t_capture && t_capture->count(e.leaf.get())) return {};
  TensorImpl* leaf = e.leaf.get();
  if (!leaf->grad) {
    MemoryScope scope(MemCategory::Gradients);
    Tensor g = ops::zeros(leaf->shape, leaf->dtype, leaf->storage->device());
    leaf->grad = g.impl_ptr();
  }
  return Tensor(leaf->grad);
}

static void accumulate_leaf(const Edge& e, const Tensor& g) {
  TensorImpl* leaf = e.leaf.get();
  if (t_capture) {
    auto it = t_capture->find(leaf);
    if (it != t_capture->end()) {
      it->second = it->second.defined() ? ops::add(it->second, g) : g;
      return;
    }
  }
  KILN_CHECK(g.shape() == leaf->shape, "[autograd] gradient {} for leaf {} of shape {}",
             shape_str(g.shape()), leaf->name, shape_str(leaf->shape));
  if (!leaf->grad) {
    MemoryScope scope(MemCategory::Gradients);
    Tensor buf = Tensor::empty(leaf->shape, leaf->dtype, leaf->storage->device());
    buf.copy_(g);
    leaf->grad = buf.impl_ptr();
    return;
  }
  Tensor buf(leaf->grad);
  ops::axpy_(buf, 1.0, g);
}

static void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  PhaseScope phase(Phase::Backward);
  MemoryScope scratch(MemCategory::Temporaries);
  struct Later {
    bool operator()(const Node* a, const Node* b) const { return a->seq < b->seq; }
  };
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::priority_queue<Node*, std::vector<Node*>, Later> ready;

  // Count, for every node reachable from the roots, the edges that point at it.
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const auto& r : roots)
    if (r.grad_fn() && seen.insert(r.grad_fn().get()).second) stack.push_back(r.grad_fn().get());
  // With a grad-ready hook: how many edges of reachable nodes point at each leaf still to run.
  const bool report_leaves = t_grad_ready && !t_capture;
  std::unordered_map<TensorImpl*, int> leaf_uses;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (report_leaves && e.leaf) leaf_uses[e.leaf.get()]++;
      if (!e.fn) continue;
      deps[e.fn.get()]++;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  auto add_grad = [&](Node* n, int slot, const Tensor& g) {
    auto& buf = buffers[n];
    if (buf.empty()) buf.resize(static_cast<std::size_t>(n->num_outputs()));
    buf[slot] = buf[slot].defined() ? ops::add(buf[slot], g) : g;
  };

  for (std::size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    KILN_CHECK(r.requires_grad(), "[autograd] backward() on a tensor that does not require grad");
    Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (!g.defined()) {
      KILN_CHECK(r.numel() == 1, "[autograd] an implicit gradient needs a scalar, got shape {}",
                 shape_str(r.shape()));
      g = ops::ones(r.shape(), r.dtype(), r.device());
    }
    if (!r.grad_fn()) {
      accumulate_leaf(edge_of(r), g);
      continue;
    }
    add_grad(r.grad_fn().get(), r.impl()->output_nr, g);
  }
  for (const auto& r : roots)
    if (r.grad_fn() && deps[r.grad_fn().get()] == 0) {
      deps[r.grad_fn().get()] = -1;  // queued
      ready.push(r.grad_fn().get());
    }

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> in = std::move(buffers[n]);
    buffers.erase(n);
    in.resize(static_cast<std::size_t>(n->num_outputs()));
    std::vector<Tensor> out;
    {
      MemLabelScope label(n->name().data());
      out = n->backward(in);
    }
    in.clear();
    n->release();
    KILN_CHECK(out.size() == n->next.size(), "[autograd] {} returned {} grads for {} inputs",
               n->name(), out.size(), n->next.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      const Edge& e = n->next[i];
      if (!e.valid()) continue;
      if (out[i].defined()) {
        if (e.leaf)
          accumulate_leaf(e, out[i]);
        else
          add_grad(e.fn.get(), e.input_nr, out[i]);
      }
      out[i] = Tensor();
      if (e.fn && --deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
    // After the loop: a node may write a leaf's .grad itself (leaf_grad_buffer) without
    // returning a gradient for the edge.
    if (report_leaves)
      for (const Edge& e : n->next)
        if (e.leaf && --leaf_uses[e.leaf.get()] == 0) t_grad_ready(e.leaf.get());
  }
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  run_backward(roots, grads);
}

std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& inputs) {
  std::unordered_map<TensorImpl*, Tensor> capture;
  for (const auto& t : inputs) {
    KILN_CHECK(t.is_leaf() && t.requires_grad(), "[autograd] grad() inputs must be leaves");
    capture[t.impl()] = Tensor();
  }
  auto* prev = t_capture;
  t_capture = &capture;
  try {
    run_backward(roots, grads);
  } catch (...) {
    t_capture = prev;
    throw;
  }
  t_capture = prev;
  std::vector<Tensor> out;
  for (const auto& t : inputs) out.push_back(capture[t.impl()]);
  return out;
}

}  // namespace kiln
