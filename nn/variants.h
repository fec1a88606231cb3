// The decoder's layer variants, as enums: which norm, which MLP shape, which
// activation. Each has the name it has in kiln's config JSON (and, for the
// activation, in Hugging Face's config.json `hidden_act`) and a parser that
// returns nullopt for a name it does not know, so callers can refuse it by name.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kernels/op_list.h"

namespace kiln::nn {

// RmsNorm: x · rsqrt(mean(x²) + eps) · w (LLaMA, Qwen). LayerNorm: with a bias
// (GPT-2).
enum class NormKind { RmsNorm, LayerNorm };

// Gated: down(act(gate(x)) * up(x)) (LLaMA, Qwen; SwiGLU with silu).
// Plain: proj(act(fc(x))) (GPT-2).
enum class MlpKind { Gated, Plain };

// The MLP's activation: one of the pointwise activation ops (kernels/op_list.h: kActivations),
// named by that list's hf_name column, as Hugging Face's `hidden_act` names it: silu; gelu, the
// exact erf form; gelu_pytorch_tanh, the tanh approximation (GPT-2's gelu_new). An alias of Op,
// not a second list, so a new activation is usable here with no edit.
using MlpActivation = Op;

inline const char* norm_kind_name(NormKind k) {
  return k == NormKind::LayerNorm ? "layernorm" : "rmsnorm";
}
inline std::optional<NormKind> parse_norm_kind(std::string_view s) {
  if (s == "rmsnorm") return NormKind::RmsNorm;
  if (s == "layernorm") return NormKind::LayerNorm;
  return std::nullopt;
}

inline const char* mlp_kind_name(MlpKind k) { return k == MlpKind::Plain ? "plain" : "gated"; }
inline std::optional<MlpKind> parse_mlp_kind(std::string_view s) {
  if (s == "gated") return MlpKind::Gated;
  if (s == "plain") return MlpKind::Plain;
  return std::nullopt;
}

inline std::string_view mlp_activation_name(MlpActivation a) { return op_hf_name(a); }
// The names mlp_activation_name() gives, for messages: "silu, gelu_pytorch_tanh, gelu".
inline std::string mlp_activation_names() {
  std::string names;
  for (Op a : kActivations) names += (names.empty() ? "" : ", ") + std::string(op_hf_name(a));
  return names;
}
inline std::optional<MlpActivation> parse_mlp_activation(std::string_view s) {
  for (Op a : kActivations)
    if (s == op_hf_name(a)) return a;
  return std::nullopt;
}

}  // namespace kiln::nn
