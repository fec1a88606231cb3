// Command-line strings to the library's types, shared by the subcommands and the bench/
// programs: --device, the training --dtype and --attention. The library below takes the
// resolved Device, DType and attention kernel; only the command line speaks in strings.
#pragma once

#include <string>
#include <string_view>

#include "tensor/device.h"
#include "tensor/dtype.h"

namespace kiln::apps {

// "auto" (cuda:0 when a GPU is visible, else cpu), "cpu", "cuda", "cuda:N". Asking for CUDA
// where there is none fails with a clear "[who] --device ...: ..." message (built without
// CUDA, or no device found); a CUDA device is made current.
Device resolve_device(const std::string& spec, std::string_view who);
// "auto" (bf16 on CUDA, f32 elsewhere), "f32"/"fp32", "bf16".
DType resolve_train_dtype(const std::string& spec, Device device);
// "kiln" | "cudnn" -> ops::set_attention_impl; fails on anything else.
void set_attention_from_flag(const std::string& impl, std::string_view who);

}  // namespace kiln::apps
