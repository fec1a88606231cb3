// The one list of op families. Each kernel op (tensor/op_args.h: the arguments one kernel
// takes, e.g. softmax and softmax_backward) belongs to one family here. Backends register
// kernels per kernel op, device type and dtype in one table (tensor/kernel_table.h), and the
// coverage test (tests/tensor/test_coverage.cpp) reads that table: a family without a CPU
// kernel, a CUDA kernel (in a CUDA build) or a backend-ops case fails it.
// docs/adding_an_op.md is the path for a new op.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <utility>

namespace kiln {

enum class Op : int {
  Gemm,          // gemm, matmul, linear (OpenBLAS / cuBLASLt)
  Copy,          // strided copy with dtype conversion (contiguous(), to())
  Fill,          // constant fill
  Binary,        // broadcasting add/sub/mul/div/max/min; axpy
  Unary,         // neg, exp, log, sqrt, rsqrt, abs, square, ...; affine, scale
  Reduce,        // sum/mean/max/min over one dim, argmax, sum_all, sum_squares
  Softmax,       // softmax / log-softmax forward and backward over the last dim
  Embedding,     // gather rows forward, scatter-add backward
  RmsNorm,       // RMSNorm forward/backward
  LayerNorm,     // LayerNorm (bias optional) forward/backward
  Rope,          // rotary embedding, interleaved (llama2.c) or rotate-half (HF), and its tables
  Silu,          // x * sigmoid(x)
  GeluTanh,      // GELU, tanh approximation (HF gelu_pytorch_tanh, GPT-2's gelu_new)
  Gelu,          // GELU, exact: 0.5 x (1 + erf(x / sqrt 2)) (HF gelu)
  SwiGlu,        // silu(gate) * up
  Attention,     // causal attention with GQA, forward/backward, saves log-sum-exp
  CrossEntropy,  // fused log-softmax + NLL, forward/backward, ignore-index
  Dropout,       // Philox mask, forward/backward
  AdamW,         // fused AdamW step, single and multi-tensor
  Sgd,           // SGD with momentum step
  Random,        // Philox normal / uniform init
  Dequantize,    // GGML quantized blocks (Q8_0, Q4_K, Q6_K): to float weights, linear on them
  Count
};

struct OpInfo {
  Op op;
  std::string_view name;
  std::string_view family;    // kernels/<backend>/<family>.{cpp,cu}
  std::string_view backward;  // the backward kernel's name, for pointwise ops
  // For an activation (kActivations): its name as Hugging Face's config.json `hidden_act` spells
  // it, which is also kiln's config name for it (nn/variants.h reads this column).
  std::string_view hf_name = "";
};

inline constexpr std::array<OpInfo, static_cast<std::size_t>(Op::Count)> kOpList = {{
    {Op::Gemm, "gemm", "matmul", ""},
    {Op::Copy, "copy", "copy", ""},
    {Op::Fill, "fill", "copy", ""},
    {Op::Binary, "binary", "elementwise", ""},
    {Op::Unary, "unary", "elementwise", ""},
    {Op::Reduce, "reduce", "reduce", ""},
    {Op::Softmax, "softmax", "softmax", "softmax_backward"},
    {Op::Embedding, "embedding", "embedding", "embedding_backward"},
    {Op::RmsNorm, "rmsnorm", "norm", "rmsnorm_backward"},
    {Op::LayerNorm, "layernorm", "norm", "layernorm_backward"},
    {Op::Rope, "rope", "rope", ""},
    {Op::Silu, "silu", "activation", "silu_backward", "silu"},
    {Op::GeluTanh, "gelu_tanh", "activation", "gelu_tanh_backward", "gelu_pytorch_tanh"},
    {Op::Gelu, "gelu", "activation", "gelu_backward", "gelu"},
    {Op::SwiGlu, "swiglu", "activation", "swiglu_backward"},
    {Op::Attention, "attention", "attention", "attention_backward"},
    {Op::CrossEntropy, "cross_entropy", "cross_entropy", "cross_entropy_backward"},
    {Op::Dropout, "dropout", "dropout", "dropout_backward"},
    {Op::AdamW, "adamw", "optimizer", ""},
    {Op::Sgd, "sgd", "optimizer", ""},
    {Op::Random, "random", "random", ""},
    {Op::Dequantize, "dequantize", "quant", ""},
}};

// kOpList is indexed by Op: each row must sit at its op's position.
constexpr bool op_list_in_op_order() {
  for (std::size_t i = 0; i < kOpList.size(); ++i)
    if (kOpList[i].op != static_cast<Op>(i)) return false;
  return true;
}
static_assert(op_list_in_op_order(), "kOpList must list every Op at the position of its value");

constexpr std::string_view op_name(Op op) { return kOpList[static_cast<std::size_t>(op)].name; }
constexpr std::string_view op_backward_name(Op op) {
  return kOpList[static_cast<std::size_t>(op)].backward;
}

// The pointwise activations, y = act(x) and dx = dy act'(x). One kernel template per backend
// runs each from its scalar math (kernels/common/activation_math.h: act::Math<op>), and the
// dispatcher, front end, autograd and tests iterate this list: a new activation is its rows here
// and its math there (docs/adding_an_op.md).
inline constexpr std::array kActivations = {Op::Silu, Op::GeluTanh, Op::Gelu};

constexpr bool is_activation(Op op) {
  for (Op a : kActivations)
    if (a == op) return true;
  return false;
}

// Every activation has its Hugging Face name, and no other op has one.
constexpr bool activations_have_hf_names() {
  for (const OpInfo& info : kOpList)
    if (info.hf_name.empty() == is_activation(info.op)) return false;
  return true;
}
static_assert(activations_have_hf_names(), "every activation (and only they) needs an hf_name");

constexpr std::string_view op_hf_name(Op op) {
  return kOpList[static_cast<std::size_t>(op)].hf_name;
}

// Calls f.template operator()<O>() for every activation O, in list order.
template <class F>
constexpr void for_each_activation(F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (f.template operator()<kActivations[I]>(), ...);
  }
  (std::make_index_sequence<kActivations.size()>{});
}

}  // namespace kiln
