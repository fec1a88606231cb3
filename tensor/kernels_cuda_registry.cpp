// The CUDA kernels' registrations: which dtypes each CUDA kernel takes natively, how it reads
// its inputs and what scratch it allocates, with adapters from op arguments (tensor/op_args.h)
// to the CUDA glue (tensor/kernels_cuda.h, which dispatches the dtype once and launches
// kernels/cuda/). Compiled in every build: without CUDA the entries are capabilities only
// (runnable = false), so a dry run can still simulate a CUDA run (--simulate cuda).
#include "kernels/cuda/norm.h"
#include "tensor/kernels_cuda.h"
#include "tensor/op_args.h"

namespace kiln::ops {
namespace {

namespace co = cuda_ops;

#if defined(KILN_CUDA)
constexpr bool kBuilt = true;
#else
constexpr bool kBuilt = false;
#endif

// Registers k for each of dtypes on CUDA.
template <class A>
void register_cuda(void (*run)(A&), std::initializer_list<DType> dtypes, Kernel<A> k = {}) {
  k.run = run;
  k.runnable = kBuilt;
  for (DType d : dtypes) register_kernel<A>(DeviceType::CUDA, d, k);
}

constexpr std::initializer_list<DType> kFloat = {DType::F32, DType::BF16, DType::F16};
constexpr std::initializer_list<DType> kAll = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                               DType::I32, DType::I64, DType::Bool};

// The norm backward kernels sum dw (and db) over row chunks into f32 partials.
std::int64_t norm_partials_bytes(const Tensor& x, const Tensor& w) {
  const std::int64_t rows = x.dim() == 0 ? 1 : x.numel() / std::max<std::int64_t>(x.size(-1), 1);
  return cuda::norm_backward_scratch_floats(rows, w.size(0), false) * 4;
}
ScratchList rmsnorm_backward_scratch(const RmsNormBackwardArgs& a, DType) {
  if (!a.dw.defined()) return {};
  return {norm_partials_bytes(a.x, a.w)};
}
ScratchList layernorm_backward_scratch(const LayerNormBackwardArgs& a, DType) {
  const std::int64_t n = norm_partials_bytes(a.x, a.w);
  return {a.dw.defined() ? n : 0, a.db.defined() ? n : 0};
}

void copy_cuda(CopyArgs& a) { co::copy(a.dst, a.src); }
void fill_cuda(FillArgs& a) { co::fill(a.t, a.value); }
void random_cuda(RandomArgs& a) { co::random(a.normal, a.t, a.a, a.b, a.seed, a.offset); }
void binary_cuda(BinaryArgs& a) {
  co::binary(a.op, a.a.expand(a.out.shape()), a.b.expand(a.out.shape()), a.out);
}
void unary_cuda(UnaryArgs& a) { co::unary(a.op, a.x, a.out); }
void affine_cuda(AffineArgs& a) { co::affine(a.x, a.alpha, a.beta, a.out); }
void axpy_cuda(AxpyArgs& a) { co::axpy(a.y, a.alpha, a.x); }
void scale_cuda(ScaleArgs& a) { co::scale(a.y, a.alpha); }
void reduce_cuda(ReduceArgs& a) { co::reduce(a.op, a.x, a.outer, a.n, a.inner, a.out); }
void argmax_cuda(ArgmaxArgs& a) { co::argmax(a.x, a.outer, a.n, a.inner, a.out); }
void sum_all_cuda(SumAllArgs& a) { co::sum_all(a.x, a.out); }
void sum_squares_cuda(SumSquaresArgs& a) { co::sum_squares(a.x, &a.result); }
void sum_squares_multi_cuda(SumSquaresMultiArgs& a) { co::sum_squares_multi(a.tensors, &a.result); }

// The multi-tensor sum of squares copies each non-contiguous tensor to a dense one first.
ScratchList sum_squares_multi_scratch(const SumSquaresMultiArgs& a, DType) {
  ScratchList bytes;
  for (const Tensor& t : a.tensors)
    if (!t.is_contiguous())
      bytes.push_back(t.numel() * static_cast<std::int64_t>(dtype_size(t.dtype())));
  return bytes;
}
void gemm_cuda(GemmArgs& a) { co::gemm(a.c, a.a, a.b, a.trans_a, a.trans_b, a.alpha, a.beta); }
void matmul_cuda(MatmulArgs& a) { co::matmul(a.a, a.b, a.trans_a, a.trans_b, a.out); }
void linear_cuda(LinearArgs& a) { co::linear(a.x, a.w, a.bias, a.out); }

void softmax_cuda(SoftmaxArgs& a) { co::softmax(a.x, a.log, a.y); }
void softmax_backward_cuda(SoftmaxBackwardArgs& a) { co::softmax_backward(a.y, a.dy, a.log, a.dx); }
void embedding_cuda(EmbeddingArgs& a) { co::embedding(a.ids, a.table, a.out); }
void embedding_backward_cuda(EmbeddingBackwardArgs& a) {
  co::embedding_backward(a.dtable, a.ids, a.dout);
}
void rmsnorm_cuda(RmsNormArgs& a) { co::rmsnorm(a.x, a.w, a.eps, a.y, a.rstd); }
void rmsnorm_backward_cuda(RmsNormBackwardArgs& a) {
  co::rmsnorm_backward(a.x, a.w, a.rstd, a.dy, a.dx, a.dw.defined() ? &a.dw : nullptr);
}
void layernorm_cuda(LayerNormArgs& a) { co::layernorm(a.x, a.w, a.b, a.eps, a.y, a.mean, a.rstd); }
void layernorm_backward_cuda(LayerNormBackwardArgs& a) {
  co::layernorm_backward(a.x, a.w, a.mean, a.rstd, a.dy, a.dx, a.dw.defined() ? &a.dw : nullptr,
                         a.db.defined() ? &a.db : nullptr);
}
void rope_tables_cuda(RopeTablesArgs& a) {
  co::rope_tables(a.max_pos, a.head_dim, a.theta, a.cos, a.sin);
}
void rope_cuda(RopeArgs& a) {
  co::rope(a.x, a.cos, a.sin, a.style, a.pos_offset, a.backward, a.out);
}
template <Op O>
void activation_cuda(ActivationArgs<O>& a) {
  co::activation(O, a.x, a.y);
}
template <Op O>
void activation_backward_cuda(ActivationBackwardArgs<O>& a) {
  co::activation_backward(O, a.x, a.dy, a.dx);
}
void swiglu_cuda(SwiGluArgs& a) { co::swiglu(a.gate, a.up, a.out); }
void swiglu_backward_cuda(SwiGluBackwardArgs& a) {
  co::swiglu_backward(a.gate, a.up, a.dout, a.dgate, a.dup);
}
void cross_entropy_cuda(CrossEntropyArgs& a) {
  co::cross_entropy(a.logits, a.targets, a.ignore_index, a.loss, a.lse);
}
void cross_entropy_backward_cuda(CrossEntropyBackwardArgs& a) {
  co::cross_entropy_backward(a.logits, a.lse, a.targets, a.dloss, a.ignore_index, a.dlogits);
}
void dropout_cuda(DropoutArgs& a) { co::dropout(a.x, a.p, a.seed, a.offset, a.y, a.mask); }
void dropout_backward_cuda(DropoutBackwardArgs& a) {
  co::dropout_backward(a.dy, a.mask, a.p, a.dx);
}
void adamw_cuda(AdamWArgs& a) {
  co::adamw_step(a.param, a.grad, a.m, a.v, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step);
}
void adamw_multi_cuda(AdamWMultiArgs& a) {
  co::adamw_multi_step(a.items, a.lr, a.beta1, a.beta2, a.eps, a.step);
}
void sgd_cuda(SgdArgs& a) {
  co::sgd_step(a.param, a.grad, a.momentum_buf, a.lr, a.momentum, a.dampening, a.weight_decay,
               a.nesterov, a.step);
}

}  // namespace

// The CUDA glue reads strided inputs itself (copying only what a kernel cannot read), so the
// entries are Layout::Strided unless stated.
void register_cuda_kernels() {
  constexpr Layout S = Layout::Strided;
  register_cuda<CopyArgs>(&copy_cuda, kAll, {.layout = S});
  register_cuda<FillArgs>(&fill_cuda, kAll, {.layout = S});
  // f64 too: the Philox stream matches the CPU's in every float dtype (random.cu instantiates
  // double, and CudaBasic.RandomMatchesCpuStream compares it).
  register_cuda<RandomArgs>(&random_cuda, {DType::F32, DType::BF16, DType::F16, DType::F64},
                            {.layout = S});
  register_cuda<BinaryArgs>(&binary_cuda, kFloat, {.layout = S});
  register_cuda<UnaryArgs>(&unary_cuda, kFloat, {.layout = S});
  register_cuda<AffineArgs>(&affine_cuda, kFloat, {.layout = S});
  // The kernel widens x from any float dtype in registers (bf16 gradients into f32 ones).
  register_cuda<AxpyArgs>(&axpy_cuda, kFloat, {.layout = S, .mixed_inputs = true});
  register_cuda<ScaleArgs>(&scale_cuda, kFloat, {.layout = S});
  register_cuda<ReduceArgs>(&reduce_cuda, kFloat, {.layout = S});
  register_cuda<ArgmaxArgs>(&argmax_cuda, kFloat, {.layout = S});
  register_cuda<SumAllArgs>(&sum_all_cuda, kFloat, {.layout = S});
  register_cuda<SumSquaresArgs>(&sum_squares_cuda, kFloat, {.layout = S});
  // Reads f32, bf16 and f16 tensors in one launch (keyed f32, converting nothing).
  register_cuda<SumSquaresMultiArgs>(
      &sum_squares_multi_cuda, {DType::F32},
      {.layout = S, .scratch = &sum_squares_multi_scratch, .mixed_inputs = true});
  register_cuda<GemmArgs>(&gemm_cuda, kFloat, {.layout = S});
  register_cuda<MatmulArgs>(&matmul_cuda, kFloat, {.layout = S});
  register_cuda<LinearArgs>(&linear_cuda, kFloat, {.layout = S});
  register_cuda<SoftmaxArgs>(&softmax_cuda, kFloat, {.layout = S});
  register_cuda<SoftmaxBackwardArgs>(&softmax_backward_cuda, kFloat, {.layout = S});
  register_cuda<EmbeddingArgs>(&embedding_cuda, kFloat, {.layout = S});
  register_cuda<EmbeddingBackwardArgs>(&embedding_backward_cuda, kFloat,
                                       {.layout = S, .mixed_inputs = true});
  register_cuda<RmsNormArgs>(&rmsnorm_cuda, kFloat, {.layout = S});
  register_cuda<RmsNormBackwardArgs>(&rmsnorm_backward_cuda, kFloat,
                                     {.layout = S, .scratch = &rmsnorm_backward_scratch});
  register_cuda<LayerNormArgs>(&layernorm_cuda, kFloat, {.layout = S});
  register_cuda<LayerNormBackwardArgs>(&layernorm_backward_cuda, kFloat,
                                       {.layout = S, .scratch = &layernorm_backward_scratch});
  register_cuda<RopeTablesArgs>(&rope_tables_cuda, {DType::F32}, {.layout = S});
  register_cuda<RopeArgs>(&rope_cuda, kFloat, {.layout = S});
  for_each_activation([&]<Op O>() {
    register_cuda<ActivationArgs<O>>(&activation_cuda<O>, kFloat, {.layout = S});
    register_cuda<ActivationBackwardArgs<O>>(&activation_backward_cuda<O>, kFloat, {.layout = S});
  });
  register_cuda<SwiGluArgs>(&swiglu_cuda, kFloat, {.layout = S});
  register_cuda<SwiGluBackwardArgs>(&swiglu_backward_cuda, kFloat, {.layout = S});
  cuda_glue::register_cuda_attention(attention_impl());
  register_cuda<CrossEntropyArgs>(&cross_entropy_cuda, kFloat, {.layout = S});
  register_cuda<CrossEntropyBackwardArgs>(&cross_entropy_backward_cuda, kFloat, {.layout = S});
  register_cuda<DropoutArgs>(&dropout_cuda, kFloat, {.layout = S});
  register_cuda<DropoutBackwardArgs>(&dropout_backward_cuda, kFloat, {.layout = S});
  register_cuda<AdamWArgs>(&adamw_cuda, {DType::F32}, {.layout = S});
  register_cuda<AdamWMultiArgs>(&adamw_multi_cuda, {DType::F32}, {.layout = S});
  register_cuda<SgdArgs>(&sgd_cuda, {DType::F32}, {.layout = S});
}

}  // namespace kiln::ops
