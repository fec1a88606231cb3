// The op front end: shape checks, broadcasting, output allocation and
// dispatch to a backend (kernels/cpu now, kernels/cuda later; meta runs no
// kernel but allocates exactly the same tensors). Not differentiable:
// autograd/ops.h builds graphs on top of these.
//
// Outputs are charged to the current MemoryScope category; scratch that dies
// inside an op is charged to Temporaries.
#pragma once

#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "kernels/op_list.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace kiln::quant {
enum class QuantType : std::uint8_t;  // kernels/common/quant.h
}  // namespace kiln::quant

namespace kiln::ops {

// ---- creation -------------------------------------------------------------------
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
            Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor from_vector(const std::vector<float>& v, const Shape& shape, DType dtype = DType::F32);
Tensor from_vector(const std::vector<double>& v, const Shape& shape, DType dtype = DType::F64);
Tensor from_vector(const std::vector<std::int32_t>& v, const Shape& shape);
Tensor randn(const Shape& shape, Generator& gen, double mean = 0.0, double std = 1.0,
             DType dtype = DType::F32, Device device = Device::cpu());
Tensor rand_uniform(const Shape& shape, Generator& gen, double lo = 0.0, double hi = 1.0,
                    DType dtype = DType::F32, Device device = Device::cpu());
void fill_(Tensor& t, double value);

// ---- elementwise ----------------------------------------------------------------
enum class Binary { Add, Sub, Mul, Div, Max, Min };
enum class Unary { Neg, Exp, Log, Sqrt, Rsqrt, Abs, Square, Reciprocal, Tanh, Sigmoid };
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
Tensor binary(Binary op, const Tensor& a, const Tensor& b);
inline Tensor add(const Tensor& a, const Tensor& b) { return binary(Binary::Add, a, b); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(Binary::Sub, a, b); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(Binary::Mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(Binary::Div, a, b); }
Tensor unary(Unary op, const Tensor& x);
// out = alpha * x + beta
Tensor affine(const Tensor& x, double alpha, double beta = 0.0);
// y += alpha * x (same shape; y contiguous) — gradient accumulation.
void axpy_(Tensor& y, double alpha, const Tensor& x);
void scale_(Tensor& y, double alpha);

// ---- reductions -----------------------------------------------------------------
enum class Reduce { Sum, Mean, Max, Min };
Tensor reduce(Reduce op, const Tensor& x, int dim, bool keepdim = false);
inline Tensor sum(const Tensor& x, int dim, bool keepdim = false) {
  return reduce(Reduce::Sum, x, dim, keepdim);
}
inline Tensor mean(const Tensor& x, int dim, bool keepdim = false) {
  return reduce(Reduce::Mean, x, dim, keepdim);
}
Tensor argmax(const Tensor& x, int dim);  // i64
Tensor sum_all(const Tensor& x);          // 0-d
// Sums x down to `shape` (the inverse of broadcasting), for gradients.
Tensor sum_to(const Tensor& x, const Shape& shape);
double sum_squares(const Tensor& x);
// sum over the tensors of sum x^2, for global gradient-norm clipping: one kernel call for all of
// them (on CUDA one launch and one sync, not one per tensor). Undefined and empty tensors count
// 0; the rest must be float tensors on one device. On the CPU it is the sum, in order, of each
// tensor's sum_squares.
double sum_squares_multi(std::span<const Tensor> tensors);

// The weights stored in GGML's quantized blocks (Q8_0, Q4_K, Q6_K: kernels/common/quant.h), as a
// `shape` tensor of `dtype` on the blocks' device: blocks holds numel(shape) / block_size blocks
// of block_bytes bytes each, in a Bool tensor (u8 storage) of any shape. Each weight is llama.cpp's
// f32 value, rounded once to dtype, so every backend gives the same bits.
Tensor dequantize(const Tensor& blocks, quant::QuantType type, const Shape& shape,
                  DType dtype = DType::F32);

// x (..., K) @ W^T + bias -> (..., N), with W (N, K) in GGML's quantized blocks (row after row,
// as GGUF stores a weight: numel(blocks) = N * K / block_size * block_bytes) and bias (N) or
// undefined. x is f32, bf16 or f16; out has x's dtype. Inference only (no gradient).
// On the CPU, up to kiln::cpu::quant_gemv_max_rows(type) rows run the int8 GEMV (x quantized to
// 8 bits per value, kernels/cpu/gemv_quant.h); more rows dequantize W (to x's dtype) a slice at a
// time and multiply with the float GEMM. On CUDA W is dequantized and multiplied by cuBLASLt.
Tensor linear_quant(const Tensor& x, const Tensor& blocks, quant::QuantType type, std::int64_t n,
                    const Tensor& bias = Tensor());

// Rows `ids` (i32, any shape, read on the host) of a (vocab, dim) table held as GGML blocks (a
// 1-d Bool tensor of vocab rows of whole blocks), dequantized into `dtype`: (ids..., dim).
// Inference only; each row is dequantize()'s values. On meta, only the shape.
Tensor embedding_quant(const Tensor& ids, const Tensor& blocks, quant::QuantType type,
                       std::int64_t vocab, DType dtype);

// ---- matmul ---------------------------------------------------------------------
// (M,K)@(K,N), or batched (B,M,K)@(B,K,N); a 2-d b broadcasts over the batch.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x: (..., in), w: (out, in), bias: (out) or undefined -> (..., out)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);
// c = alpha * op(a) op(b) + beta * c on 2-d contiguous tensors (c written in place).
void gemm_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
           double alpha = 1.0, double beta = 0.0);

// ---- nn kernels -----------------------------------------------------------------
Tensor softmax(const Tensor& x);  // over the last dim
Tensor softmax_backward(const Tensor& y, const Tensor& dy);
Tensor log_softmax(const Tensor& x);
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy);

// ids: i32 (...), table: (V, C) -> (..., C)
Tensor embedding(const Tensor& ids, const Tensor& table);
void embedding_backward_(Tensor& dtable, const Tensor& ids, const Tensor& dout);  // +=

// x: (..., C), w: (C). Returns y and rstd (rows,) in f32 (f64 for f64 inputs).
std::tuple<Tensor, Tensor> rmsnorm(const Tensor& x, const Tensor& w, double eps);
// A pre-norm block's residual add and the next RMSNorm in one op: s = x + r (x, r: (..., C), one
// dtype), then (y, rstd) = rmsnorm(s, w, eps). Returns s, y and rstd: add()'s and rmsnorm()'s bits
// on the CPU, and on CUDA wherever both read the same vector width (x and r 16-byte aligned with
// whole-vector row strides, as a model's activations are). No autograd node: for inference.
std::tuple<Tensor, Tensor, Tensor> add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& w,
                                               double eps);
// Returns dx; accumulates into dw (+=) if defined.
Tensor rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                        Tensor* dw);
std::tuple<Tensor, Tensor, Tensor> layernorm(const Tensor& x, const Tensor& w, const Tensor& b,
                                             double eps);  // y, mean, rstd
Tensor layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          const Tensor& dy, Tensor* dw, Tensor* db);

enum class RopeStyle { Interleaved, RotateHalf };
// cos/sin tables (max_pos, D/2) in the compute dtype.
std::tuple<Tensor, Tensor> rope_tables(std::int64_t max_pos, std::int64_t head_dim, double theta,
                                       DType dtype = DType::F32, Device device = Device::cpu());
// x: (B, T, H, D); positions pos_offset .. pos_offset+T-1.
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style,
            std::int64_t pos_offset, bool backward = false);

// y = act(x) and its gradient for a pointwise activation op (kernels/op_list.h: kActivations).
Tensor activation(Op op, const Tensor& x);
Tensor activation_backward(Op op, const Tensor& x, const Tensor& dy);
inline Tensor silu(const Tensor& x) { return activation(Op::Silu, x); }
inline Tensor silu_backward(const Tensor& x, const Tensor& dy) {
  return activation_backward(Op::Silu, x, dy);
}
// GELU: gelu is the exact (erf) form, gelu_tanh the tanh approximation.
inline Tensor gelu(const Tensor& x) { return activation(Op::Gelu, x); }
inline Tensor gelu_backward(const Tensor& x, const Tensor& dy) {
  return activation_backward(Op::Gelu, x, dy);
}
inline Tensor gelu_tanh(const Tensor& x) { return activation(Op::GeluTanh, x); }
inline Tensor gelu_tanh_backward(const Tensor& x, const Tensor& dy) {
  return activation_backward(Op::GeluTanh, x, dy);
}
Tensor swiglu(const Tensor& gate, const Tensor& up);
std::tuple<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up,
                                           const Tensor& dout);

// Which attention kernel bf16/f16 CUDA tensors use (`--attention auto|kiln|cudnn`): Auto (the
// default) takes cuDNN's fused SDPA for training's shape and kiln's kernels for the rest, as
// measured (cuda::auto_attention_uses_cudnn in kernels/cuda/attention.h says which and why);
// Kiln and Cudnn force one. f32 always runs kiln's (cuDNN has no f32 path); the CPU and meta
// simulating the CPU ignore it.
enum class AttentionImpl { Auto, Kiln, Cudnn };
void set_attention_impl(AttentionImpl impl);
AttentionImpl attention_impl();

// q: (B, Tq, Hq, D), k/v: (B, Tk, Hkv, D) (k/v may be a narrowed KV cache view
// whose batch stride is larger). Returns out (B, Tq, Hq, D) and lse (B, Hq, Tq) f32.
std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                     double scale, std::int64_t q_offset);
std::tuple<Tensor, Tensor, Tensor> attention_backward(const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& out,
                                                      const Tensor& lse, const Tensor& dout,
                                                      double scale);

// Serving (kernels/cpu/paged_attention.h): out (N, Hq, D) = causal attention of each query row
// over its own sequence's keys in a paged pool. q (N, Hq, D); k_pool, v_pool (num_blocks,
// block_size, Hkv, D) in q's dtype and on q's device; block_tables i32 (S, max_blocks);
// token_seq, token_pos i32 (N) (row i is sequence token_seq[i] at position token_pos[i], seeing
// keys 0..token_pos[i]). The three index tensors are given on the host (or meta): every entry a
// row reads is checked there, then they are copied to q's device.
Tensor paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                       const Tensor& block_tables, const Tensor& token_seq, const Tensor& token_pos,
                       double scale);

// logits: (N, V), targets: i32 (N). Returns per-row loss (N) and lse (N).
std::tuple<Tensor, Tensor> cross_entropy(const Tensor& logits, const Tensor& targets,
                                         std::int32_t ignore_index);
// dloss: per-row upstream gradient (N). With `in_place`, and logits contiguous
// in their compute dtype, dlogits overwrite the logits and share their storage
// (saves a (N, V) buffer); otherwise a new buffer.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                              const Tensor& dloss, std::int32_t ignore_index,
                              bool in_place = false);

// Returns y and the keep mask (u8).
std::tuple<Tensor, Tensor> dropout(const Tensor& x, double p, Generator& gen);
Tensor dropout_backward(const Tensor& dy, const Tensor& mask, double p);

// ---- optimizers (in place, f32) ---------------------------------------------------
void adamw_step_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, double lr, double beta1,
                 double beta2, double eps, double weight_decay, std::int64_t step);
// One parameter of a multi-tensor AdamW step. param is f32, or bf16/f16 with an f32 master
// (updated, then rounded into param); grad has param's dtype or f32; m, v f32 like master.
struct AdamWTensors {
  Tensor param, grad, master, m, v;
  double weight_decay = 0.0;
};
// AdamW over every item, as adamw_step_ on each (same arithmetic); on CUDA in one launch.
void adamw_multi_step_(std::span<AdamWTensors> items, double lr, double beta1, double beta2,
                       double eps, std::int64_t step);
void sgd_step_(Tensor& param, const Tensor& grad, Tensor& momentum_buf, double lr, double momentum,
               double dampening, double weight_decay, bool nesterov, std::int64_t step);

}  // namespace kiln::ops
