// Differentiable ops: each records a Node (when grad mode is on and an input
// requires grad) that saves only what its backward needs. Backward uses the
// fused backward kernels of tensor/ops.h where they exist.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "tensor/ops.h"

namespace kiln::ag {

using ops::Binary;
using ops::RopeStyle;
using ops::Unary;

// elementwise (broadcasting)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor affine(const Tensor& x, double alpha, double beta = 0.0);  // alpha * x + beta
Tensor unary(Unary op, const Tensor& x);  // Neg, Exp, Log, Sqrt, Rsqrt, Square, Tanh, Sigmoid, ...

// reductions
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
Tensor sum_all(const Tensor& x);
Tensor mean_all(const Tensor& x);

// views and copies
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int d0, int d1);
Tensor permute(const Tensor& x, const std::vector<int>& dims);
Tensor narrow(const Tensor& x, int dim, std::int64_t start, std::int64_t length);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
Tensor to_dtype(const Tensor& x, DType dtype);

// linear algebra
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

// nn
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
Tensor embedding(const Tensor& ids, const Tensor& table);
Tensor rmsnorm(const Tensor& x, const Tensor& w, double eps);
Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style,
            std::int64_t pos_offset = 0);
// A pointwise activation (kernels/op_list.h: kActivations): silu, gelu_tanh, gelu (erf), ...
Tensor activation(Op op, const Tensor& x);
inline Tensor silu(const Tensor& x) { return activation(Op::Silu, x); }
inline Tensor gelu(const Tensor& x) { return activation(Op::Gelu, x); }  // exact (erf)
inline Tensor gelu_tanh(const Tensor& x) { return activation(Op::GeluTanh, x); }
Tensor swiglu(const Tensor& gate, const Tensor& up);
// q: (B, T, Hq, D), k/v: (B, Tk, Hkv, D); causal; q_offset > 0 only without grad.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                 std::int64_t q_offset = 0);
// Mean over non-ignored rows. logits (N, V), targets i32 (N).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int32_t ignore_index = -100);
// cross_entropy(linear(h, w), targets), without ever holding the (N, V) logits whole: chunks of
// chunk_rows rows (0: all N at once) go through the LM head, the loss and, when a gradient is
// wanted, straight on to d(loss)/dh and d(loss)/dW, computed in forward for an upstream gradient
// of 1 and scaled in backward. h (N, C), w (V, C), targets i32 (N). Peak logits memory: one
// chunk's (chunk_rows, V), instead of (N, V) kept from forward to backward.
Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                            std::int32_t ignore_index, std::int64_t chunk_rows);
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training);

// Activation checkpointing: runs fn without recording, saves only `inputs`,
// and re-runs fn with recording during backward. fn must be deterministic
// given its inputs: random ops inside fn (dropout) would draw a new mask on
// recomputation, so they are not supported there (the decoders use none).
using CheckpointFn = std::function<Tensor(const std::vector<Tensor>&)>;
Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

}  // namespace kiln::ag
