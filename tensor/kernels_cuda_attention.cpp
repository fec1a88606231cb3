// CUDA glue, attention family: the CUDA entries of ops::attention and ops::attention_backward,
// in two implementations that take the same arguments:
//   - kiln's flash attention (kernels/cuda/attention.h): f32, bf16 and f16;
//   - cuDNN's fused SDPA (kernels/cuda/attention_cudnn.h): bf16 and f16 only, head dim a
//     multiple of 8 up to 256 (cudnn_sdpa::validate says so by name otherwise).
// Which one the table holds for bf16/f16 is chosen by register_cuda_attention(), which
// ops::set_attention_impl calls (`--attention auto|kiln|cudnn`); f32 always runs kiln's. Auto
// (the default) holds entries that pick per shape (cuda::auto_attention_uses_cudnn): cuDNN for
// training's shape, kiln's kernels for decode and prefill over a KV cache.
//
// The front end (ops::attention) has checked shapes, dtypes and the GQA ratio; the dispatcher
// has put every tensor on one device, in T, and made q (forward) or every input (backward)
// contiguous, while k/v keep their dense (T, H, D) with a KV cache's larger batch stride. What
// is left here: the plan (kernel, grid, scratch) and the scratch itself, charged to
// Temporaries and freed on return (everything runs on the legacy default stream).
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_cudnn.h"
#include "tensor/kernels_cuda_glue.h"
#include "tensor/memory.h"
#include "tensor/op_args.h"

#if defined(KILN_CUDA)
#include <array>
#include <mutex>
#endif

namespace kiln::ops {
namespace cuda_glue {
namespace {

namespace sdpa = ::kiln::cuda::cudnn_sdpa;

// The kernels' view of q (B, Tq, Hq, D) against k/v (B, Tk, Hkv, D): the batch stride is k's (a
// KV cache's may be larger), which v must share; a single batch may carry any, so make it at
// least one batch. (The front end checked k and v alike, but the dispatcher may have copied one
// of them to a dense layout since: then their batch strides differ, and v would be misread.)
cuda::AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v,
                                     std::int64_t q_offset) {
  KILN_CHECK(q.size(0) == 1 || k.stride(0) == v.stride(0),
             "[attention] k and v have batch strides {} and {} (one was not dense in (T, H, D) "
             "and was copied): give both the same layout",
             k.stride(0), v.stride(0));
  cuda::AttentionShape s{.B = q.size(0),
                         .Tq = q.size(1),
                         .Tk = k.size(1),
                         .Hq = q.size(2),
                         .Hkv = k.size(2),
                         .D = q.size(3),
                         .q_offset = q_offset,
                         .kv_batch_stride = k.stride(0)};
  if (s.B == 1 && s.kv_batch_stride < s.Tk * s.Hkv * s.D) s.kv_batch_stride = s.Tk * s.Hkv * s.D;
  return s;
}

// The same shape as cuDNN's plan-cache key.
sdpa::SdpaKey sdpa_key(const cuda::AttentionShape& s, bool backward, DType dt, double scale,
                       Device device) {
  sdpa::SdpaKey key;
  key.backward = backward;
  key.io = dt == DType::F16 ? sdpa::IoType::F16 : sdpa::IoType::BF16;
  key.B = s.B, key.Tq = s.Tq, key.Tk = s.Tk, key.Hq = s.Hq, key.Hkv = s.Hkv, key.D = s.D;
  // A single batch is described densely (its batch stride addresses nothing), so that every
  // KV-cache view of one batch shares a plan.
  key.kv_batch_stride = s.B == 1 ? s.Tk * s.Hkv * s.D : s.kv_batch_stride;
  key.q_offset = s.q_offset;
  key.scale = static_cast<float>(scale);
  key.device = device.index;
  return key;
}

// k and v (slots 1 and 2) are read with dense (T, H, D) and any batch stride; every other
// input must be contiguous.
bool attention_accepts(int slot, const Tensor& t) {
  if (slot == 1 || slot == 2)
    return t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3) &&
           t.stride(1) == t.size(2) * t.size(3);
  return t.is_contiguous();
}

// The backward's shape: training's (Tq == Tk, q_offset 0, dense k/v).
cuda::AttentionShape backward_shape(const AttentionBackwardArgs& a) {
  return cuda::training_attention_shape(a.q.size(0), a.q.size(1), a.q.size(2), a.k.size(2),
                                        a.q.size(3));
}

// kiln's backward allocates Di (B, Hq, T) f32 and, on the bf16 tensor-core path, an f32 dQ
// accumulator (B, T, Hq, D): the plan says how much, on any build.
ScratchList attention_backward_scratch(const AttentionBackwardArgs& a, DType dt) {
  const auto plan = cuda::plan_attention_backward(backward_shape(a), dt == DType::BF16, true);
  return {plan.scratch_floats * 4};
}

template <class T>
struct AttentionCuda {
  static void run(AttentionArgs& a);
};
template <class T>
struct AttentionBackwardCuda {
  static void run(AttentionBackwardArgs& a);
};
// cuDNN's own workspace comes from its plan, known only on a device: the dry run sees the
// backward's softmax_sum and dQ accumulator (cudnn_sdpa::scratch_bytes), not that workspace.
template <class T>
struct AttentionCudnn {
  static void run(AttentionArgs& a);
};
template <class T>
struct AttentionBackwardCudnn {
  static void run(AttentionBackwardArgs& a);
};

// Auto: cuDNN where cuda::auto_attention_uses_cudnn says so, kiln's kernels elsewhere.
template <class T>
struct AttentionAuto {
  static void run(AttentionArgs& a);
};
template <class T>
struct AttentionBackwardAuto {
  static void run(AttentionBackwardArgs& a);
};

// cuDNN's backward scratch beside its workspace: softmax_sum (B, Hq, T) and the f32 dQ
// accumulator (B, Hq, T, D), each 256-byte aligned.
ScratchList attention_backward_scratch_cudnn(const AttentionBackwardArgs& a, DType dt) {
  return {static_cast<std::int64_t>(
      sdpa::scratch_bytes(sdpa_key(backward_shape(a), true, dt, a.scale, a.q.device())))};
}

ScratchList attention_backward_scratch_auto(const AttentionBackwardArgs& a, DType dt) {
  return cuda::auto_attention_uses_cudnn(backward_shape(a))
             ? attention_backward_scratch_cudnn(a, dt)
             : attention_backward_scratch(a, dt);
}

#if defined(KILN_CUDA)

bool aligned16(const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.raw_data()) % 16 == 0; }

void check_current_device(const Tensor& t, const char* op) {
  const int current = cuda::current_device();
  KILN_CHECK(t.device().index == current,
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

// `bytes` of scratch (an f32 buffer, or cuDNN's byte workspace) as a Temporaries tensor.
Tensor scratch_tensor(std::int64_t n, DType dt, Device device) {
  if (n <= 0) return Tensor();
  MemoryScope scope(MemCategory::Temporaries);
  return Tensor::empty({n}, dt, device);
}
void* data_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// Makes `device` current for the scope (cuDNN's plans and handle are per device).
struct DeviceScope {
  int prev;
  explicit DeviceScope(int device) : prev(cuda::current_device()) {
    if (prev != device) cuda::set_device(device);
  }
  ~DeviceScope() {
    if (prev != cuda::current_device()) cuda::set_device(prev);
  }
};

template <class T>
void AttentionCuda<T>::run(AttentionArgs& a) {
  check_current_device(a.q, "attention");
  const cuda::AttentionShape s = attention_shape(a.q, a.k, a.v, a.q_offset);
  const bool aligned = aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out) &&
                       s.kv_batch_stride % 8 == 0;
  const cuda::AttentionPlan plan = cuda::plan_attention_forward(
      s, std::is_same_v<T, bf16>, aligned, num_sms(), cuda::decode_attention_enabled());
  Tensor scratch = scratch_tensor(plan.scratch_floats, DType::F32, a.q.device());
  cuda::attention_forward<T>(plan, s, static_cast<float>(a.scale), a.q.data<T>(), a.k.data<T>(),
                             a.v.data<T>(), a.out.data<T>(), a.lse.data<float>(),
                             static_cast<float*>(data_or_null(scratch)), nullptr);
}

template <class T>
void AttentionBackwardCuda<T>::run(AttentionBackwardArgs& a) {
  check_current_device(a.q, "attention_backward");
  const cuda::AttentionShape s = backward_shape(a);
  bool aligned = true;
  for (const Tensor* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv})
    aligned = aligned && aligned16(*t);
  const cuda::AttentionPlan plan =
      cuda::plan_attention_backward(s, std::is_same_v<T, bf16>, aligned);
  Tensor scratch = scratch_tensor(plan.scratch_floats, DType::F32, a.q.device());
  cuda::attention_backward<T>(plan, s, static_cast<float>(a.scale), a.q.data<T>(), a.k.data<T>(),
                              a.v.data<T>(), a.out.data<T>(), a.lse.data<float>(), a.dout.data<T>(),
                              a.dq.data<T>(), a.dk.data<T>(), a.dv.data<T>(),
                              static_cast<float*>(data_or_null(scratch)), nullptr);
}

template <class T>
void AttentionCudnn<T>::run(AttentionArgs& a) {
  const sdpa::SdpaKey key = sdpa_key(attention_shape(a.q, a.k, a.v, a.q_offset), false,
                                     dtype_of<T>(), a.scale, a.q.device());
  DeviceScope device(key.device);
  const std::size_t ws_bytes = sdpa::workspace_bytes(key);
  Tensor ws = scratch_tensor(static_cast<std::int64_t>(ws_bytes), DType::Bool, a.q.device());
  sdpa::forward(key, a.q.raw_data(), a.k.raw_data(), a.v.raw_data(), a.out.raw_data(),
                a.lse.data<float>(), data_or_null(ws), ws_bytes, nullptr);
}

template <class T>
void AttentionBackwardCudnn<T>::run(AttentionBackwardArgs& a) {
  const sdpa::SdpaKey key = sdpa_key(backward_shape(a), true, dtype_of<T>(), a.scale, a.q.device());
  DeviceScope device(key.device);
  const std::size_t ws_bytes = sdpa::workspace_bytes(key);
  Tensor ws = scratch_tensor(static_cast<std::int64_t>(ws_bytes), DType::Bool, a.q.device());
  sdpa::backward(key, a.q.raw_data(), a.k.raw_data(), a.v.raw_data(), a.out.raw_data(),
                 a.lse.data<float>(), a.dout.raw_data(), a.dq.raw_data(), a.dk.raw_data(),
                 a.dv.raw_data(), data_or_null(ws), ws_bytes, nullptr);
}

template <class T>
void AttentionAuto<T>::run(AttentionArgs& a) {
  if (cuda::auto_attention_uses_cudnn(attention_shape(a.q, a.k, a.v, a.q_offset)))
    AttentionCudnn<T>::run(a);
  else
    AttentionCuda<T>::run(a);
}

template <class T>
void AttentionBackwardAuto<T>::run(AttentionBackwardArgs& a) {
  if (cuda::auto_attention_uses_cudnn(backward_shape(a)))
    AttentionBackwardCudnn<T>::run(a);
  else
    AttentionBackwardCuda<T>::run(a);
}

#endif  // KILN_CUDA

}  // namespace

void register_cuda_attention(AttentionImpl impl) {
  const Kernel<AttentionArgs> fwd{.accepts = &attention_accepts};
  const Kernel<AttentionBackwardArgs> bwd_kiln{.scratch = &attention_backward_scratch};
  register_cuda<AttentionArgs, AttentionCuda, float>(fwd);
  register_cuda<AttentionBackwardArgs, AttentionBackwardCuda, float>(bwd_kiln);
  if (impl == AttentionImpl::Auto) {
    register_cuda<AttentionArgs, AttentionAuto, bf16, f16>(fwd);
    register_cuda<AttentionBackwardArgs, AttentionBackwardAuto, bf16, f16>(
        {.scratch = &attention_backward_scratch_auto});
  } else if (impl == AttentionImpl::Cudnn) {
    register_cuda<AttentionArgs, AttentionCudnn, bf16, f16>(fwd);
    register_cuda<AttentionBackwardArgs, AttentionBackwardCudnn, bf16, f16>(
        {.scratch = &attention_backward_scratch_cudnn});
  } else {
    register_cuda<AttentionArgs, AttentionCuda, bf16, f16>(fwd);
    register_cuda<AttentionBackwardArgs, AttentionBackwardCuda, bf16, f16>(bwd_kiln);
  }
}

}  // namespace cuda_glue
}  // namespace kiln::ops
