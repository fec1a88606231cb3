// The kernel table's non-template half: the registration list, the one-time registration of
// every backend (and of the kernels that name their registrations), and the conversions run()
// makes.
#include "tensor/kernel_table.h"

#include <algorithm>
#include <mutex>

#include "tensor/op_args.h"
#include "tensor/storage.h"

namespace kiln::ops {

namespace {

std::vector<Registration>& registration_list() {
  static std::vector<Registration> list;
  return list;
}

std::string_view device_type_name(DeviceType d) {
  switch (d) {
    case DeviceType::CPU:
      return "cpu";
    case DeviceType::CUDA:
      return "cuda";
    case DeviceType::Meta:
      return "meta";
  }
  return "?";
}

}  // namespace

const std::vector<Registration>& registrations() {
  detail::ensure_registered();
  return registration_list();
}

DeviceType kernel_device(Device d) { return d.is_meta() ? meta_simulates() : d.type; }

namespace detail {

void note_registration(const Registration& r, bool present) {
  auto& list = registration_list();
  auto it = std::find_if(list.begin(), list.end(), [&](const Registration& o) {
    return o.kernel == r.kernel && o.device == r.device && o.dtype == r.dtype;
  });
  if (it != list.end()) list.erase(it);
  // An entry replaced by an empty one (a test restoring "nothing registered") is no kernel.
  if (present) list.push_back(r);
}

// The kernels whose arguments name their own registrations (op_args.h: a static register_cpu()
// and register_cuda(), defined beside the kernels in their glue files). A new op family
// registered this way edits no backend list.
template <class... A>
void register_named(KernelList<A...>) {
  (
      [] {
        if constexpr (requires { A::register_cpu(); }) A::register_cpu();
        if constexpr (requires { A::register_cuda(); }) A::register_cuda();
      }(),
      ...);
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_cpu_kernels();
    register_cuda_kernels();
    register_named(AllKernels{});
  });
}

std::string no_kernel_message(std::string_view kernel, DeviceType dev, DType dt) {
  return fmt::format("[{}] no {} kernel takes {} tensors", kernel, device_type_name(dev),
                     dtype_name(dt));
}

void no_kernel(std::string_view kernel, DeviceType dev, DType dt) {
  fail("{}", no_kernel_message(kernel, dev, dt));
}

void not_runnable(std::string_view kernel, DeviceType dev, DType dt) {
  fail("[{}] the {} {} kernel is not built in (kiln was built without it)", kernel,
       device_type_name(dev), dtype_name(dt));
}

Tensor prepare_input(const Tensor& t, DType want, bool dense) {
  if (t.dtype() != want) return t.to(want).contiguous();
  return dense ? t.contiguous() : t;
}

void charge_scratch(const ScratchList& bytes, Device meta) {
  MemoryScope scratch(MemCategory::Temporaries);
  std::vector<Tensor> alive;  // alive together for the call, as the kernel's buffers are
  for (std::int64_t n : bytes)
    if (n > 0) alive.push_back(Tensor::empty({n}, DType::Bool, meta));
}

}  // namespace detail
}  // namespace kiln::ops
