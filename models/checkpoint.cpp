#include "models/checkpoint.h"

#include <cstring>
#include <map>

#include "models/io/checkpoint_h5.h"

namespace kiln::models {

namespace {

std::vector<std::int64_t> to_vec(const Shape& s) { return {s.begin(), s.end()}; }

void read_into(const io::CheckpointReader& r, const std::string& path, Tensor& dst) {
  io::TensorInfo info = r.tensor_info(path);
  KILN_CHECK(info.dtype == "F32", "[checkpoint] {} is {}, expected F32", path, info.dtype);
  KILN_CHECK(Shape(info.shape.begin(), info.shape.end()) == dst.shape(),
             "[checkpoint] {} has shape {}, the model expects {}", path,
             shape_str(Shape(info.shape.begin(), info.shape.end())), shape_str(dst.shape()));
  KILN_CHECK(dst.dtype() == DType::F32 && dst.is_contiguous() && dst.device().is_cpu(),
             "[checkpoint] loading needs contiguous f32 CPU tensors");
  r.read_tensor_into(path, dst.raw_data(), dst.nbytes());
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

void save_checkpoint(const std::string& path, const DecoderModel& model,
                     const nn::Optimizer* opt, const TrainState& st) {
  io::CheckpointWriter w;
  std::vector<Tensor> keep;  // the writer borrows data until write()
  // With mixed precision the f32 master copies are the weights to keep.
  std::map<std::string, Tensor> masters;
  if (opt)
    for (const auto& s : opt->state())
      if (s.master.defined()) masters[s.name] = s.master;
  for (auto& [name, p] : model.named_parameters()) {
    auto mit = masters.find(name);
    const Tensor& src = mit != masters.end() ? mit->second : p;
    Tensor c = src.to(Device::cpu(), DType::F32).contiguous();
    keep.push_back(c);
    w.add_tensor("model/" + name, "F32", to_vec(c.shape()), c.raw_data());
  }
  if (opt) {
    for (const auto& s : opt->state()) {
      if (s.m.defined()) w.add_tensor("optim_m/" + s.name, "F32", to_vec(s.m.shape()), s.m.raw_data());
      if (s.v.defined()) w.add_tensor("optim_v/" + s.name, "F32", to_vec(s.v.shape()), s.v.raw_data());
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
  w.set_attr_string("args", st.args.dump());
  w.add_bytes("tokenizer", std::vector<std::uint8_t>(st.tokenizer_data.begin(), st.tokenizer_data.end()));
  w.write(path);
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  io::CheckpointReader r(path);
  CheckpointMeta m;
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(r.get_attr_string("config"));
    m.state.args = nlohmann::json::parse(r.get_attr_string("args"));
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}: bad config JSON: {}", path, e.what());
  }
  m.config = ModelConfig::from_json(cfg);
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
    if (p.dtype() == DType::F32) {
      Tensor dst = p;
      read_into(r, "model/" + name, dst);
      continue;
    }
    // Low-precision parameter: read the f32 values, round them into it, and
    // keep them exactly in the optimizer's master copy if there is one.
    // (No lambda here: clang 14, which builds the fuzz targets, cannot capture the binding p.)
    auto mit = masters.find(name);
    Tensor f32;
    if (mit != masters.end()) {
      f32 = mit->second;
    } else {
      MemoryScope scratch(MemCategory::Temporaries);
      f32 = Tensor::empty(p.shape(), DType::F32);
    }
    read_into(r, "model/" + name, f32);
    p.copy_(f32);
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
