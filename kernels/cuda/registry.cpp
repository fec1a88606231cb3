// CUDA kernels arrive with the CUDA backend issue. Until then the CUDA build
// wires the toolchain and libraries, and this table says honestly that no op
// has a CUDA kernel yet.
#include "kernels/op_list.h"

namespace kiln {

bool cuda_has_kernel(Op) { return false; }

}  // namespace kiln
