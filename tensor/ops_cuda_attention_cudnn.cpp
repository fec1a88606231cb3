// CUDA front end, attention_cudnn family: stub until its kernels land (see
// tensor/ops_cuda.h).
#include "tensor/ops_cuda.h"

#if defined(KILN_CUDA)

namespace kiln::ops::cuda_ops {

void attention_cudnn(const Tensor &q, const Tensor &k, const Tensor &v,
                     double scale, std::int64_t q_offset, Tensor &out,
                     Tensor &lse) {
  fail("[attention_cudnn] the CUDA kernel is not written yet");
}
void attention_backward_cudnn(const Tensor &q, const Tensor &k, const Tensor &v,
                              const Tensor &out, const Tensor &lse,
                              const Tensor &dout, double scale, Tensor &dq,
                              Tensor &dk, Tensor &dv) {
  fail("[attention_backward_cudnn] the CUDA kernel is not written yet");
}

} // namespace kiln::ops::cuda_ops

#endif // KILN_CUDA
