// Helpers shared by the op front-end files (not a public header).
#pragma once

#include "tensor/ops.h"
#include "tensor/ops_cuda.h"

namespace kiln::ops {

// True when no kernel should run: meta tensors (accounting only) and empty
// outputs. Otherwise the caller runs the CUDA path (cuda_ops::, for CUDA
// tensors) or the CPU kernels.
inline bool skip_kernel(const Tensor& out, const char* /*op*/) {
  return out.device().is_meta() || out.numel() == 0;
}

// CUDA computes bf16/f16 natively and meta predicts a CUDA run, so both take
// the "device path": allocate the outputs only, then launch the CUDA kernel
// when there is one to run. The CPU path converts bf16/f16 to f32 scratch.
inline bool device_path(const Tensor& t) { return !t.device().is_cpu(); }
inline bool run_cuda(const Tensor& out) { return out.device().is_cuda() && out.numel() > 0; }

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.device() == b.device(), "[{}] tensors on different devices: {} and {}", op,
             a.device().str(), b.device().str());
}

inline DType compute_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// An input in its compute dtype (f32 for bf16/f16), contiguous if asked.
// Conversions are scratch: charged to Temporaries and freed with this object.
struct Computed {
  Tensor t;
  Computed(const Tensor& x, bool contiguous = false) {
    if (!x.defined()) return;
    DType cd = compute_dtype(x.dtype());
    if (x.dtype() == cd && (!contiguous || x.is_contiguous())) {
      t = x;
      return;
    }
    MemoryScope scratch(MemCategory::Temporaries);
    t = x.to(cd).contiguous();
  }
};

// The buffer a kernel writes: `out` itself when it has the compute dtype,
// otherwise an f32 scratch buffer that finish_out() converts into `out`.
inline Tensor compute_out(const Tensor& out) {
  if (out.dtype() == compute_dtype(out.dtype())) return out;
  MemoryScope scratch(MemCategory::Temporaries);
  return Tensor::empty(out.shape(), compute_dtype(out.dtype()), out.device());
}
inline void finish_out(Tensor& out, const Tensor& computed) {
  if (computed.impl() != out.impl()) out.copy_(computed);
}

}  // namespace kiln::ops
