#include "models/mfu.h"

#include "models/param_count.h"

namespace kiln::models {

std::int64_t matmul_params(const ModelConfig& c) {
  const ParamCount pc = count_params(c);
  // The embedding figure holds the input table, an untied head and a learned position table;
  // add the head back once.
  return pc.total - pc.embedding + c.vocab_size * c.dim;
}

double train_flops_per_token(const ModelConfig& c, std::int64_t seq) {
  const double n = static_cast<double>(matmul_params(c));
  const double attn = 12.0 * static_cast<double>(c.n_layers) * static_cast<double>(c.n_heads) *
                      static_cast<double>(c.head_dim) * static_cast<double>(seq);
  return 6.0 * n + attn;
}

double bf16_peak_tflops(std::string_view name) {
  auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
  if (has("H100")) {
    if (has("PCIe")) return 756.0;
    if (has("NVL")) return 0.0;  // not in the table: its datasheet figure is per card pair
    return 989.4;                // SXM: "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"
  }
  if (has("H200")) return has("NVL") ? 0.0 : 989.4;  // "NVIDIA H200", "NVIDIA GH200 480GB"
  return 0.0;
}

double model_flops_utilization(double tokens_per_s, double flops_per_token, double peak_tflops) {
  return peak_tflops > 0 ? tokens_per_s * flops_per_token / (peak_tflops * 1e12) : 0.0;
}

}  // namespace kiln::models
