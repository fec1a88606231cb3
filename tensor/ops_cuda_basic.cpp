// CUDA front end, basic family: stub until its kernels land (see
// tensor/ops_cuda.h).
#include "tensor/ops_cuda.h"

#if defined(KILN_CUDA)

namespace kiln::ops::cuda_ops {

void copy(Tensor &dst, const Tensor &src) {
  fail("[copy] the CUDA kernel is not written yet");
}
void fill(Tensor &t, double value) {
  fail("[fill] the CUDA kernel is not written yet");
}
void random(bool normal, Tensor &t, double a, double b, std::uint64_t seed,
            std::uint64_t offset) {
  fail("[random] the CUDA kernel is not written yet");
}
void binary(Binary op, const Tensor &a, const Tensor &b, Tensor &out) {
  fail("[binary] the CUDA kernel is not written yet");
}
void unary(Unary op, const Tensor &x, Tensor &out) {
  fail("[unary] the CUDA kernel is not written yet");
}
void affine(const Tensor &x, double alpha, double beta, Tensor &out) {
  fail("[affine] the CUDA kernel is not written yet");
}
void axpy(Tensor &y, double alpha, const Tensor &x) {
  fail("[axpy] the CUDA kernel is not written yet");
}
void scale(Tensor &y, double alpha) {
  fail("[scale] the CUDA kernel is not written yet");
}
void reduce(Reduce op, const Tensor &x, std::int64_t outer, std::int64_t n,
            std::int64_t inner, Tensor &out) {
  fail("[reduce] the CUDA kernel is not written yet");
}
void argmax(const Tensor &x, std::int64_t outer, std::int64_t n,
            std::int64_t inner, Tensor &out) {
  fail("[argmax] the CUDA kernel is not written yet");
}
void sum_all(const Tensor &x, Tensor &out) {
  fail("[sum_all] the CUDA kernel is not written yet");
}
void sum_squares(const Tensor &x, double *result) {
  fail("[sum_squares] the CUDA kernel is not written yet");
}

} // namespace kiln::ops::cuda_ops

#endif // KILN_CUDA
