// CUDA front end, attention family: stub until its kernels land (see
// tensor/ops_cuda.h).
#include "tensor/ops_cuda.h"

#if defined(KILN_CUDA)

namespace kiln::ops::cuda_ops {

void attention(const Tensor &q, const Tensor &k, const Tensor &v, double scale,
               std::int64_t q_offset, Tensor &out, Tensor &lse) {
  fail("[attention] the CUDA kernel is not written yet");
}
void attention_backward(const Tensor &q, const Tensor &k, const Tensor &v,
                        const Tensor &out, const Tensor &lse,
                        const Tensor &dout, double scale, Tensor &dq,
                        Tensor &dk, Tensor &dv) {
  fail("[attention_backward] the CUDA kernel is not written yet");
}

} // namespace kiln::ops::cuda_ops

#endif // KILN_CUDA
