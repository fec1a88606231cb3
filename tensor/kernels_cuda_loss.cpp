// CUDA glue, loss family: fused cross-entropy, AdamW (single and multi-tensor), SGD, and the
// multi-tensor sum of squares, on kernels/cuda/cross_entropy.h and kernels/cuda/optimizer.h, as
// entries registered beside their bodies (tensor/kernels_cuda_glue.h). The front end
// (tensor/ops_nn.cpp, ops_basic.cpp) has checked shapes, dtypes and devices, the multi-tensor
// items' included.
#include "tensor/kernels_cuda_glue.h"
#include "tensor/op_args.h"

#if defined(KILN_CUDA)
#include <cstdint>
#include <vector>

#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/optimizer.h"
#include "tensor/memory.h"
#endif

namespace kiln::ops {
namespace cuda_glue {
namespace {

template <class T>
struct CrossEntropyCuda {
  static void run(CrossEntropyArgs& a);
};
template <class T>
struct CrossEntropyBackwardCuda {
  static void run(CrossEntropyBackwardArgs& a);
};
// The optimizers update f32 weights (parameters or masters): registered for f32 only, whatever
// the parameters' dtype.
template <class T>
struct AdamWCuda {
  static void run(AdamWArgs& a);
};
template <class T>
struct AdamWMultiCuda {
  static void run(AdamWMultiArgs& a);
};
template <class T>
struct SgdCuda {
  static void run(SgdArgs& a);
};
template <class T>
struct SumSquaresMultiCuda {
  static void run(SumSquaresMultiArgs& a);
};

// The multi-tensor sum of squares copies each non-contiguous tensor to a dense one first.
ScratchList sum_squares_multi_scratch(const SumSquaresMultiArgs& a, DType) {
  ScratchList bytes;
  for (const Tensor& t : a.tensors)
    if (!t.is_contiguous())
      bytes.push_back(t.numel() * static_cast<std::int64_t>(dtype_size(t.dtype())));
  return bytes;
}

#if defined(KILN_CUDA)

cuda::OptDType opt_dtype(DType dt, const char* op) {
  switch (dt) {
    case DType::F32:
      return cuda::OptDType::F32;
    case DType::BF16:
      return cuda::OptDType::BF16;
    case DType::F16:
      return cuda::OptDType::F16;
    default:
      fail("[{}] {} is not supported on CUDA", op, dtype_name(dt));
  }
}

Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  MemoryScope scratch(MemCategory::Temporaries);
  return t.contiguous();
}

// An (N) operand as (tensor, element stride); 1-d views keep their stride (0 for a broadcast).
struct Strided {
  Tensor t;
  std::int64_t stride;
};
Strided vector_of(const Tensor& x, DType want) {
  Tensor t = x;
  if (t.dtype() != want) {
    MemoryScope scratch(MemCategory::Temporaries);
    t = t.to(want);
  }
  if (t.dim() == 1) return {t, t.stride(0)};
  return {dense(t), 1};
}

// logits (N, V) with unit stride inside rows: (tensor, row stride); a contiguous copy otherwise.
Strided logits_rows(const Tensor& logits) {
  const std::int64_t N = logits.size(0), V = logits.size(1);
  if ((V == 1 || logits.stride(1) == 1) && (N == 1 || logits.stride(0) >= V))
    return {logits, N == 1 ? V : logits.stride(0)};
  return {dense(logits), V};
}

// Bad targets recorded on the device by earlier cross-entropy kernels (see
// kernels/cuda/cross_entropy.h): fail as the CPU does, before anything is written.
void throw_on_bad_target(std::int64_t V) {
  if (auto bad = cuda::decode_bad_target(cuda::cross_entropy_take_bad_target()))
    fail("[cross_entropy] target {} out of range [0, {}) at row {}", bad->target, V, bad->row);
}

// Fused, chunked over V: no (N, V) f32 buffer. loss, lse: (N) f32.
template <class T>
void CrossEntropyCuda<T>::run(CrossEntropyArgs& a) {
  const std::int64_t N = a.logits.size(0), V = a.logits.size(1);
  const Strided x = logits_rows(a.logits);
  const Tensor t = dense(a.targets);
  cuda::cross_entropy_forward<T>(N, V, x.stride, x.t.template data<T>(), t.data<std::int32_t>(),
                                 a.ignore_index, a.loss.template data<float>(),
                                 a.lse.template data<float>());
}

// dlogits may share storage with logits (in place).
template <class T>
void CrossEntropyBackwardCuda<T>::run(CrossEntropyBackwardArgs& a) {
  const std::int64_t N = a.logits.size(0), V = a.logits.size(1);
  throw_on_bad_target(V);  // one sync; the autograd node has just synced on dloss anyway
  const bool in_place = a.dlogits.raw_data() == a.logits.raw_data();
  KILN_CHECK(in_place ? a.logits.is_contiguous() : !a.dlogits.same_storage(a.logits),
             "[cross_entropy] dlogits may only alias dense logits exactly (in place)");
  const Strided x = in_place ? Strided{a.logits, V} : logits_rows(a.logits);
  const Tensor t = dense(a.targets);
  const Strided l = vector_of(a.lse, DType::F32);
  const Strided g = vector_of(a.dloss, DType::F32);
  cuda::cross_entropy_backward<T>(N, V, x.stride, x.t.template data<T>(),
                                  l.t.template data<float>(), l.stride, t.data<std::int32_t>(),
                                  a.ignore_index, g.t.template data<float>(), g.stride,
                                  a.dlogits.template data<T>());
}

template <class T>
void AdamWCuda<T>::run(AdamWArgs& a) {
  cuda::adamw_step(a.param.numel(), a.param.data<float>(), a.grad.data<float>(), a.m.data<float>(),
                   a.v.data<float>(), static_cast<float>(a.lr), static_cast<float>(a.beta1),
                   static_cast<float>(a.beta2), static_cast<float>(a.eps),
                   static_cast<float>(a.weight_decay), a.step);
}

template <class T>
void SgdCuda<T>::run(SgdArgs& a) {
  float* buf = a.momentum_buf.defined() ? a.momentum_buf.data<float>() : nullptr;
  cuda::sgd_step(a.param.numel(), a.param.data<float>(), a.grad.data<float>(), buf,
                 static_cast<float>(a.lr), static_cast<float>(a.momentum),
                 static_cast<float>(a.dampening), static_cast<float>(a.weight_decay), a.nesterov,
                 a.step);
}

// Every parameter in one launch (ops::adamw_multi_step_).
template <class T>
void AdamWMultiCuda<T>::run(AdamWMultiArgs& a) {
  // Same float rounding of the options as adamw_step_ on each item (the CPU fallback).
  const float lr_f = static_cast<float>(a.lr);
  const cuda::AdamWConsts c =
      cuda::adamw_consts(lr_f, static_cast<float>(a.beta1), static_cast<float>(a.beta2),
                         static_cast<float>(a.eps), a.step);
  std::vector<cuda::AdamWItem> list;
  list.reserve(a.items.size());
  for (std::size_t i = 0; i < a.items.size(); ++i) {
    AdamWTensors& it = a.items[i];
    cuda::AdamWItem x;
    x.param_dtype = opt_dtype(it.param.dtype(), "adamw");
    x.grad_dtype = opt_dtype(it.grad.dtype(), "adamw");
    KILN_CHECK(x.grad_dtype == x.param_dtype || x.grad_dtype == cuda::OptDType::F32,
               "[adamw] item {}: a {} gradient for a {} parameter", i, dtype_name(it.grad.dtype()),
               dtype_name(it.param.dtype()));
    x.param = it.param.raw_data();
    x.grad = it.grad.raw_data();
    x.master = it.master.defined() ? it.master.data<float>() : nullptr;
    x.m = it.m.data<float>();
    x.v = it.v.data<float>();
    x.numel = it.param.numel();
    x.decay = cuda::adamw_decay(lr_f, static_cast<float>(it.weight_decay));
    list.push_back(x);
  }
  cuda::adamw_multi_step(list, c);
}

// Every tensor's sum of squares in one launch (f32 squares, f64 across blocks) and one
// device-to-host copy, the only sync. Deterministic.
template <class T>
void SumSquaresMultiCuda<T>::run(SumSquaresMultiArgs& a) {
  std::vector<Tensor> keep;  // contiguous copies stay alive until the kernel has run
  std::vector<cuda::SumSquaresItem> list;
  for (const Tensor& x : a.tensors) {
    cuda::SumSquaresItem it;
    it.dtype = opt_dtype(x.dtype(), "sum_squares");
    keep.push_back(dense(x));
    it.data = keep.back().raw_data();
    it.numel = x.numel();
    list.push_back(it);
  }
  a.result = cuda::sum_squares_multi(list);  // synchronizes before `keep` is released
}

#endif  // KILN_CUDA

}  // namespace

void register_loss() {
  constexpr Layout S = Layout::Strided;
  register_cuda<CrossEntropyArgs, CrossEntropyCuda, float, bf16, f16>({.layout = S});
  register_cuda<CrossEntropyBackwardArgs, CrossEntropyBackwardCuda, float, bf16, f16>(
      {.layout = S});
  register_cuda<AdamWArgs, AdamWCuda, float>({.layout = S});
  register_cuda<AdamWMultiArgs, AdamWMultiCuda, float>({.layout = S});
  register_cuda<SgdArgs, SgdCuda, float>({.layout = S});
  // Reads f32, bf16 and f16 tensors in one launch (keyed f32, converting nothing).
  register_cuda<SumSquaresMultiArgs, SumSquaresMultiCuda, float>(
      {.layout = S, .scratch = &sum_squares_multi_scratch, .mixed_inputs = true});
}

}  // namespace cuda_glue
}  // namespace kiln::ops
