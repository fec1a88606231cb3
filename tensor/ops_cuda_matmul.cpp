// CUDA front end, matmul family: stub until its kernels land (see
// tensor/ops_cuda.h).
#include "tensor/ops_cuda.h"

#if defined(KILN_CUDA)

namespace kiln::ops::cuda_ops {

void gemm(Tensor &c, const Tensor &a, const Tensor &b, bool trans_a,
          bool trans_b, double alpha, double beta) {
  fail("[gemm] the CUDA kernel is not written yet");
}
void matmul(const Tensor &a, const Tensor &b, bool trans_a, bool trans_b,
            Tensor &out) {
  fail("[matmul] the CUDA kernel is not written yet");
}
void linear(const Tensor &x, const Tensor &w, const Tensor &bias, Tensor &out) {
  fail("[linear] the CUDA kernel is not written yet");
}

} // namespace kiln::ops::cuda_ops

#endif // KILN_CUDA
