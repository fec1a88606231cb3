// Helpers for the CUDA glue's family files (tensor/kernels_cuda_*.cpp); not a public header.
//
// A family file holds, per kernel, `template <class T> struct FooCuda { static void run(FooArgs&);
// }` (T: the storage type, float, bf16 or f16) and registers it beside it with
// register_cuda<FooArgs, FooCuda, float, bf16, f16>(entry). The struct is declared in every
// build and defined only with CUDA: without CUDA the registration still records the entry's
// dtypes, layout and scratch (runnable = false), so the meta device can simulate a CUDA run
// (--simulate cuda), and a real call fails with no_cuda.
//
// Shapes, dtypes and devices are the front end's and the dispatcher's business
// (tensor/ops_*.cpp, tensor/kernel_table.h): a run() receives tensors of its T with the layout
// its entry declares, all on one CUDA device, and checks only what its kernels add.
#pragma once

#include <initializer_list>

#include "kernels/cuda/runtime.h"
#include "tensor/dispatch.h"
#include "tensor/kernel_table.h"

namespace kiln::ops::cuda_glue {

#if defined(KILN_CUDA)
inline constexpr bool kCudaBuilt = true;
#else
inline constexpr bool kCudaBuilt = false;
#endif
static_assert(kCudaBuilt == cuda::compiled_with_cuda());

// The run() of an entry K in a build without CUDA (never called: the entry is not runnable).
// One per K, so that two implementations of one op stay distinct entries.
template <class A, template <class> class K>
void not_built(A&) {
  fail("[cuda] {}: kiln was built without CUDA (configure with -DKILN_CUDA=ON)", A::kName);
}

// Registers K<T>::run for the dtype of each T in Ts on CUDA.
template <class A, template <class> class K, class... Ts>
void register_cuda(Kernel<A> k = {}) {
  k.runnable = kCudaBuilt;
  (
      [&] {
        if constexpr (kCudaBuilt)
          k.run = &K<Ts>::run;
        else
          k.run = &not_built<A, K>;
        register_kernel<A>(DeviceType::CUDA, dtype_of<Ts>(), k);
      }(),
      ...);
}

}  // namespace kiln::ops::cuda_glue
