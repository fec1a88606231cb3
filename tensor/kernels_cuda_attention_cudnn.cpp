// CUDA front end, cuDNN attention: ops::attention / ops::attention_backward land here for CUDA
// tensors under ops::set_attention_impl(ops::AttentionImpl::Cudnn) (see tensor/kernels_cuda.h). The
// cuDNN graph, the plan cache and the launch are in kernels/cuda/attention_cudnn.{h,cpp}; this file
// checks the kiln tensors, maps them to a cudnn_sdpa::SdpaKey and hands cuDNN its workspace as a
// Temporaries tensor (freed on return: everything runs on the legacy default stream).
//
// Supported: bf16 and f16 (cuDNN's fused attention has no f32 path), head dim a multiple of 8 up to
// 256, any q_offset with q_offset + Tq <= Tk in forward (decode against a KV-cache view whose batch
// stride is larger), Tq == Tk with q_offset 0 in backward. The meta device's dry run does not see
// the cuDNN workspace (it comes from cuDNN's plan, known only on a device).
#include "tensor/kernels_cuda.h"

#if defined(KILN_CUDA)

#include "kernels/cuda/attention_cudnn.h"
#include "tensor/memory.h"

namespace kiln::ops::cuda_ops {
namespace {

namespace sdpa = ::kiln::cuda::cudnn_sdpa;

sdpa::IoType io_type(DType t) {
  if (t == DType::BF16) return sdpa::IoType::BF16;
  if (t == DType::F16) return sdpa::IoType::F16;
  fail("[attention] cuDNN fused attention needs bf16 or f16, got {}", dtype_name(t));
}

// (B, T, H, D) with dense T/H/D; the batch stride may be larger (a KV-cache view).
void check_bthd(const Tensor& t, const char* what) {
  KILN_CHECK(t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3) &&
                 t.stride(1) == t.size(2) * t.size(3) &&
                 (t.size(0) == 1 || t.stride(0) >= t.size(1) * t.stride(1)),
             "[attention] cuDNN: {} must be (B, T, H, D) with dense T/H/D, got shape {} strides {}",
             what, shape_str(t.shape()), shape_str(t.strides()));
}

void check_device(const Tensor& t, const Tensor& ref, const char* what) {
  KILN_CHECK(t.device() == ref.device(), "[attention] cuDNN: {} on {}, expected {}", what,
             t.device().str(), ref.device().str());
}

void check_lse(const Tensor& lse, std::int64_t B, std::int64_t H, std::int64_t T) {
  KILN_CHECK(lse.dtype() == DType::F32 && lse.is_contiguous() && lse.shape() == Shape({B, H, T}),
             "[attention] cuDNN: lse must be contiguous f32 ({}, {}, {}), got {} {}", B, H, T,
             dtype_name(lse.dtype()), shape_str(lse.shape()));
}

// Makes `device` current for the scope (plans and the cuDNN handle are per device).
struct DeviceScope {
  int prev;
  explicit DeviceScope(int device) : prev(cuda::current_device()) {
    if (prev != device) cuda::set_device(device);
  }
  ~DeviceScope() {
    if (prev != cuda::current_device()) cuda::set_device(prev);
  }
};

// cuDNN's workspace (plus our scratch) as a Temporaries byte buffer.
Tensor workspace_tensor(std::size_t bytes, Device device) {
  if (bytes == 0) return {};
  MemoryScope scope(MemCategory::Temporaries);
  return Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::Bool, device);
}

}  // namespace

void attention_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                     std::int64_t q_offset, Tensor& out, Tensor& lse) {
  // q: (B, Tq, Hq, D) contiguous, k/v: (B, Tk, Hkv, D), out like q, lse (B, Hq, Tq) f32.
  const sdpa::IoType io = io_type(q.dtype());
  KILN_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype() && out.dtype() == q.dtype(),
             "[attention] cuDNN: dtype mismatch");
  KILN_CHECK(q.is_contiguous() && out.is_contiguous() && out.shape() == q.shape(),
             "[attention] cuDNN: q and out must be contiguous and alike");
  check_bthd(q, "q");
  check_bthd(k, "k");
  check_bthd(v, "v");
  KILN_CHECK(k.shape() == v.shape() && k.stride(0) == v.stride(0),
             "[attention] cuDNN: k {} and v {} must have the same shape and batch stride",
             shape_str(k.shape()), shape_str(v.shape()));
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}})
    check_device(*t, q, name);

  sdpa::SdpaKey key;
  key.backward = false;
  key.io = io;
  key.B = q.size(0);
  key.Tq = q.size(1);
  key.Hq = q.size(2);
  key.D = q.size(3);
  key.Tk = k.size(1);
  key.Hkv = k.size(2);
  key.kv_batch_stride = key.B == 1 ? key.Tk * key.Hkv * key.D : k.stride(0);
  key.q_offset = q_offset;
  key.scale = static_cast<float>(scale);
  key.device = q.device().index;
  KILN_CHECK(k.size(0) == key.B && k.size(3) == key.D, "[attention] cuDNN: q {} and k {} disagree",
             shape_str(q.shape()), shape_str(k.shape()));
  check_lse(lse, key.B, key.Hq, key.Tq);
  if (q.numel() == 0) return;

  DeviceScope device(key.device);
  const std::size_t ws_bytes = sdpa::workspace_bytes(key);
  Tensor ws = workspace_tensor(ws_bytes, q.device());
  sdpa::forward(key, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.data<float>(),
                ws.defined() ? ws.raw_data() : nullptr, ws_bytes, nullptr);
}

void attention_backward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, double scale, Tensor& dq,
                              Tensor& dk, Tensor& dv) {
  // q/out/dout/dq: (B, T, Hq, D), k/v/dk/dv: (B, T, Hkv, D), all contiguous; lse (B, Hq, T) f32.
  const sdpa::IoType io = io_type(q.dtype());
  const Tensor* same_dtype[] = {&k, &v, &out, &dout, &dq, &dk, &dv};
  for (const Tensor* t : same_dtype)
    KILN_CHECK(t->dtype() == q.dtype(), "[attention] cuDNN backward: dtype mismatch ({} vs {})",
               dtype_name(t->dtype()), dtype_name(q.dtype()));
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&q, "q"},
                                {&k, "k"},
                                {&v, "v"},
                                {&out, "out"},
                                {&dout, "dout"},
                                {&dq, "dq"},
                                {&dk, "dk"},
                                {&dv, "dv"}}) {
    KILN_CHECK(t->dim() == 4 && t->is_contiguous(),
               "[attention] cuDNN backward: {} must be a contiguous (B, T, H, D), got {} {}", name,
               shape_str(t->shape()), shape_str(t->strides()));
    check_device(*t, q, name);
  }
  check_device(lse, q, "lse");
  KILN_CHECK(out.shape() == q.shape() && dout.shape() == q.shape() && dq.shape() == q.shape() &&
                 v.shape() == k.shape() && dk.shape() == k.shape() && dv.shape() == k.shape(),
             "[attention] cuDNN backward: shapes disagree (q {}, k {})", shape_str(q.shape()),
             shape_str(k.shape()));

  sdpa::SdpaKey key;
  key.backward = true;
  key.io = io;
  key.B = q.size(0);
  key.Tq = q.size(1);
  key.Hq = q.size(2);
  key.D = q.size(3);
  key.Tk = k.size(1);
  key.Hkv = k.size(2);
  key.kv_batch_stride = key.Tk * key.Hkv * key.D;
  key.q_offset = 0;
  key.scale = static_cast<float>(scale);
  key.device = q.device().index;
  KILN_CHECK(k.size(0) == key.B && k.size(3) == key.D,
             "[attention] cuDNN backward: q {} and k {} disagree", shape_str(q.shape()),
             shape_str(k.shape()));
  check_lse(lse, key.B, key.Hq, key.Tq);
  if (q.numel() == 0) return;

  DeviceScope device(key.device);
  const std::size_t ws_bytes = sdpa::workspace_bytes(key);
  Tensor ws = workspace_tensor(ws_bytes, q.device());
  sdpa::backward(key, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.data<float>(),
                 dout.raw_data(), dq.raw_data(), dk.raw_data(), dv.raw_data(),
                 ws.defined() ? ws.raw_data() : nullptr, ws_bytes, nullptr);
}

}  // namespace kiln::ops::cuda_ops

#endif  // KILN_CUDA
