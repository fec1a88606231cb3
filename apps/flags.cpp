#include "apps/flags.h"

#include "kernels/common/error.h"
#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"

namespace kiln::apps {

Device resolve_device(const std::string& spec, std::string_view who) {
  if (spec == "auto") {
    if (cuda::device_count() > 0) {
      cuda::set_device(0);
      return Device::cuda(0);
    }
    return Device::cpu();
  }
  Device d;
  try {
    d = Device::parse(spec);
  } catch (const Error&) {
    fail("[{}] unknown device '{}' (auto, cpu, cuda or cuda:N)", who, spec);
  }
  KILN_CHECK(!d.is_meta(), "[{}] --device meta runs nothing; use cpu or cuda", who);
  if (!d.is_cuda()) return d;
  KILN_CHECK(cuda::compiled_with_cuda(),
             "[{}] --device {}: this kiln was built without CUDA (configure with -DKILN_CUDA=ON); "
             "use --device cpu",
             who, spec);
  const int n = cuda::device_count();
  KILN_CHECK(n > 0,
             "[{}] --device {}: no CUDA device found (no NVIDIA driver, or no GPU visible); use "
             "--device cpu",
             who, spec);
  KILN_CHECK(d.index >= 0 && d.index < n, "[{}] --device {}: only {} CUDA device(s) visible", who,
             spec, n);
  cuda::set_device(d.index);
  return d;
}

DType resolve_train_dtype(const std::string& spec, Device device) {
  if (spec == "auto") return device.is_cuda() ? DType::BF16 : DType::F32;
  if (spec == "f32" || spec == "fp32") return DType::F32;
  if (spec == "bf16") return DType::BF16;
  fail("[train] unknown dtype '{}' (auto, f32 or bf16)", spec);
}

void set_attention_from_flag(const std::string& impl, std::string_view who) {
  if (impl == "kiln")
    ops::set_attention_impl(ops::AttentionImpl::Kiln);
  else if (impl == "cudnn")
    ops::set_attention_impl(ops::AttentionImpl::Cudnn);
  else
    fail("[{}] unknown attention '{}' (kiln or cudnn)", who, impl);
}

}  // namespace kiln::apps
