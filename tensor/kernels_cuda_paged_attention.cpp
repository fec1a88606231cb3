// CUDA glue, paged attention (serving): ops::paged_attention's entry,
// kernels/cuda/paged_attention.h. The front end has checked shapes, dtypes and every block-table
// entry a row reads, and copied the index tensors to the device; the dispatcher has made the inputs
// dense in T.
#include "kernels/cuda/paged_attention.h"
#include "tensor/kernels_cuda_glue.h"
#include "tensor/op_args.h"

namespace kiln::ops {
namespace cuda_glue {
namespace {

template <class T>
struct PagedAttentionCuda {
  static void run(PagedAttentionArgs& a);
};

#if defined(KILN_CUDA)
template <class T>
void PagedAttentionCuda<T>::run(PagedAttentionArgs& a) {
  cuda::paged_attention_forward<T>(
      a.q.size(0), a.q.size(1), a.k_pool.size(2), a.q.size(2), a.k_pool.size(1),
      a.block_tables.size(1), a.scale, a.q.data<T>(), a.k_pool.data<T>(), a.v_pool.data<T>(),
      a.block_tables.data<std::int32_t>(), a.token_seq.data<std::int32_t>(),
      a.token_pos.data<std::int32_t>(), a.out.data<T>(), nullptr);
}
#endif

}  // namespace
}  // namespace cuda_glue

void PagedAttentionArgs::register_cuda() {
  cuda_glue::register_cuda<PagedAttentionArgs, cuda_glue::PagedAttentionCuda, float, bf16>();
}

}  // namespace kiln::ops
