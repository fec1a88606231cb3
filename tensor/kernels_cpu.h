// Helpers for the CPU kernels' registrations (tensor/kernels_cpu_*.cpp); not a public header.
#pragma once

#include "tensor/dispatch.h"
#include "tensor/kernel_table.h"
#include "tensor/ops_util.h"

namespace kiln::ops::cpu_glue {

// Registers a kernel templated on its compute type for f32 and f64: the CPU computes bf16 and
// f16 through the f32 kernel (the dispatcher converts) until a native kernel is registered.
template <class A, template <class> class K>
void register_float(Kernel<A> k = {}) {
  k.run = &K<float>::run;
  register_kernel<A>(DeviceType::CPU, DType::F32, k);
  k.run = &K<double>::run;
  register_kernel<A>(DeviceType::CPU, DType::F64, k);
}

// Registers the bf16 instance of a kernel templated on its storage type (computing in f32).
template <class A, template <class> class K>
void register_bf16(Kernel<A> k = {}) {
  k.run = &K<bf16>::run;
  register_kernel<A>(DeviceType::CPU, DType::BF16, k);
}

// Registers a kernel templated on its storage type for f32, f64, bf16 and f16: the 16-bit types
// are read and written as stored and computed in f32 registers (kernels/cpu/bf16_util.h), so
// the dispatcher converts nothing.
template <class A, template <class> class K>
void register_float_storage(Kernel<A> k = {}) {
  register_float<A, K>(k);
  register_bf16<A, K>(k);
  k.run = &K<f16>::run;
  register_kernel<A>(DeviceType::CPU, DType::F16, k);
}

// Registers a kernel templated on its element type for every dtype.
template <class A, template <class> class K>
void register_all_dtypes(Kernel<A> k = {}) {
  for (DType d :
       {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::Bool})
    dispatch_dtype(d, [&](auto tag) {
      using T = typename decltype(tag)::type;
      k.run = &K<T>::run;
      register_kernel<A>(DeviceType::CPU, d, k);
    });
}

using ops::rows_of;

// Each family's registrations (kernels_cpu_basic.cpp, kernels_cpu_nn.cpp), and the native bf16
// matmul kernels (kernels_cpu_matmul_bf16.cpp).
void register_basic();
void register_nn();
void register_matmul_bf16();
// The scratch bytes the CPU bf16 Linear kernel takes for dense x (rows, k), w (n, k) and out
// (rows, n) (0 on its GEMV path): for kernels that call that kernel inside their own run and
// declare its scratch with theirs (linear_quant's prefill slices).
std::int64_t linear_bf16_dense_scratch_bytes(std::int64_t rows, std::int64_t n, std::int64_t k,
                                             bool has_bias);

}  // namespace kiln::ops::cpu_glue
