// The arguments of every kernel op: what the front end (tensor/ops_*.cpp) hands the
// dispatcher (tensor/kernel_table.h) and what each backend's kernel receives. One struct per
// kernel; the front end allocates the outputs, the kernel writes them.
//
// Each struct names its op family (kOp, kernels/op_list.h) and kernel (kName), and tells the
// dispatcher:
//   anchor()   the tensor whose emptiness means there is nothing to do; unless stated, also
//              the device the kernel runs on and the dtype that picks it;
//   device()   (optional) the device, where it is not the anchor's;
//   key()      (optional) the dtype that picks the kernel, where it is not the anchor's;
//   slots(f)   every tensor, with how the dispatcher may convert it (kernel_table.h: Slot).
// Shapes are in the comments; (..., C) means any leading dims.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "kernels/common/quant.h"
#include "kernels/op_list.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"

namespace kiln::ops {

// ---- basic ----------------------------------------------------------------------------------

struct CopyArgs {  // dst = src, any dtypes (converting), src expanded to dst's shape
  static constexpr Op kOp = Op::Copy;
  static constexpr std::string_view kName = "copy";
  static constexpr bool kCrossDevice = true;  // host <-> device copies
  Tensor dst, src;
  Device device() const { return dst.device().is_cuda() ? dst.device() : src.device(); }
  const Tensor& anchor() const { return dst; }
  template <class F>
  void slots(F&& f) {
    f(Slot::AuxOut, dst);
    f(Slot::Aux, src);
  }
};

struct FillArgs {  // t = value; t contiguous, any dtype
  static constexpr Op kOp = Op::Fill;
  static constexpr std::string_view kName = "fill";
  Tensor t;
  double value = 0;
  const Tensor& anchor() const { return t; }
  template <class F>
  void slots(F&& f) {
    f(Slot::Out, t);
  }
};

struct RandomArgs {  // t ~ normal(a, b) or uniform[a, b), Philox at (seed, offset)
  static constexpr Op kOp = Op::Random;
  static constexpr std::string_view kName = "random";
  Tensor t;
  bool normal = true;
  double a = 0, b = 1;
  std::uint64_t seed = 0, offset = 0;
  const Tensor& anchor() const { return t; }
  template <class F>
  void slots(F&& f) {
    f(Slot::Out, t);
  }
};

struct BinaryArgs {  // out = a op b; a, b broadcast to out's shape by the kernel
  static constexpr Op kOp = Op::Binary;
  static constexpr std::string_view kName = "binary";
  Binary op = Binary::Add;
  Tensor a, b, out;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, a);
    f(Slot::In, b);
    f(Slot::Out, out);
  }
};

struct UnaryArgs {  // out = op(x)
  static constexpr Op kOp = Op::Unary;
  static constexpr std::string_view kName = "unary";
  Unary op = Unary::Neg;
  Tensor x, out;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Out, out);
  }
};

struct AffineArgs {  // out = alpha * x + beta
  static constexpr Op kOp = Op::Unary;
  static constexpr std::string_view kName = "affine";
  Tensor x, out;
  double alpha = 1, beta = 0;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Out, out);
  }
};

struct AxpyArgs {  // y += alpha * x; y contiguous, x of y's shape
  static constexpr Op kOp = Op::Binary;
  static constexpr std::string_view kName = "axpy";
  Tensor y, x;
  double alpha = 1;
  const Tensor& anchor() const { return y; }
  template <class F>
  void slots(F&& f) {
    f(Slot::InOut, y);
    f(Slot::In, x);
  }
};

struct ScaleArgs {  // y *= alpha; y contiguous
  static constexpr Op kOp = Op::Unary;
  static constexpr std::string_view kName = "scale";
  Tensor y;
  double alpha = 1;
  const Tensor& anchor() const { return y; }
  template <class F>
  void slots(F&& f) {
    f(Slot::InOut, y);
  }
};

struct ReduceArgs {  // x viewed as (outer, n, inner) -> out (outer, inner)
  static constexpr Op kOp = Op::Reduce;
  static constexpr std::string_view kName = "reduce";
  Reduce op = Reduce::Sum;
  Tensor x, out;
  std::int64_t outer = 1, n = 1, inner = 1;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Out, out);
  }
};

struct ArgmaxArgs {  // as ReduceArgs; out i64
  static constexpr Op kOp = Op::Reduce;
  static constexpr std::string_view kName = "argmax";
  Tensor x, out;
  std::int64_t outer = 1, n = 1, inner = 1;
  DType key() const { return x.dtype(); }
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::AuxOut, out);
  }
};

struct SumAllArgs {  // out (0-d, x's dtype) = sum of x
  static constexpr Op kOp = Op::Reduce;
  static constexpr std::string_view kName = "sum_all";
  Tensor x, out;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Out, out);
  }
};

struct SumSquaresArgs {  // result = sum of x^2, on the host
  static constexpr Op kOp = Op::Reduce;
  static constexpr std::string_view kName = "sum_squares";
  Tensor x;
  double result = 0;
  const Tensor& anchor() const { return x; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
  }
};

struct SumSquaresMultiArgs {  // result = sum over tensors of sum x^2, on the host
  static constexpr Op kOp = Op::Reduce;
  static constexpr std::string_view kName = "sum_squares_multi";
  std::vector<Tensor> tensors;  // defined, non-empty, float, one device
  double result = 0;
  // One kernel per device reads every float dtype itself (no conversions): keyed f32.
  DType key() const { return DType::F32; }
  const Tensor& anchor() const { return tensors.front(); }
  template <class F>
  void slots(F&&) {}
};

struct DequantizeArgs {  // out = the weights of GGML blocks (kernels/common/quant.h)
  static constexpr Op kOp = Op::Dequantize;
  static constexpr std::string_view kName = "dequantize";
  Tensor blocks;  // the blocks' bytes (a Bool tensor: u8 storage), contiguous
  Tensor out;     // the weights, any float dtype, contiguous
  quant::QuantType type = quant::QuantType::Q8_0;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::Aux, blocks);
    f(Slot::Out, out);
  }
  // Registered beside their kernels: tensor/kernels_cpu_quant.cpp, tensor/kernels_cuda_quant.cpp.
  static void register_cpu();
  static void register_cuda();
};

struct LinearQuantArgs {  // out = x W^T + bias; W (N, K) as GGML blocks, row after row
  static constexpr Op kOp = Op::Dequantize;
  static constexpr std::string_view kName = "linear_quant";
  Tensor x;       // (..., K), contiguous rows
  Tensor blocks;  // W's blocks (a Bool tensor: u8 storage), N * K / block_size of them
  Tensor bias;    // (N) or undefined
  Tensor out;     // (..., N), x's dtype
  quant::QuantType type = quant::QuantType::Q8_0;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Aux, blocks);
    f(Slot::In, bias);
    f(Slot::Out, out);
  }
  // Registered beside their kernels: tensor/kernels_cpu_quant.cpp, tensor/kernels_cuda_quant.cpp.
  static void register_cpu();
  static void register_cuda();
};

// ---- matmul ---------------------------------------------------------------------------------

struct GemmArgs {  // c = alpha * op(a) op(b) + beta * c; all 2-d, c contiguous
  static constexpr Op kOp = Op::Gemm;
  static constexpr std::string_view kName = "gemm";
  Tensor c, a, b;
  bool trans_a = false, trans_b = false;
  double alpha = 1, beta = 0;
  const Tensor& anchor() const { return c; }
  template <class F>
  void slots(F&& f) {
    f(Slot::InOut, c);
    f(Slot::In, a);
    f(Slot::In, b);
  }
};

struct MatmulArgs {  // out = op(a) op(b): (M,K)@(K,N), (B,M,K)@(B,K,N) or (B,M,K)@(K,N)
  static constexpr Op kOp = Op::Gemm;
  static constexpr std::string_view kName = "matmul";
  Tensor a, b, out;
  bool trans_a = false, trans_b = false;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, a);
    f(Slot::In, b);
    f(Slot::Out, out);
  }
};

struct LinearArgs {  // out = x w^T + bias; x (..., in), w (out, in), bias (out) or undefined
  static constexpr Op kOp = Op::Gemm;
  static constexpr std::string_view kName = "linear";
  Tensor x, w, bias, out;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::In, w);
    f(Slot::In, bias);
    f(Slot::Out, out);
  }
};

// ---- nn -------------------------------------------------------------------------------------

struct SoftmaxArgs {  // y = softmax(x) or log_softmax(x) over the last dim
  static constexpr Op kOp = Op::Softmax;
  static constexpr std::string_view kName = "softmax";
  Tensor x, y;
  bool log = false;
  const Tensor& anchor() const { return y; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Out, y);
  }
};

struct SoftmaxBackwardArgs {  // dx from y = (log_)softmax(x) and dy
  static constexpr Op kOp = Op::Softmax;
  static constexpr std::string_view kName = "softmax_backward";
  Tensor y, dy, dx;
  bool log = false;
  const Tensor& anchor() const { return dx; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, y);
    f(Slot::In, dy);
    f(Slot::Out, dx);
  }
};

struct EmbeddingArgs {  // out (..., C) = table[ids]; ids i32 (...), table (V, C)
  static constexpr Op kOp = Op::Embedding;
  static constexpr std::string_view kName = "embedding";
  Tensor ids, table, out;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::Aux, ids);
    f(Slot::In, table);
    f(Slot::Out, out);
  }
};

struct EmbeddingBackwardArgs {  // dtable (V, C) += scatter of dout (..., C) by ids
  static constexpr Op kOp = Op::Embedding;
  static constexpr std::string_view kName = "embedding_backward";
  Tensor dtable, ids, dout;
  const Tensor& anchor() const { return dtable; }
  template <class F>
  void slots(F&& f) {
    f(Slot::InOut, dtable);
    f(Slot::Aux, ids);
    f(Slot::In, dout);
  }
};

struct RmsNormArgs {  // y = x * rstd * w; x (..., C), w (C), rstd (rows) in the compute dtype
  static constexpr Op kOp = Op::RmsNorm;
  static constexpr std::string_view kName = "rmsnorm";
  Tensor x, w, y, rstd;
  double eps = 1e-5;
  const Tensor& anchor() const { return y; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::In, w);
    f(Slot::Out, y);
    f(Slot::AuxOut, rstd);
  }
};

// The residual add of a pre-norm block and the norm after it, in one op (inference: one pass over
// the hidden state on CUDA). s = x + r, rounded to the storage dtype; then rmsnorm(s) as
// RmsNormArgs computes it (y, rstd): the add's and the norm's bits (ops.h says where on CUDA).
struct AddRmsNormArgs {  // x, r, s, y (..., C); w (C); rstd (rows) in the compute dtype
  static constexpr Op kOp = Op::RmsNorm;
  static constexpr std::string_view kName = "add_rmsnorm";
  Tensor x, r, w, s, y, rstd;
  double eps = 1e-5;
  const Tensor& anchor() const { return y; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::In, r);
    f(Slot::In, w);
    f(Slot::Out, s);
    f(Slot::Out, y);
    f(Slot::AuxOut, rstd);
  }
};

struct RmsNormBackwardArgs {  // dx =; dw += (any float dtype) when defined
  static constexpr Op kOp = Op::RmsNorm;
  static constexpr std::string_view kName = "rmsnorm_backward";
  Tensor x, w, rstd, dy, dx, dw;
  const Tensor& anchor() const { return dx; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::In, w);
    f(Slot::Stat, rstd);
    f(Slot::In, dy);
    f(Slot::Out, dx);
    f(Slot::AuxOut, dw);
  }
};

struct LayerNormArgs {  // y = (x - mean) * rstd * w + b; b may be undefined
  static constexpr Op kOp = Op::LayerNorm;
  static constexpr std::string_view kName = "layernorm";
  Tensor x, w, b, y, mean, rstd;
  double eps = 1e-5;
  const Tensor& anchor() const { return y; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::In, w);
    f(Slot::In, b);
    f(Slot::Out, y);
    f(Slot::AuxOut, mean);
    f(Slot::AuxOut, rstd);
  }
};

struct LayerNormBackwardArgs {  // dx =; dw, db += when defined
  static constexpr Op kOp = Op::LayerNorm;
  static constexpr std::string_view kName = "layernorm_backward";
  Tensor x, w, mean, rstd, dy, dx, dw, db;
  const Tensor& anchor() const { return dx; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::In, w);
    f(Slot::Stat, mean);
    f(Slot::Stat, rstd);
    f(Slot::In, dy);
    f(Slot::Out, dx);
    f(Slot::AuxOut, dw);
    f(Slot::AuxOut, db);
  }
};

struct RopeTablesArgs {  // cos, sin (max_pos, head_dim / 2) for theta
  static constexpr Op kOp = Op::Rope;
  static constexpr std::string_view kName = "rope_tables";
  Tensor cos, sin;
  std::int64_t max_pos = 0, head_dim = 0;
  double theta = 10000;
  const Tensor& anchor() const { return cos; }
  template <class F>
  void slots(F&& f) {
    f(Slot::AuxOut, cos);
    f(Slot::AuxOut, sin);
  }
};

struct RopeArgs {  // out = rope(x) (or its backward); x (B, T, H, D), positions from pos_offset
  static constexpr Op kOp = Op::Rope;
  static constexpr std::string_view kName = "rope";
  Tensor x, cos, sin, out;
  RopeStyle style = RopeStyle::RotateHalf;
  std::int64_t pos_offset = 0;
  bool backward = false;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Aux, cos);
    f(Slot::Aux, sin);
    f(Slot::Out, out);
  }
};

// A pointwise activation of op family O: y = act(x), and dx = dy * act'(x).
template <Op O>
struct ActivationArgs {
  static constexpr Op kOp = O;
  static constexpr std::string_view kName = op_name(O);
  Tensor x, y;
  const Tensor& anchor() const { return y; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Out, y);
  }
};
template <Op O>
struct ActivationBackwardArgs {
  static constexpr Op kOp = O;
  static constexpr std::string_view kName = op_backward_name(O);
  Tensor x, dy, dx;
  const Tensor& anchor() const { return dx; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::In, dy);
    f(Slot::Out, dx);
  }
};

struct SwiGluArgs {  // out = silu(gate) * up
  static constexpr Op kOp = Op::SwiGlu;
  static constexpr std::string_view kName = "swiglu";
  Tensor gate, up, out;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, gate);
    f(Slot::In, up);
    f(Slot::Out, out);
  }
};

struct SwiGluBackwardArgs {
  static constexpr Op kOp = Op::SwiGlu;
  static constexpr std::string_view kName = "swiglu_backward";
  Tensor gate, up, dout, dgate, dup;
  const Tensor& anchor() const { return dgate; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, gate);
    f(Slot::In, up);
    f(Slot::In, dout);
    f(Slot::Out, dgate);
    f(Slot::Out, dup);
  }
};

// q/out (B, Tq, Hq, D), k/v (B, Tk, Hkv, D) with dense (T, H, D) and any batch stride (a KV
// cache), lse (B, Hq, Tq) in the compute dtype. Causal, queries at q_offset.
struct AttentionArgs {
  static constexpr Op kOp = Op::Attention;
  static constexpr std::string_view kName = "attention";
  Tensor q, k, v, out, lse;
  double scale = 1;
  std::int64_t q_offset = 0;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, q);
    f(Slot::In, k);
    f(Slot::In, v);
    f(Slot::Out, out);
    f(Slot::AuxOut, lse);
  }
};

struct AttentionBackwardArgs {  // training: Tq == Tk, q_offset 0
  static constexpr Op kOp = Op::Attention;
  static constexpr std::string_view kName = "attention_backward";
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
  double scale = 1;
  const Tensor& anchor() const { return dq; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, q);
    f(Slot::In, k);
    f(Slot::In, v);
    f(Slot::In, out);
    f(Slot::Stat, lse);
    f(Slot::In, dout);
    f(Slot::Out, dq);
    f(Slot::Out, dk);
    f(Slot::Out, dv);
  }
};

// logits (N, V), targets i32 (N); loss, lse (N) in the compute dtype.
// Serving: causal attention of N query rows (any mix of sequences) over a paged KV pool
// (kernels/cpu/paged_attention.h). q, out (N, Hq, D); k_pool, v_pool (num_blocks, block_size,
// Hkv, D) in q's dtype; block_tables i32 (S, max_blocks); token_seq, token_pos i32 (N).
struct PagedAttentionArgs {
  static constexpr Op kOp = Op::Attention;
  static constexpr std::string_view kName = "paged_attention";
  Tensor q, k_pool, v_pool, block_tables, token_seq, token_pos, out;
  double scale = 1;
  const Tensor& anchor() const { return out; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, q);
    f(Slot::In, k_pool);
    f(Slot::In, v_pool);
    f(Slot::Aux, block_tables);
    f(Slot::Aux, token_seq);
    f(Slot::Aux, token_pos);
    f(Slot::Out, out);
  }
  static void register_cpu();
  static void register_cuda();
};

struct CrossEntropyArgs {
  static constexpr Op kOp = Op::CrossEntropy;
  static constexpr std::string_view kName = "cross_entropy";
  Tensor logits, targets, loss, lse;
  std::int32_t ignore_index = -100;
  DType key() const { return logits.dtype(); }
  const Tensor& anchor() const { return loss; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, logits);
    f(Slot::Aux, targets);
    f(Slot::AuxOut, loss);
    f(Slot::AuxOut, lse);
  }
};

// dlogits (N, V) from the per-row upstream gradient dloss (N); may share logits' storage.
struct CrossEntropyBackwardArgs {
  static constexpr Op kOp = Op::CrossEntropy;
  static constexpr std::string_view kName = "cross_entropy_backward";
  Tensor logits, lse, targets, dloss, dlogits;
  std::int32_t ignore_index = -100;
  const Tensor& anchor() const { return logits; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, logits);
    f(Slot::Stat, lse);
    f(Slot::Aux, targets);
    f(Slot::Stat, dloss);
    f(Slot::Out, dlogits);
  }
};

struct DropoutArgs {  // y = x * keep / (1 - p), keep ~ Philox(seed, offset); mask u8
  static constexpr Op kOp = Op::Dropout;
  static constexpr std::string_view kName = "dropout";
  Tensor x, y, mask;
  double p = 0;
  std::uint64_t seed = 0, offset = 0;
  const Tensor& anchor() const { return y; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, x);
    f(Slot::Out, y);
    f(Slot::AuxOut, mask);
  }
};

struct DropoutBackwardArgs {
  static constexpr Op kOp = Op::Dropout;
  static constexpr std::string_view kName = "dropout_backward";
  Tensor dy, mask, dx;
  double p = 0;
  const Tensor& anchor() const { return dx; }
  template <class F>
  void slots(F&& f) {
    f(Slot::In, dy);
    f(Slot::Aux, mask);
    f(Slot::Out, dx);
  }
};

// ---- optimizers (in place) ------------------------------------------------------------------

struct AdamWArgs {  // param, grad, m, v: contiguous f32 (or, on the CPU, f64) of one shape
  static constexpr Op kOp = Op::AdamW;
  static constexpr std::string_view kName = "adamw";
  Tensor param, grad, m, v;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  std::int64_t step = 0;
  const Tensor& anchor() const { return param; }
  template <class F>
  void slots(F&& f) {
    f(Slot::AuxOut, param);
    f(Slot::Aux, grad);
    f(Slot::AuxOut, m);
    f(Slot::AuxOut, v);
  }
};

struct AdamWMultiArgs {  // every item of a multi-tensor AdamW step (ops::adamw_multi_step_)
  static constexpr Op kOp = Op::AdamW;
  static constexpr std::string_view kName = "adamw_multi";
  std::span<AdamWTensors> items;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0;
  std::int64_t step = 0;
  DType key() const { return DType::F32; }  // the f32 masters (or f32 params) are updated
  // The first item with elements: the dispatcher runs nothing for an empty anchor, so an empty
  // first item must not stand for the whole step.
  const Tensor& anchor() const {
    for (const AdamWTensors& it : items)
      if (it.param.numel() > 0) return it.param;
    return items.front().param;
  }
  template <class F>
  void slots(F&&) {}
};

struct SgdArgs {  // param, grad (and momentum_buf when defined): contiguous f32
  static constexpr Op kOp = Op::Sgd;
  static constexpr std::string_view kName = "sgd";
  Tensor param, grad, momentum_buf;
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  std::int64_t step = 0;
  const Tensor& anchor() const { return param; }
  template <class F>
  void slots(F&& f) {
    f(Slot::AuxOut, param);
    f(Slot::Aux, grad);
    f(Slot::AuxOut, momentum_buf);
  }
};

// Every kernel op, for the coverage tests: each must have a CPU kernel, and a CUDA kernel in a
// CUDA build. The activations' come from kernels/op_list.h (kActivations).
template <class... A>
struct KernelList {};

namespace detail {
template <class... A, class... B>
KernelList<A..., B...> concat(KernelList<A...>, KernelList<B...>);
template <std::size_t... I>
KernelList<ActivationArgs<kActivations[I]>..., ActivationBackwardArgs<kActivations[I]>...>
    activation_kernels(std::index_sequence<I...>);
}  // namespace detail

using AllKernels = decltype(detail::concat(
    KernelList<CopyArgs, FillArgs, RandomArgs, BinaryArgs, UnaryArgs, AffineArgs, AxpyArgs,
               ScaleArgs, ReduceArgs, ArgmaxArgs, SumAllArgs, SumSquaresArgs, SumSquaresMultiArgs,
               GemmArgs, MatmulArgs, LinearArgs, SoftmaxArgs, SoftmaxBackwardArgs, EmbeddingArgs,
               EmbeddingBackwardArgs, RmsNormArgs, RmsNormBackwardArgs, AddRmsNormArgs,
               LayerNormArgs, LayerNormBackwardArgs, RopeTablesArgs, RopeArgs, SwiGluArgs,
               SwiGluBackwardArgs, AttentionArgs, AttentionBackwardArgs, CrossEntropyArgs,
               CrossEntropyBackwardArgs, DropoutArgs, DropoutBackwardArgs, AdamWArgs,
               AdamWMultiArgs, SgdArgs, DequantizeArgs, LinearQuantArgs, PagedAttentionArgs>{},
    detail::activation_kernels(std::make_index_sequence<kActivations.size()>{})));

}  // namespace kiln::ops
