// Model FLOPs utilization (MFU): the training FLOPs per token of a config and the GPUs' dense bf16
// peaks, for the trainer's log line and bench/'s JSON (bench/ links models/, so both read this one
// table). The peaks are datasheet figures quoted for MFU, which is why they live here and not in
// kernels/cuda/runtime: DeviceInfo::bf16_peak_tflops there is a measured rate, never a name lookup.
#pragma once

#include <cstdint>
#include <string_view>

#include "models/config.h"

namespace kiln::models {

// Training FLOPs per token, PaLM's convention (Chowdhery et al. 2022, appendix B):
//     6·N + 12·L·H·Dh·T
// N: the parameters that take part in a matmul: every parameter except the input embedding
//    table (and a learned position table), with the LM head counted once, whether tied to the
//    embedding or not (its V·C product runs either way). 6·N = 2 (multiply-add) x 3 (forward,
//    and backward's two products) per parameter.
// 12·L·H·Dh·T: the attention products QK^T and AV (2·2·T·H·Dh per token and layer forward,
//    x3 with backward), with the full T: the causal mask's halving is not discounted, as PaLM
//    and nanoGPT count.
// Norms, activations, softmax, RoPE and the loss are not counted (the convention's choice).
double train_flops_per_token(const ModelConfig& c, std::int64_t seq);
// N above.
std::int64_t matmul_params(const ModelConfig& c);
// Dense bf16 tensor-core peak in TFLOP/s by CUDA device name, from NVIDIA's datasheets
// (without sparsity): H100 SXM 989.4, H100 PCIe 756, H200 (and GH200) 989.4. 0 when the name
// is not in the table: pass --peak-tflops then. MFU = tokens/s · flops/token / peak, also in
// f32 mode (the bf16 peak stays the reference).
double bf16_peak_tflops(std::string_view device_name);
// tokens/s · flops/token / peak, as a fraction; 0 when the peak is unknown (0).
double model_flops_utilization(double tokens_per_s, double flops_per_token, double peak_tflops);

}  // namespace kiln::models
