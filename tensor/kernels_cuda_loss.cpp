// CUDA front end, loss family: fused cross-entropy, AdamW (single and multi-tensor), SGD, and
// the multi-tensor sum of squares (see tensor/kernels_cuda.h for the contract,
// kernels/cuda/cross_entropy.h and kernels/cuda/optimizer.h for the kernels).
#include "tensor/kernels_cuda.h"

#if defined(KILN_CUDA)

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/optimizer.h"
#include "tensor/dispatch.h"
#include "tensor/memory.h"

namespace kiln::ops::cuda_ops {
namespace {

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
Strided rows_of(const Tensor& logits) {
  const std::int64_t N = logits.size(0), V = logits.size(1);
  if ((V == 1 || logits.stride(1) == 1) && (N == 1 || logits.stride(0) >= V))
    return {logits, N == 1 ? V : logits.stride(0)};
  return {dense(logits), V};
}

void check_same_cuda_device(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.device() == b.device(), "[{}] tensors on different devices: {} and {}", op,
             a.device().str(), b.device().str());
}

// Bad targets recorded on the device by earlier cross-entropy kernels (see
// kernels/cuda/cross_entropy.h): fail as the CPU does, before anything is written.
void throw_on_bad_target(std::int64_t V) {
  if (auto bad = cuda::decode_bad_target(cuda::cross_entropy_take_bad_target()))
    fail("[cross_entropy] target {} out of range [0, {}) at row {}", bad->target, V, bad->row);
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& targets, std::int32_t ignore_index,
                   Tensor& loss, Tensor& lse) {
  const std::int64_t N = logits.size(0), V = logits.size(1);
  KILN_CHECK(loss.dtype() == DType::F32 && lse.dtype() == DType::F32 && loss.is_contiguous() &&
                 lse.is_contiguous() && loss.numel() == N && lse.numel() == N,
             "[cross_entropy] loss and lse must be dense f32 ({})", N);
  check_same_cuda_device(logits, targets, "cross_entropy");
  if (N == 0) return;
  const Strided x = rows_of(logits);
  const Tensor t = dense(targets);
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::cross_entropy_forward<T>(N, V, x.stride, x.t.data<T>(), t.data<std::int32_t>(),
                                   ignore_index, loss.data<float>(), lse.data<float>());
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            const Tensor& dloss, std::int32_t ignore_index, Tensor& dlogits) {
  const std::int64_t N = logits.size(0), V = logits.size(1);
  KILN_CHECK(dlogits.dtype() == logits.dtype() && dlogits.is_contiguous() &&
                 dlogits.shape() == logits.shape(),
             "[cross_entropy] dlogits must be dense {} {}", dtype_name(logits.dtype()),
             shape_str(logits.shape()));
  KILN_CHECK(targets.dtype() == DType::I32 && targets.numel() == N && lse.numel() == N,
             "[cross_entropy] targets (i32) and lse need {} elements", N);
  for (const Tensor* o : std::initializer_list<const Tensor*>{&lse, &targets, &dloss, &dlogits})
    check_same_cuda_device(logits, *o, "cross_entropy");
  if (N == 0) return;
  throw_on_bad_target(V);  // one sync; the autograd node has just synced on dloss anyway
  const bool in_place = dlogits.raw_data() == logits.raw_data();
  KILN_CHECK(in_place ? logits.is_contiguous() : !dlogits.same_storage(logits),
             "[cross_entropy] dlogits may only alias dense logits exactly (in place)");
  const Strided x = in_place ? Strided{logits, V} : rows_of(logits);
  const Tensor t = dense(targets);
  const Strided l = vector_of(lse, DType::F32);
  const Strided g = vector_of(dloss, DType::F32);
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::cross_entropy_backward<T>(N, V, x.stride, x.t.data<T>(), l.t.data<float>(), l.stride,
                                    t.data<std::int32_t>(), ignore_index, g.t.data<float>(),
                                    g.stride, dlogits.data<T>());
  });
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, double lr, double beta1,
                double beta2, double eps, double weight_decay, std::int64_t step) {
  // The front end checked: dense f32 param, grad, m, v of one shape.
  for (const Tensor* o : std::initializer_list<const Tensor*>{&grad, &m, &v})
    check_same_cuda_device(param, *o, "adamw");
  cuda::adamw_step(param.numel(), param.data<float>(), grad.data<float>(), m.data<float>(),
                   v.data<float>(), static_cast<float>(lr), static_cast<float>(beta1),
                   static_cast<float>(beta2), static_cast<float>(eps),
                   static_cast<float>(weight_decay), step);
}

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, double lr, double momentum,
              double dampening, double weight_decay, bool nesterov, std::int64_t step) {
  check_same_cuda_device(param, grad, "sgd");
  float* buf = nullptr;
  if (momentum_buf.defined()) {
    KILN_CHECK(momentum_buf.dtype() == DType::F32 && momentum_buf.is_contiguous() &&
                   momentum_buf.numel() == param.numel(),
               "[sgd] the momentum buffer must be dense f32 like the parameter");
    check_same_cuda_device(param, momentum_buf, "sgd");
    buf = momentum_buf.data<float>();
  }
  cuda::sgd_step(param.numel(), param.data<float>(), grad.data<float>(), buf,
                 static_cast<float>(lr), static_cast<float>(momentum),
                 static_cast<float>(dampening), static_cast<float>(weight_decay), nesterov, step);
}

void adamw_multi_step(std::span<AdamWTensors> items, double lr, double beta1, double beta2,
                      double eps, std::int64_t step) {
  // Same float rounding of the options as adamw_step_ on each item (the CPU fallback).
  const float lr_f = static_cast<float>(lr);
  const cuda::AdamWConsts c = cuda::adamw_consts(
      lr_f, static_cast<float>(beta1), static_cast<float>(beta2), static_cast<float>(eps), step);
  std::vector<cuda::AdamWItem> list;
  list.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    AdamWTensors& it = items[i];
    const std::int64_t n = it.param.numel();
    const Tensor& w = it.master.defined() ? it.master : it.param;
    KILN_CHECK(it.param.is_contiguous() && w.dtype() == DType::F32 && w.numel() == n &&
                   it.grad.numel() == n && it.m.numel() == n && it.v.numel() == n,
               "[adamw] item {}: needs a dense parameter with f32 weights, and "
               "grad, m, v of "
               "its size {}",
               i, n);
    for (const Tensor* o : std::initializer_list<const Tensor*>{&it.grad, &w, &it.m, &it.v})
      check_same_cuda_device(it.param, *o, "adamw");
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
    x.numel = n;
    x.decay = cuda::adamw_decay(lr_f, static_cast<float>(it.weight_decay));
    list.push_back(x);
  }
  cuda::adamw_multi_step(list, c);
}

void sum_squares_multi(std::span<const Tensor> tensors, double* result) {
  std::vector<Tensor> keep;  // contiguous copies stay alive until the kernel has run
  std::vector<cuda::SumSquaresItem> list;
  const Tensor* first = nullptr;
  for (const Tensor& x : tensors) {
    if (!x.defined() || x.numel() == 0) continue;
    KILN_CHECK(x.device().is_cuda(), "[sum_squares] {} tensor in a CUDA multi-tensor sum",
               x.device().str());
    if (first) check_same_cuda_device(*first, x, "sum_squares");
    first = &x;
    cuda::SumSquaresItem it;
    it.dtype = opt_dtype(x.dtype(), "sum_squares");
    keep.push_back(dense(x));
    it.data = keep.back().raw_data();
    it.numel = x.numel();
    list.push_back(it);
  }
  *result = cuda::sum_squares_multi(list);  // synchronizes before `keep` is released
}

}  // namespace kiln::ops::cuda_ops

#endif  // KILN_CUDA
