// CUDA front end, loss family: stub until its kernels land (see
// tensor/ops_cuda.h).
#include "tensor/ops_cuda.h"

#if defined(KILN_CUDA)

namespace kiln::ops::cuda_ops {

void cross_entropy(const Tensor &logits, const Tensor &targets,
                   std::int32_t ignore_index, Tensor &loss, Tensor &lse) {
  fail("[cross_entropy] the CUDA kernel is not written yet");
}
void cross_entropy_backward(const Tensor &logits, const Tensor &lse,
                            const Tensor &targets, const Tensor &dloss,
                            std::int32_t ignore_index, Tensor &dlogits) {
  fail("[cross_entropy_backward] the CUDA kernel is not written yet");
}
void adamw_step(Tensor &param, const Tensor &grad, Tensor &m, Tensor &v,
                double lr, double beta1, double beta2, double eps,
                double weight_decay, std::int64_t step) {
  fail("[adamw_step] the CUDA kernel is not written yet");
}
void sgd_step(Tensor &param, const Tensor &grad, Tensor &momentum_buf,
              double lr, double momentum, double dampening, double weight_decay,
              bool nesterov, std::int64_t step) {
  fail("[sgd_step] the CUDA kernel is not written yet");
}
void adamw_multi_step(std::span<AdamWTensors> items, double lr, double beta1,
                      double beta2, double eps, std::int64_t step) {
  fail("[adamw_multi_step] the CUDA kernel is not written yet");
}

} // namespace kiln::ops::cuda_ops

#endif // KILN_CUDA
