// What the layers above ask of a device without testing its type themselves (models/ and apps/
// hold no device branches): wait for its queued work, name it, and read its memory as its driver
// sees it. Each answers for every device type; the meta device, which runs nothing, answers as
// the CPU does.
#pragma once

#include <optional>
#include <string>

#include "tensor/device.h"
#include "tensor/memory.h"

namespace kiln {

// Returns when every kernel queued on d has finished: CUDA launches are asynchronous, so a
// timer is read only after this. CPU and meta ops return finished: nothing to wait for.
void synchronize(Device d);

// The GPU's name on CUDA ("NVIDIA H200"); empty for the CPU and meta.
std::string device_model_name(Device d);

// The device for a log line: "cuda:0 (NVIDIA H200)" (with its index always, which GPU of
// several), "cpu (avx512bf16: ...), 2 threads", "meta".
std::string describe_device(Device d);

// The driver's view of a CUDA device's memory beside kiln's allocator (cuda_device_memory);
// none for the CPU and meta, whose memory kiln's tracker alone accounts for.
std::optional<DeviceMemoryRows> driver_memory(Device d);

}  // namespace kiln
