// The CPU backend implements every op in kernels/op_list.h. If an op is added
// to the list without a CPU kernel, remove it from here and the coverage test fails.
#include "kernels/op_list.h"

namespace kiln {

bool cpu_has_kernel(Op op) {
  switch (op) {
    case Op::Gemm: case Op::Copy: case Op::Fill: case Op::Binary: case Op::Unary:
    case Op::Reduce: case Op::Softmax: case Op::LogSoftmax: case Op::Embedding:
    case Op::RmsNorm: case Op::LayerNorm: case Op::Rope: case Op::Silu: case Op::Gelu:
    case Op::SwiGlu: case Op::Attention: case Op::CrossEntropy: case Op::Dropout:
    case Op::AdamW: case Op::Sgd: case Op::RandomNormal: case Op::RandomUniform:
      return true;
    case Op::Count:
      break;
  }
  return false;
}

#if !defined(KILN_CUDA)
// CPU-only build: no CUDA kernels at all.
bool cuda_has_kernel(Op) { return false; }
#endif

}  // namespace kiln
