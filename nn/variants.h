// The decoder's layer variants, as enums: which norm, which MLP shape, which
// activation. Each has the name it has in kiln's config JSON (and, for the
// activation, in Hugging Face's config.json `hidden_act`) and a parser that
// returns nullopt for a name it does not know, so callers can refuse it by name.
#pragma once

#include <optional>
#include <string_view>

namespace kiln::nn {

// RmsNorm: x · rsqrt(mean(x²) + eps) · w (LLaMA, Qwen). LayerNorm: with a bias
// (GPT-2).
enum class NormKind { RmsNorm, LayerNorm };

// Gated: down(act(gate(x)) * up(x)) (LLaMA, Qwen; SwiGLU with silu).
// Plain: proj(act(fc(x))) (GPT-2).
enum class MlpKind { Gated, Plain };

// The MLP's activation, by Hugging Face's names: silu; gelu, the exact erf
// form; gelu_pytorch_tanh, the tanh approximation (GPT-2's gelu_new).
enum class MlpActivation { Silu, Gelu, GeluTanh };

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

inline const char* mlp_activation_name(MlpActivation a) {
  switch (a) {
    case MlpActivation::Silu:
      return "silu";
    case MlpActivation::Gelu:
      return "gelu";
    case MlpActivation::GeluTanh:
      return "gelu_pytorch_tanh";
  }
  return "?";
}
// The names mlp_activation_name() gives, for messages.
inline constexpr const char* kMlpActivationNames = "silu, gelu, gelu_pytorch_tanh";
inline std::optional<MlpActivation> parse_mlp_activation(std::string_view s) {
  for (MlpActivation a : {MlpActivation::Silu, MlpActivation::Gelu, MlpActivation::GeluTanh})
    if (s == mlp_activation_name(a)) return a;
  return std::nullopt;
}

}  // namespace kiln::nn
