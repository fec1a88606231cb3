// The CUDA glue (not a public header): Tensor-level launchers behind the CUDA entries of the
// kernel table (tensor/kernels_cuda_registry.cpp registers them; tensor/kernel_table.h).
//
// The op front end (tensor/ops_basic.cpp, ops_nn.cpp) checks shapes and allocates outputs for
// every device, then the dispatcher calls the function of the same name here for a CUDA
// tensor, which launches the kernels in kernels/cuda/. CUDA computes bf16/f16 natively (no f32
// conversion scratch), and the meta device's dry run, simulating CUDA, allocates what this path
// allocates.
//
// Contract for every function: outputs are allocated by the caller with the
// right shape, dtype and device, contiguous unless stated; inputs are on the
// same CUDA device and may be strided unless stated (make them contiguous here
// if a kernel needs it, charging the copy to MemCategory::Temporaries).
// Supported dtypes: f32 and bf16 everywhere (f16 where the kernel is templated
// anyway); anything else fails with "[op] <dtype> is not supported on CUDA".
// Kernels run on the legacy default stream, so the caching allocator needs no
// stream events.
//
// One implementation file per family: kernels_cuda_basic.cpp (copy, fill, random,
// elementwise, reductions), kernels_cuda_matmul.cpp, kernels_cuda_nn.cpp (softmax,
// embedding, norms, RoPE, activations, dropout), kernels_cuda_loss.cpp (cross-entropy,
// optimizers). The attention family (kernels_cuda_attention.cpp) already has the shape every
// family is moving to: typed entries registered beside their bodies (kernels_cuda_glue.h), no
// declarations here. In a build
// without CUDA every function is an inline stub that fails; no caller reaches
// them, since a CUDA tensor cannot be allocated there.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"

namespace kiln::ops::cuda_ops {

#if defined(KILN_CUDA)
#define KILN_CUDA_OP(name, ...) void name(__VA_ARGS__)
#else
#define KILN_CUDA_OP(name, ...) \
  [[noreturn]] inline void name(__VA_ARGS__) { ::kiln::cuda::no_cuda("ops::" #name); }
#endif

// ---- kernels_cuda_basic.cpp
// -------------------------------------------------------------------- dst =
// src for any pair of devices where at least one is CUDA (h2d, d2h, d2d), any
// dtypes, any src strides (including broadcast stride 0, already expanded to
// dst's shape); dst may be strided (no stride 0). dst and src may alias only
// when they are the same view.
KILN_CUDA_OP(copy, Tensor &dst, const Tensor &src);
KILN_CUDA_OP(fill, Tensor &t, double value);  // t contiguous, any dtype
// Philox draws with the same counter layout as kernels/cpu/random.cpp, so a
// CUDA tensor holds the same numbers as a CPU tensor from the same (seed,
// offset) (up to float rounding).
KILN_CUDA_OP(random, bool normal, Tensor &t, double a, double b, std::uint64_t seed,
             std::uint64_t offset);
// a and b are already expanded to out's shape (stride 0 on broadcast dims).
KILN_CUDA_OP(binary, Binary op, const Tensor &a, const Tensor &b, Tensor &out);
KILN_CUDA_OP(unary, Unary op, const Tensor &x, Tensor &out);
KILN_CUDA_OP(affine, const Tensor &x, double alpha, double beta, Tensor &out);
KILN_CUDA_OP(axpy, Tensor &y, double alpha,
             const Tensor &x);                 // y contiguous, += in y's dtype
KILN_CUDA_OP(scale, Tensor &y, double alpha);  // y contiguous
// x viewed as (outer, n, inner), reduced over n into out (outer, inner).
KILN_CUDA_OP(reduce, Reduce op, const Tensor &x, std::int64_t outer, std::int64_t n,
             std::int64_t inner, Tensor &out);
KILN_CUDA_OP(argmax, const Tensor &x, std::int64_t outer, std::int64_t n, std::int64_t inner,
             Tensor &out);                            // out i64
KILN_CUDA_OP(sum_all, const Tensor &x, Tensor &out);  // out 0-d, x's dtype
// Sum of squares in f32 (f64 accumulation across blocks), copied to the host.
KILN_CUDA_OP(sum_squares, const Tensor &x, double *result);
// Every tensor's sum of squares in one launch (f32 squares, f64 across blocks) and one
// device-to-host copy, the only sync: ops::sum_squares_multi. Any strides (non-contiguous
// tensors are copied first). Deterministic.
KILN_CUDA_OP(sum_squares_multi, std::span<const Tensor> tensors, double *result);

// ---- kernels_cuda_matmul.cpp (cuBLASLt)
// --------------------------------------------------------- c = alpha * op(a)
// op(b) + beta * c; 2-d, c contiguous, same dtype.
KILN_CUDA_OP(gemm, Tensor &c, const Tensor &a, const Tensor &b, bool trans_a, bool trans_b,
             double alpha, double beta);
// (M,K)@(K,N) or batched (B,M,K)@(B,K,N) / (B,M,K)@(K,N), per ops::matmul.
KILN_CUDA_OP(matmul, const Tensor &a, const Tensor &b, bool trans_a, bool trans_b, Tensor &out);
// out = x w^T + bias; x (..., in), w (out, in), bias (out) or undefined.
KILN_CUDA_OP(linear, const Tensor &x, const Tensor &w, const Tensor &bias, Tensor &out);

// ---- kernels_cuda_nn.cpp
// ------------------------------------------------------------------------
KILN_CUDA_OP(softmax, const Tensor &x, bool log,
             Tensor &y);  // over the last dim
KILN_CUDA_OP(softmax_backward, const Tensor &y, const Tensor &dy, bool log, Tensor &dx);
KILN_CUDA_OP(embedding, const Tensor &ids, const Tensor &table, Tensor &out);
// dtable += scatter(dout); deterministic (no float atomics in a data-dependent
// order).
KILN_CUDA_OP(embedding_backward, Tensor &dtable, const Tensor &ids, const Tensor &dout);
// rstd/mean: (rows) f32.
KILN_CUDA_OP(rmsnorm, const Tensor &x, const Tensor &w, double eps, Tensor &y, Tensor &rstd);
// dx =; dw += when dw is non-null and defined (any float dtype).
KILN_CUDA_OP(rmsnorm_backward, const Tensor &x, const Tensor &w, const Tensor &rstd,
             const Tensor &dy, Tensor &dx, Tensor *dw);
KILN_CUDA_OP(layernorm, const Tensor &x, const Tensor &w, const Tensor &b, double eps, Tensor &y,
             Tensor &mean, Tensor &rstd);
KILN_CUDA_OP(layernorm_backward, const Tensor &x, const Tensor &w, const Tensor &mean,
             const Tensor &rstd, const Tensor &dy, Tensor &dx, Tensor *dw, Tensor *db);
// cos/sin (max_pos, D/2) f32 (the tables stay f32 on CUDA whatever the model
// dtype).
KILN_CUDA_OP(rope_tables, std::int64_t max_pos, std::int64_t head_dim, double theta, Tensor &cos,
             Tensor &sin);
// x: (B, T, H, D); out may be x itself (in place).
KILN_CUDA_OP(rope, const Tensor &x, const Tensor &cos, const Tensor &sin, RopeStyle style,
             std::int64_t pos_offset, bool backward, Tensor &out);
// A pointwise activation of kernels/op_list.h (kActivations) and its gradient.
KILN_CUDA_OP(activation, Op op, const Tensor &x, Tensor &y);
KILN_CUDA_OP(activation_backward, Op op, const Tensor &x, const Tensor &dy, Tensor &dx);
KILN_CUDA_OP(swiglu, const Tensor &gate, const Tensor &up, Tensor &out);
KILN_CUDA_OP(swiglu_backward, const Tensor &gate, const Tensor &up, const Tensor &dout,
             Tensor &dgate, Tensor &dup);
// Same Philox mask as the CPU kernel for the same (seed, offset).
KILN_CUDA_OP(dropout, const Tensor &x, double p, std::uint64_t seed, std::uint64_t offset,
             Tensor &y, Tensor &mask);
KILN_CUDA_OP(dropout_backward, const Tensor &dy, const Tensor &mask, double p, Tensor &dx);

// ---- kernels_cuda_loss.cpp
// ---------------------------------------------------------------------- Fused,
// chunked over V: no (N, V) f32 buffer. loss, lse: (N) f32.
KILN_CUDA_OP(cross_entropy, const Tensor &logits, const Tensor &targets, std::int32_t ignore_index,
             Tensor &loss, Tensor &lse);
// dlogits may share storage with logits (in place).
KILN_CUDA_OP(cross_entropy_backward, const Tensor &logits, const Tensor &lse, const Tensor &targets,
             const Tensor &dloss, std::int32_t ignore_index, Tensor &dlogits);
KILN_CUDA_OP(adamw_step, Tensor &param, const Tensor &grad, Tensor &m, Tensor &v, double lr,
             double beta1, double beta2, double eps, double weight_decay, std::int64_t step);
KILN_CUDA_OP(sgd_step, Tensor &param, const Tensor &grad, Tensor &momentum_buf, double lr,
             double momentum, double dampening, double weight_decay, bool nesterov,
             std::int64_t step);
// Every parameter in one launch (ops::adamw_multi_step_).
KILN_CUDA_OP(adamw_multi_step, std::span<AdamWTensors> items, double lr, double beta1, double beta2,
             double eps, std::int64_t step);

#undef KILN_CUDA_OP

}  // namespace kiln::ops::cuda_ops
