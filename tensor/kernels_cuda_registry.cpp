// The CUDA backend's registrations: one call per family file (tensor/kernels_cuda_*.cpp), each of
// which registers its typed entries beside their bodies (tensor/kernels_cuda_glue.h). Compiled in
// every build: without CUDA the entries are capabilities only (runnable = false), so a dry run
// can still simulate a CUDA run (--simulate cuda). Families whose arguments name their own
// registrations (op_args.h: FooArgs::register_cuda, e.g. dequantize) need no line here.
#include "tensor/kernel_table.h"
#include "tensor/ops.h"

namespace kiln::ops {
namespace cuda_glue {
void register_basic();   // kernels_cuda_basic.cpp
void register_matmul();  // kernels_cuda_matmul.cpp
void register_nn();      // kernels_cuda_nn.cpp
void register_loss();    // kernels_cuda_loss.cpp
}  // namespace cuda_glue

void register_cuda_kernels() {
  cuda_glue::register_basic();
  cuda_glue::register_matmul();
  cuda_glue::register_nn();
  cuda_glue::register_loss();
  cuda_glue::register_cuda_attention(attention_impl());  // kernels_cuda_attention.cpp
}

}  // namespace kiln::ops
