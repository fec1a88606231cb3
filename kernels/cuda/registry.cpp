// Which ops have CUDA kernels (kernels/cuda/<family>.cu, reached through
// tensor/ops_cuda_*.cpp). tests/kernels/test_coverage.cpp fails in a CUDA build
// if any op of kernels/op_list.h is missing here;
// tests/tensor/test_backend_ops.cpp runs each of them against the CPU on a GPU.
#include "kernels/op_list.h"

namespace kiln {

bool cuda_has_kernel(Op op) {
  switch (op) {
    case Op::Gemm:           // matmul.cpp (cuBLASLt)
    case Op::Copy:           // copy.cu
    case Op::Fill:           // copy.cu
    case Op::Binary:         // elementwise.cu
    case Op::Unary:          // elementwise.cu
    case Op::Reduce:         // reduce.cu
    case Op::Softmax:        // softmax.cu
    case Op::LogSoftmax:     // softmax.cu
    case Op::Embedding:      // embedding.cu
    case Op::RmsNorm:        // norm.cu
    case Op::LayerNorm:      // norm.cu
    case Op::Rope:           // rope.cu
    case Op::Silu:           // activation.cu
    case Op::Gelu:           // activation.cu
    case Op::SwiGlu:         // activation.cu
    case Op::Attention:      // attention_fwd.cu, attention_bwd.cu (+
                             // attention_cudnn.cpp)
    case Op::CrossEntropy:   // cross_entropy.cu
    case Op::Dropout:        // dropout.cu
    case Op::AdamW:          // optimizer.cu
    case Op::Sgd:            // optimizer.cu
    case Op::RandomNormal:   // random.cu
    case Op::RandomUniform:  // random.cu
      return true;
    case Op::Count:
      break;
  }
  return false;
}

}  // namespace kiln
