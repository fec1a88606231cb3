// Module: a tree of named parameters with Hugging Face names
// ("model.layers.0.self_attn.q_proj.weight"), state dicts, to() and train/eval.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"

namespace kiln::nn {

class Module {
 public:
  virtual ~Module() = default;

  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::int64_t num_parameters() const;
  std::map<std::string, Tensor> state_dict() const;
  // Copies values into the existing parameters (converting dtype). With
  // strict, missing, unexpected or mis-shaped names fail with one message
  // listing all of them.
  void load_state_dict(const std::map<std::string, Tensor>& sd, bool strict = true);

  // Moves/converts every parameter in place: handles held elsewhere see it.
  void to(Device device, DType dtype);
  void to(DType dtype);
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();  // fills existing .grad buffers with zeros (keeps memory)

 protected:
  Tensor& register_parameter(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Replaces the data of `dst` (shape, dtype, storage) with that of `src`,
// keeping autograd flags and the name: every handle to dst sees the change.
void assign_data(Tensor& dst, const Tensor& src);

}  // namespace kiln::nn
