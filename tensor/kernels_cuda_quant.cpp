// CUDA glue, quant family: ops::dequantize's entries (kernels/cuda/quant.h) and
// ops::linear_quant's, registered beside them. The front end has checked the block counts and
// allocated out; the dispatcher has made the blocks contiguous on out's device.
//
// linear_quant: up to kQuantGemvMaxRows rows of x (decode, small serving batches) run the
// quantized GEMV on the blocks in place (cuda::gemv_quant: no scratch, each row's result
// independent of the others); more rows dequantize W into a scratch weight of T and run the
// table's CUDA Linear entry (cuBLASLt). The scratch is declared below so the dry run charges it.
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

template <class T>
struct LinearQuantCuda {
  static void run(LinearQuantArgs& a);
};

#if defined(KILN_CUDA)
template <class T>
void LinearQuantCuda<T>::run(LinearQuantArgs& a) {
  const std::int64_t n = a.out.size(-1), k = a.x.size(-1), rows = a.out.numel() / n;
  if (rows <= cuda::kQuantGemvMaxRows) {  // x and out are dense (the dispatcher's default)
    cuda::gemv_quant<T>(a.type, rows, n, k, a.x.data<T>(), k, a.blocks.data<std::uint8_t>(),
                        a.bias.defined() ? a.bias.data<T>() : nullptr, a.out.data<T>(), n, nullptr);
    return;
  }
  Tensor w;
  {
    MemoryScope scratch(MemCategory::Temporaries);
    w = Tensor::empty({n, k}, dtype_of<T>(), a.out.device());
  }
  cuda::dequantize<T>(a.type, n * k, a.blocks.data<std::uint8_t>(), w.data<T>(), nullptr);
  const Kernel<LinearArgs>* linear = find_kernel<LinearArgs>(DeviceType::CUDA, dtype_of<T>());
  KILN_CHECK(linear != nullptr, "[linear_quant] no CUDA linear entry for {}",
             dtype_name(dtype_of<T>()));
  LinearArgs la{a.x, w, a.bias, a.out};
  linear->run(la);
}
#endif

ScratchList linear_quant_scratch(const LinearQuantArgs& a, DType d) {
  const std::int64_t n = a.out.size(-1);
  if (n == 0 || a.out.numel() / n <= cuda::kQuantGemvMaxRows) return {};  // the GEMV
  return {n * a.x.size(-1) * static_cast<std::int64_t>(dtype_size(d))};
}

}  // namespace
}  // namespace cuda_glue

void DequantizeArgs::register_cuda() {
  cuda_glue::register_cuda<DequantizeArgs, cuda_glue::DequantizeCuda, float, bf16, f16>();
}

void LinearQuantArgs::register_cuda() {
  cuda_glue::register_cuda<LinearQuantArgs, cuda_glue::LinearQuantCuda, float, bf16, f16>(
      {.scratch = &cuda_glue::linear_quant_scratch});
}

}  // namespace kiln::ops
