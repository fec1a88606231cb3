// CUDA front end, nn family: stub until its kernels land (see
// tensor/ops_cuda.h).
#include "tensor/ops_cuda.h"

#if defined(KILN_CUDA)

namespace kiln::ops::cuda_ops {

void softmax(const Tensor &x, bool log, Tensor &y) {
  fail("[softmax] the CUDA kernel is not written yet");
}
void softmax_backward(const Tensor &y, const Tensor &dy, bool log, Tensor &dx) {
  fail("[softmax_backward] the CUDA kernel is not written yet");
}
void embedding(const Tensor &ids, const Tensor &table, Tensor &out) {
  fail("[embedding] the CUDA kernel is not written yet");
}
void embedding_backward(Tensor &dtable, const Tensor &ids, const Tensor &dout) {
  fail("[embedding_backward] the CUDA kernel is not written yet");
}
void rmsnorm(const Tensor &x, const Tensor &w, double eps, Tensor &y,
             Tensor &rstd) {
  fail("[rmsnorm] the CUDA kernel is not written yet");
}
void rmsnorm_backward(const Tensor &x, const Tensor &w, const Tensor &rstd,
                      const Tensor &dy, Tensor &dx, Tensor *dw) {
  fail("[rmsnorm_backward] the CUDA kernel is not written yet");
}
void layernorm(const Tensor &x, const Tensor &w, const Tensor &b, double eps,
               Tensor &y, Tensor &mean, Tensor &rstd) {
  fail("[layernorm] the CUDA kernel is not written yet");
}
void layernorm_backward(const Tensor &x, const Tensor &w, const Tensor &mean,
                        const Tensor &rstd, const Tensor &dy, Tensor &dx,
                        Tensor *dw, Tensor *db) {
  fail("[layernorm_backward] the CUDA kernel is not written yet");
}
void rope_tables(std::int64_t max_pos, std::int64_t head_dim, double theta,
                 Tensor &cos, Tensor &sin) {
  fail("[rope_tables] the CUDA kernel is not written yet");
}
void rope(const Tensor &x, const Tensor &cos, const Tensor &sin,
          RopeStyle style, std::int64_t pos_offset, bool backward,
          Tensor &out) {
  fail("[rope] the CUDA kernel is not written yet");
}
void silu(const Tensor &x, Tensor &y) {
  fail("[silu] the CUDA kernel is not written yet");
}
void silu_backward(const Tensor &x, const Tensor &dy, Tensor &dx) {
  fail("[silu_backward] the CUDA kernel is not written yet");
}
void gelu(const Tensor &x, Tensor &y) {
  fail("[gelu] the CUDA kernel is not written yet");
}
void gelu_backward(const Tensor &x, const Tensor &dy, Tensor &dx) {
  fail("[gelu_backward] the CUDA kernel is not written yet");
}
void swiglu(const Tensor &gate, const Tensor &up, Tensor &out) {
  fail("[swiglu] the CUDA kernel is not written yet");
}
void swiglu_backward(const Tensor &gate, const Tensor &up, const Tensor &dout,
                     Tensor &dgate, Tensor &dup) {
  fail("[swiglu_backward] the CUDA kernel is not written yet");
}
void dropout(const Tensor &x, double p, std::uint64_t seed,
             std::uint64_t offset, Tensor &y, Tensor &mask) {
  fail("[dropout] the CUDA kernel is not written yet");
}
void dropout_backward(const Tensor &dy, const Tensor &mask, double p,
                      Tensor &dx) {
  fail("[dropout_backward] the CUDA kernel is not written yet");
}

} // namespace kiln::ops::cuda_ops

#endif // KILN_CUDA
