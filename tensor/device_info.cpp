#include "tensor/device_info.h"

#include <fmt/format.h>
#include <omp.h>

#include "kernels/cpu/isa.h"
#include "kernels/cuda/runtime.h"
#include "tensor/caching_allocator.h"

namespace kiln {

void synchronize(Device d) {
  if (d.is_cuda()) cuda::device_synchronize();
}

std::string device_model_name(Device d) {
  return d.is_cuda() ? cuda::device_info(d.index).name : std::string();
}

std::string describe_device(Device d) {
  switch (d.type) {
    case DeviceType::CUDA:
      return fmt::format("cuda:{} ({})", d.index, device_model_name(d));
    case DeviceType::CPU:
      return fmt::format("cpu ({}), {} threads", cpu::cpu_isa_summary(), omp_get_max_threads());
    case DeviceType::Meta:
      break;
  }
  return d.str();
}

std::optional<DeviceMemoryRows> driver_memory(Device d) {
  if (!d.is_cuda()) return std::nullopt;
  return cuda_device_memory(d.index);
}

}  // namespace kiln
