// CUDA front end, attention family: kiln's own flash attention
// (kernels/cuda/attention.h).
//
// ops::attention / attention_backward have checked shapes, dtypes and the dense
// (T, H, D) inner layout of k and v, made q (and, for the backward, every
// input) contiguous, and allocated the outputs. Here: dtype support, the
// remaining layout checks, the plan (which kernel, grid and scratch), and the
// scratch itself, charged to Temporaries and freed on return:
//   forward: only when the generic kernel splits the keys (decode): splits x B
//   x Hq x Tq x (D+2)
//            f32;
//   backward: Di (B x Hq x T f32), plus the f32 dQ accumulator (B x T x Hq x D)
//   on the flash
//            path. The meta dry run does not see these (it never reaches this
//            file); cuda::plan_attention_forward/backward give the same sizes
//            on any build.
#include "kernels/cuda/attention.h"
#include "tensor/memory.h"
#include "tensor/kernels_cuda.h"

#if defined(KILN_CUDA)

#include <array>
#include <cstdint>
#include <initializer_list>
#include <mutex>

namespace kiln::ops::cuda_ops {
namespace {

void check_dtype(DType t, const char *op) {
  KILN_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16,
             "[{}] {} is not supported on CUDA", op, dtype_name(t));
}

bool aligned16(const Tensor &t) { return reinterpret_cast<std::uintptr_t>(t.raw_data()) % 16 == 0; }

void check_current_device(const Tensor &t, const char *op) {
  const int current = cuda::current_device();
  KILN_CHECK(t.device().is_cuda() && t.device().index == current,
             "[{}] tensors are on {} but the current CUDA device is {}", op, t.device().str(),
             current);
}

// SM count of the current device, asked once per device.
int num_sms() {
  static std::mutex mu;
  static std::array<int, 16> cache{};
  const int dev = cuda::current_device();
  std::lock_guard<std::mutex> lock(mu);
  if (dev < 0 || dev >= static_cast<int>(cache.size()))
    return cuda::device_info(dev).multiprocessors;
  if (cache[dev] == 0) cache[dev] = cuda::device_info(dev).multiprocessors;
  return cache[dev];
}

Tensor scratch_f32(std::int64_t n, Device device) {
  if (n <= 0) return Tensor();
  MemoryScope scope(MemCategory::Temporaries);
  return Tensor::empty({n}, DType::F32, device);
}

template <typename F>
void dispatch_attention(DType t, F &&f) {
  switch (t) {
    case DType::F32:
      f(float{});
      break;
    case DType::BF16:
      f(bf16{});
      break;
    case DType::F16:
      f(f16{});
      break;
    default:
      fail("[attention] {} is not supported on CUDA", dtype_name(t));
  }
}

}  // namespace

void attention(const Tensor &q, const Tensor &k, const Tensor &v, double scale,
               std::int64_t q_offset, Tensor &out, Tensor &lse) {
  check_dtype(q.dtype(), "attention");
  check_current_device(q, "attention");
  KILN_CHECK(q.is_contiguous() && out.is_contiguous() && out.dtype() == q.dtype(),
             "[attention] q and out must be contiguous with q's dtype");
  KILN_CHECK(lse.dtype() == DType::F32 && lse.is_contiguous() && lse.dim() == 3,
             "[attention] lse must be a contiguous (B, Hq, Tq) f32 tensor");
  cuda::AttentionShape s;
  s.B = q.size(0);
  s.Tq = q.size(1);
  s.Hq = q.size(2);
  s.D = q.size(3);
  s.Tk = k.size(1);
  s.Hkv = k.size(2);
  s.q_offset = q_offset;
  s.kv_batch_stride = k.stride(0);
  KILN_CHECK(k.stride(0) == v.stride(0) && k.stride(1) == s.Hkv * s.D && k.stride(2) == s.D &&
                 k.stride(3) == 1 && v.stride(1) == s.Hkv * s.D && v.stride(2) == s.D &&
                 v.stride(3) == 1,
             "[attention] k and v need dense (T, H, D) and one batch stride");
  // A single batch may carry any batch stride; make it at least one batch's
  // worth.
  if (s.B == 1 && s.kv_batch_stride < s.Tk * s.Hkv * s.D) s.kv_batch_stride = s.Tk * s.Hkv * s.D;
  const bool aligned =
      aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out) && s.kv_batch_stride % 8 == 0;
  const cuda::AttentionPlan plan =
      cuda::plan_attention_forward(s, q.dtype() == DType::BF16, aligned, num_sms());
  Tensor scratch = scratch_f32(plan.scratch_floats, q.device());
  float *sp = scratch.defined() ? scratch.data<float>() : nullptr;
  dispatch_attention(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::attention_forward<T>(plan, s, static_cast<float>(scale), q.data<T>(), k.data<T>(),
                               v.data<T>(), out.data<T>(), lse.data<float>(), sp, nullptr);
  });
}

void attention_backward(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &out,
                        const Tensor &lse, const Tensor &dout, double scale, Tensor &dq, Tensor &dk,
                        Tensor &dv) {
  check_dtype(q.dtype(), "attention_backward");
  check_current_device(q, "attention_backward");
  for (const Tensor *t : std::initializer_list<const Tensor *>{&k, &v, &out, &dout, &dq, &dk, &dv})
    KILN_CHECK(t->dtype() == q.dtype() && t->is_contiguous(),
               "[attention_backward] every tensor must be contiguous with q's "
               "dtype ({})",
               dtype_name(q.dtype()));
  KILN_CHECK(q.is_contiguous(), "[attention_backward] q must be contiguous");
  KILN_CHECK(lse.dtype() == DType::F32 && lse.is_contiguous() &&
                 lse.shape() == Shape({q.size(0), q.size(2), q.size(1)}),
             "[attention_backward] lse must be a contiguous (B, Hq, T) f32 "
             "tensor, got {} {}",
             dtype_name(lse.dtype()), shape_str(lse.shape()));
  KILN_CHECK(k.size(1) == q.size(1), "[attention_backward] needs Tq == Tk, got {} and {}",
             q.size(1), k.size(1));
  const cuda::AttentionShape s =
      cuda::training_attention_shape(q.size(0), q.size(1), q.size(2), k.size(2), q.size(3));
  bool aligned = true;
  for (const Tensor *t :
       std::initializer_list<const Tensor *>{&q, &k, &v, &out, &dout, &dq, &dk, &dv})
    aligned = aligned && aligned16(*t);
  const cuda::AttentionPlan plan =
      cuda::plan_attention_backward(s, q.dtype() == DType::BF16, aligned);
  Tensor scratch = scratch_f32(plan.scratch_floats, q.device());
  dispatch_attention(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::attention_backward<T>(plan, s, static_cast<float>(scale), q.data<T>(), k.data<T>(),
                                v.data<T>(), out.data<T>(), lse.data<float>(), dout.data<T>(),
                                dq.data<T>(), dk.data<T>(), dv.data<T>(), scratch.data<float>(),
                                nullptr);
  });
}

}  // namespace kiln::ops::cuda_ops

#endif  // KILN_CUDA
