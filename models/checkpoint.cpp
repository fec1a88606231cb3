#include "models/checkpoint.h"

#include <cstring>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>

#include "models/io/checkpoint_h5.h"
#include "models/io/json_limits.h"
#include "tensor/host_bytes.h"

namespace kiln::models {

namespace {

std::vector<std::int64_t> to_vec(const Shape& s) { return {s.begin(), s.end()}; }

// Reads the f32 tensor at `path` into dst, on any device and in any float dtype: straight into a
// contiguous f32 CPU tensor, else through an f32 CPU buffer (Temporaries) copied into dst (to the
// device, rounded into a bf16 tensor).
void read_into(const io::CheckpointReader& r, const std::string& path, Tensor& dst) {
  io::TensorInfo info = r.tensor_info(path);
  KILN_CHECK(info.dtype == "F32", "[checkpoint] {} is {}, expected F32", path, info.dtype);
  KILN_CHECK(Shape(info.shape.begin(), info.shape.end()) == dst.shape(),
             "[checkpoint] {} has shape {}, the model expects {}", path,
             shape_str(Shape(info.shape.begin(), info.shape.end())), shape_str(dst.shape()));
  if (void* direct = host_dense_data(dst, DType::F32)) {
    r.read_tensor_into(path, direct, dst.nbytes());
    return;
  }
  Tensor host;
  {
    MemoryScope scratch(MemCategory::Temporaries);
    host = Tensor::empty(dst.shape(), DType::F32);
  }
  r.read_tensor_into(path, host.raw_data(), host.nbytes());
  dst.copy_(host);
}

// An f32 CPU copy of t (t itself when it is one already), kept alive in `keep` until write().
const Tensor& host_f32(const Tensor& t, std::deque<Tensor>& keep) {
  keep.push_back(t.to(Device::cpu(), DType::F32).contiguous());
  return keep.back();
}

}  // namespace

std::unique_ptr<io::Tokenizer> run_tokenizer(const std::string& spec,
                                             const std::string& saved_vocab,
                                             const std::string& training_text) {
  if (spec == "char" && !saved_vocab.empty())
    return std::make_unique<io::CharTokenizer>(io::CharTokenizer::from_serialized(saved_vocab));
  KILN_CHECK(spec != "char" || !training_text.empty(),
             "[checkpoint] a char tokenizer needs the vocabulary saved in the checkpoint");
  return io::make_tokenizer(spec, training_text);
}

void save_checkpoint(const std::string& path, const DecoderModel& model, const nn::Optimizer* opt,
                     const TrainState& st) {
  io::CheckpointWriter w;
  std::deque<Tensor> keep;  // the writer borrows data until write(); a deque keeps references
  // With mixed precision the f32 master copies are the weights to keep.
  std::map<std::string, Tensor> masters;
  if (opt)
    for (const auto& s : opt->state())
      if (s.master.defined()) masters[s.name] = s.master;
  for (auto& [name, p] : model.named_parameters()) {
    auto mit = masters.find(name);
    const Tensor& c = host_f32(mit != masters.end() ? mit->second : p, keep);
    w.add_tensor("model/" + name, "F32", to_vec(c.shape()), c.raw_data());
  }
  if (opt) {
    for (const auto& s : opt->state()) {
      if (s.m.defined()) {
        const Tensor& m = host_f32(s.m, keep);
        w.add_tensor("optim_m/" + s.name, "F32", to_vec(m.shape()), m.raw_data());
      }
      if (s.v.defined()) {
        const Tensor& v = host_f32(s.v, keep);
        w.add_tensor("optim_v/" + s.name, "F32", to_vec(v.shape()), v.raw_data());
      }
    }
    w.set_attr_i64("optimizer_step", opt->step_count);
  }
  w.set_attr_string("config", model.cfg.to_json().dump());
  w.set_attr_i64("step", st.step);
  w.set_attr_i64("data_seed", static_cast<std::int64_t>(st.data_seed));
  w.set_attr_i64("data_position", static_cast<std::int64_t>(st.data_position));
  w.set_attr_i64("model_seed", static_cast<std::int64_t>(st.model_seed));
  w.set_attr_f64("best_val_loss", st.best_val_loss);
  w.set_attr_string("tokenizer_spec", st.tokenizer_spec);
  w.set_attr_string("args", st.args_json);
  w.add_bytes("tokenizer",
              std::vector<std::uint8_t>(st.tokenizer_data.begin(), st.tokenizer_data.end()));
  w.write(path);
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  io::CheckpointReader r(path);
  CheckpointMeta m;
  // The attributes are kiln's own JSON, but the file may come from anywhere: bounded like any
  // other JSON kiln reads, and a wrongly typed field names the file.
  const nlohmann::json cfg = io::parse_json_limited(
      r.get_attr_string("config"), fmt::format("checkpoint {} attribute 'config'", path));
  // Parsed to check it (bounded, well formed), kept as the text it is.
  m.state.args_json = r.get_attr_string("args");
  (void)io::parse_json_limited(m.state.args_json,
                               fmt::format("checkpoint {} attribute 'args'", path));
  m.config = ModelConfig::from_json(cfg, fmt::format("checkpoint {} attribute 'config'", path));
  m.state.step = r.get_attr_i64("step");
  KILN_CHECK(m.state.step >= 0, "[checkpoint] {}: negative step {}", path, m.state.step);
  m.state.data_seed = static_cast<std::uint64_t>(r.get_attr_i64("data_seed"));
  m.state.data_position = static_cast<std::uint64_t>(r.get_attr_i64("data_position"));
  m.state.model_seed = static_cast<std::uint64_t>(r.get_attr_i64("model_seed"));
  m.state.best_val_loss = r.get_attr_f64("best_val_loss");
  m.state.tokenizer_spec = r.get_attr_string("tokenizer_spec");
  auto tok = r.read_bytes("tokenizer");
  m.state.tokenizer_data.assign(tok.begin(), tok.end());
  m.has_optimizer = r.has_group("optim_m");
  return m;
}

void load_checkpoint(const std::string& path, DecoderModel& model, nn::Optimizer* opt) {
  io::CheckpointReader r(path);
  std::map<std::string, Tensor> masters;
  if (opt)
    for (const auto& s : opt->state())
      if (s.master.defined()) masters[s.name] = s.master;
  for (auto& [name, p] : model.named_parameters()) {
    KILN_CHECK(r.has_tensor("model/" + name), "[checkpoint] {} lacks parameter {}", path, name);
    // A low-precision parameter with a master: the f32 values go exactly into the master and
    // are rounded into the parameter from there, as the optimizer step does. Anything else
    // (f32, or bf16 without a master) is read straight into the parameter.
    auto mit = masters.find(name);
    if (mit != masters.end()) {
      read_into(r, "model/" + name, mit->second);
      p.copy_(mit->second);
    } else {
      read_into(r, "model/" + name, p);
    }
  }
  if (opt) {
    KILN_CHECK(r.has_group("optim_m") && r.has_group("optim_v"),
               "[checkpoint] {} has no optimizer state to resume from", path);
    for (auto& s : opt->state()) {
      if (s.m.defined()) read_into(r, "optim_m/" + s.name, s.m);
      if (s.v.defined()) read_into(r, "optim_v/" + s.name, s.v);
    }
    opt->step_count = r.get_attr_i64("optimizer_step");
    KILN_CHECK(opt->step_count >= 0, "[checkpoint] {}: negative optimizer step", path);
  }
}

}  // namespace kiln::models
