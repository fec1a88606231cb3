// The one list of kernel ops. Dispatch, the backend coverage test and the
// per-op tests all read it, so an op without a CPU kernel, a CUDA kernel or a
// test shows up in tests/kernels/test_coverage.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace kiln {

enum class Op : int {
  Gemm,             // C = alpha * op(A) op(B) + beta * C, batched (OpenBLAS / cuBLASLt)
  Copy,             // strided copy with dtype conversion (contiguous(), to())
  Fill,             // constant fill
  Binary,           // broadcasting add/sub/mul/div/max/min
  Unary,            // neg, exp, log, sqrt, rsqrt, abs, square, scale, ...
  Reduce,           // sum/mean/max/min over one dim
  Softmax,          // softmax forward/backward over the last dim
  LogSoftmax,       // log-softmax forward/backward over the last dim
  Embedding,        // gather rows forward, scatter-add backward
  RmsNorm,          // RMSNorm forward/backward
  LayerNorm,        // LayerNorm with bias forward/backward
  Rope,             // rotary embedding, interleaved (llama2.c) or rotate-half (HF)
  Silu,             // x * sigmoid(x)
  Gelu,             // tanh approximation
  SwiGlu,           // silu(gate) * up
  Attention,        // causal attention with GQA, forward/backward, saves log-sum-exp
  CrossEntropy,     // fused log-softmax + NLL, forward/backward, ignore-index
  Dropout,          // Philox mask, forward/backward
  AdamW,            // fused AdamW step
  Sgd,              // SGD with momentum step
  RandomNormal,     // Philox normal init
  RandomUniform,    // Philox uniform init
  Count
};

struct OpInfo {
  Op op;
  std::string_view name;
  std::string_view family;  // kernels/<backend>/<family>.{cpp,cu}
  bool differentiable;      // has a backward kernel or a gradient formula
};

inline constexpr std::array<OpInfo, static_cast<std::size_t>(Op::Count)> kOpList = {{
    {Op::Gemm, "gemm", "matmul", true},
    {Op::Copy, "copy", "copy", true},
    {Op::Fill, "fill", "copy", false},
    {Op::Binary, "binary", "elementwise", true},
    {Op::Unary, "unary", "elementwise", true},
    {Op::Reduce, "reduce", "reduce", true},
    {Op::Softmax, "softmax", "softmax", true},
    {Op::LogSoftmax, "log_softmax", "softmax", true},
    {Op::Embedding, "embedding", "embedding", true},
    {Op::RmsNorm, "rmsnorm", "norm", true},
    {Op::LayerNorm, "layernorm", "norm", true},
    {Op::Rope, "rope", "rope", true},
    {Op::Silu, "silu", "activation", true},
    {Op::Gelu, "gelu", "activation", true},
    {Op::SwiGlu, "swiglu", "activation", true},
    {Op::Attention, "attention", "attention", true},
    {Op::CrossEntropy, "cross_entropy", "cross_entropy", true},
    {Op::Dropout, "dropout", "dropout", true},
    {Op::AdamW, "adamw", "optimizer", false},
    {Op::Sgd, "sgd", "optimizer", false},
    {Op::RandomNormal, "random_normal", "random", false},
    {Op::RandomUniform, "random_uniform", "random", false},
}};

constexpr std::string_view op_name(Op op) { return kOpList[static_cast<std::size_t>(op)].name; }

// Which ops a backend implements. Each backend defines its own in
// kernels/<backend>/registry.cpp; the coverage test checks them against kOpList.
bool cpu_has_kernel(Op op);
bool cuda_has_kernel(Op op);

}  // namespace kiln
