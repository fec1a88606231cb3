#include "nn/module.h"

#include <fmt/format.h>

#include <set>

namespace kiln::nn {

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  t.set_requires_grad(true);
  t.set_name(name);
  params_.emplace_back(name, std::move(t));
  return params_.back().second;
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> sd;
  for (auto& [n, t] : named_parameters()) sd.emplace(n, t);
  return sd;
}

void assign_data(Tensor& dst, const Tensor& src) {
  TensorImpl* d = dst.impl();
  const TensorImpl* s = src.impl();
  d->storage = s->storage;
  d->offset = s->offset;
  d->shape = s->shape;
  d->strides = s->strides;
  d->dtype = s->dtype;
  d->grad.reset();
}

void Module::load_state_dict(const std::map<std::string, Tensor>& sd, bool strict) {
  auto params = named_parameters();
  std::vector<std::string> missing, mis_shaped, unexpected;
  std::set<std::string> known;
  for (auto& [name, p] : params) {
    known.insert(name);
    auto it = sd.find(name);
    if (it == sd.end()) {
      missing.push_back(name);
      continue;
    }
    if (it->second.shape() != p.shape()) {
      mis_shaped.push_back(fmt::format("{} (file {}, model {})", name,
                                       shape_str(it->second.shape()), shape_str(p.shape())));
      continue;
    }
  }
  for (auto& [name, t] : sd)
    if (!known.count(name)) unexpected.push_back(name);
  if (!mis_shaped.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::string msg = "[load_state_dict] state dict does not match the model:";
    if (!missing.empty()) msg += fmt::format("\n  missing: {}", fmt::join(missing, ", "));
    if (!unexpected.empty()) msg += fmt::format("\n  unexpected: {}", fmt::join(unexpected, ", "));
    if (!mis_shaped.empty()) msg += fmt::format("\n  wrong shape: {}", fmt::join(mis_shaped, ", "));
    fail("{}", msg);
  }
  for (auto& [name, p] : params) {
    auto it = sd.find(name);
    if (it == sd.end()) continue;
    MemoryScope scope(MemCategory::Weights);
    Tensor fresh = Tensor::empty(p.shape(), p.dtype(), p.device());
    fresh.copy_(it->second.device() == p.device() ? it->second : it->second.to(p.device()));
    assign_data(p, fresh);
  }
}

void Module::to(Device device, DType dtype_) {
  for (auto& [name, p] : named_parameters()) {
    // Quantized weights (GGML blocks in a Bool tensor) move but keep their bytes.
    const DType dtype = is_floating(p.dtype()) ? dtype_ : p.dtype();
    if (p.device() == device && p.dtype() == dtype) continue;
    MemoryScope scope(MemCategory::Weights);
    Tensor moved = p.to(device, dtype);
    assign_data(p, moved);
  }
}

void Module::to(DType dtype) {
  for (auto& [name, p] : named_parameters()) {
    if (p.dtype() == dtype || !is_floating(p.dtype())) continue;
    MemoryScope scope(MemCategory::Weights);
    assign_data(p, p.to(dtype));
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad() {
  for (auto& [name, p] : named_parameters()) {
    Tensor g = p.grad();
    if (g.defined()) ops::fill_(g, 0.0);
  }
}

}  // namespace kiln::nn
