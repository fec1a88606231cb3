// CUDA glue, quant family: ops::dequantize's entries (kernels/cuda/quant.h), registered beside
// them. The front end has checked the block count and allocated out; the dispatcher has made the
// blocks contiguous on out's device.
#include "kernels/cuda/quant.h"
#include "tensor/kernels_cuda_glue.h"
#include "tensor/op_args.h"

namespace kiln::ops {
namespace cuda_glue {
namespace {

template <class T>
struct DequantizeCuda {
  static void run(DequantizeArgs& a);
};

#if defined(KILN_CUDA)
template <class T>
void DequantizeCuda<T>::run(DequantizeArgs& a) {
  cuda::dequantize<T>(a.type, a.out.numel(), a.blocks.data<std::uint8_t>(), a.out.data<T>(),
                      nullptr);
}
#endif

}  // namespace
}  // namespace cuda_glue

void DequantizeArgs::register_cuda() {
  cuda_glue::register_cuda<DequantizeArgs, cuda_glue::DequantizeCuda, float, bf16, f16>();
}

}  // namespace kiln::ops
