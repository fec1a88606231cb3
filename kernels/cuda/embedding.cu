// Embedding gather and deterministic scatter-add (math and contract in embedding.h).
//
// Backward pipeline on `stream`, all in the caller's workspace:
//   1. positions[t] = t                                       (iota_kernel)
//   2. stable radix sort of (ids as u32, positions) by id     (cub::DeviceRadixSort::SortPairs,
//      all 32 bits, so an unchecked negative id sorts after every valid one and never splits
//      a valid id's run)
//   3. grid (n_tokens, column slices): block i works only if sorted position i starts a run of
//      equal ids; it finds the run's end, sums dout rows of the run in position order (f32),
//      and adds the sum into dtable[id] once.
// Runs of frequent tokens are summed serially by one block per column slice; the rows are
// loaded 4 at a time (independent loads in flight), then added in order.
#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/row_group.cuh"

namespace kiln::cuda {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// First bad token index (atomicMin), reset to ULLONG_MAX before each check.
__device__ unsigned long long g_first_bad_token;

// ids: (n); table: (vocab, dim); out: (n, dim). Block-stride over tokens, threads over columns.
template <typename T, int V>
__global__ void embedding_fwd_kernel(std::int64_t n, std::int64_t vocab, std::int64_t dim,
                                     const std::int32_t* ids, const T* table, T* out) {
  for (std::int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    const std::int32_t id = ids[t];
    const bool ok = id >= 0 && id < vocab;
    const T* src = table + static_cast<std::int64_t>(ok ? id : 0) * dim;
    T* dst = out + t * dim;
    for (std::int64_t c = static_cast<std::int64_t>(threadIdx.x) * V; c < dim;
         c += static_cast<std::int64_t>(blockDim.x) * V) {
      Pack<T, V> p;
      if (ok) {
        p = ldp<T, V>(src + c);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) p.v[e] = store<T>(0.f);
      }
      stp<T, V>(dst + c, p);
    }
  }
}

__global__ void reset_first_bad_kernel() { g_first_bad_token = ULLONG_MAX; }

__global__ void find_bad_kernel(std::int64_t n, std::int64_t vocab, const std::int32_t* ids) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
       t += stride) {
    const std::int32_t id = ids[t];
    if (id < 0 || id >= vocab) atomicMin(&g_first_bad_token, static_cast<unsigned long long>(t));
  }
}

__global__ void iota_kernel(std::int64_t n, std::int32_t* v) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    v[i] = static_cast<std::int32_t>(i);
}

// keys: (n) sorted ids (u32); pos: (n) their token positions; dout: (n, dim); dtable: (vocab, dim).
// Grid (n, column slices of blockDim.x * V).
template <typename G, typename O, int V>
__global__ void embedding_bwd_kernel(std::int64_t n, std::int64_t vocab, std::int64_t dim,
                                     const std::uint32_t* keys, const std::int32_t* pos,
                                     const O* dout, G* dtable) {
  const std::int64_t i = blockIdx.x;
  const std::uint32_t id = keys[i];
  if (i > 0 && keys[i - 1] == id) return;  // not the head of its run (uniform per block)
  if (id >= static_cast<std::uint64_t>(vocab)) return;  // an unchecked bad id: skip its run
  // Run end: the first j > i with keys[j] != id, searched blockDim.x keys at a time.
  __shared__ unsigned long long run_end;
  if (threadIdx.x == 0) run_end = static_cast<unsigned long long>(n);
  __syncthreads();
  for (std::int64_t base = i + 1; base < n; base += blockDim.x) {
    const std::int64_t j = base + threadIdx.x;
    const bool differs = j < n && keys[j] != id;
    if (differs) atomicMin(&run_end, static_cast<unsigned long long>(j));
    if (__syncthreads_or(differs)) break;  // uniform: every thread sees the same result
  }
  __syncthreads();
  const std::int64_t end = static_cast<std::int64_t>(run_end);
  const std::int64_t c = (static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (c >= dim) return;
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.f;
  std::int64_t j = i;
  for (; j + 4 <= end; j += 4) {  // four rows in flight, added in position order
    Pack<O, V> p[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      p[k] = ldp<O, V>(dout + static_cast<std::int64_t>(pos[j + k]) * dim + c);
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += load(p[k].v[e]);
  }
  for (; j < end; ++j) {
    const Pack<O, V> p = ldp<O, V>(dout + static_cast<std::int64_t>(pos[j]) * dim + c);
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] += load(p.v[e]);
  }
  G* dst = dtable + static_cast<std::int64_t>(id) * dim + c;
  Pack<G, V> d = ldp<G, V>(dst);
#pragma unroll
  for (int e = 0; e < V; ++e) d.v[e] = store<G>(load(d.v[e]) + acc[e]);
  stp<G, V>(dst, d);
}

std::size_t sort_temp_bytes(std::int64_t n) {
  std::size_t bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const std::uint32_t*>(nullptr),
      static_cast<std::uint32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), static_cast<int>(n), 0, 32, nullptr));
  return bytes;
}

void check_sizes(const char* op, std::int64_t n, std::int64_t vocab, std::int64_t dim) {
  KILN_CHECK(n >= 0 && vocab >= 0 && dim >= 0, "[{}] negative size (tokens {}, vocab {}, dim {})",
             op, n, vocab, dim);
  KILN_CHECK(n <= INT_MAX, "[{}] {} tokens exceed the kernel's int32 positions", op, n);
  KILN_CHECK(vocab <= static_cast<std::int64_t>(INT_MAX) + 1, "[{}] vocab {} exceeds i32 ids", op,
             vocab);
}

}  // namespace

template <typename T>
void embedding_forward(std::int64_t n_tokens, std::int64_t vocab, std::int64_t dim,
                       const std::int32_t* ids, const T* table, T* out, StreamHandle stream) {
  check_sizes("embedding", n_tokens, vocab, dim);
  if (n_tokens == 0 || dim == 0) return;
  constexpr int P = 16 / sizeof(T);
  const bool vec = dim % P == 0 && aligned16({table, out});
  const int threads = embedding_threads(dim, vec ? P : 1);
  const unsigned blocks = static_cast<unsigned>(n_tokens < 65535LL * 8 ? n_tokens : 65535LL * 8);
  if (vec)
    embedding_fwd_kernel<T, P>
        <<<blocks, threads, 0, stream>>>(n_tokens, vocab, dim, ids, table, out);
  else
    embedding_fwd_kernel<T, 1>
        <<<blocks, threads, 0, stream>>>(n_tokens, vocab, dim, ids, table, out);
  KILN_CUDA_CHECK_LAUNCH();
}

std::int64_t embedding_first_bad_token(std::int64_t n_tokens, std::int64_t vocab,
                                       const std::int32_t* ids, StreamHandle stream) {
  check_sizes("embedding", n_tokens, vocab, 0);
  if (n_tokens == 0) return -1;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return -1;
  reset_first_bad_kernel<<<1, 1, 0, stream>>>();
  KILN_CUDA_CHECK_LAUNCH();
  find_bad_kernel<<<grid_for(n_tokens, 256), 256, 0, stream>>>(n_tokens, vocab, ids);
  KILN_CUDA_CHECK_LAUNCH();
  unsigned long long first = 0;
  KILN_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&first, g_first_bad_token, sizeof(first), 0,
                                            cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return first == ULLONG_MAX ? -1 : static_cast<std::int64_t>(first);
}

std::size_t embedding_backward_workspace_bytes(std::int64_t n_tokens) {
  check_sizes("embedding_backward", n_tokens, 0, 0);
  if (n_tokens == 0) return 0;
  const std::size_t n4 = align_up(static_cast<std::size_t>(n_tokens) * 4);
  return 3 * n4 + align_up(sort_temp_bytes(n_tokens)) + kAlign;  // + kAlign: base alignment
}

template <typename G, typename O>
void embedding_backward(std::int64_t n_tokens, std::int64_t vocab, std::int64_t dim,
                        const std::int32_t* ids, const O* dout, G* dtable, void* workspace,
                        std::size_t workspace_bytes, StreamHandle stream) {
  check_sizes("embedding_backward", n_tokens, vocab, dim);
  if (n_tokens == 0 || dim == 0) return;
  const std::size_t need = embedding_backward_workspace_bytes(n_tokens);
  KILN_CHECK(workspace != nullptr && workspace_bytes >= need,
             "[embedding_backward] workspace of {} bytes, {} needed", workspace_bytes, need);
  // Carve the workspace: sorted keys, positions in, positions out, cub's temporary storage.
  auto base = (reinterpret_cast<std::uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign;
  const std::size_t n4 = align_up(static_cast<std::size_t>(n_tokens) * 4);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base);
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + n4);
  auto* pos_out = reinterpret_cast<std::int32_t*>(base + 2 * n4);
  void* temp = reinterpret_cast<void*>(base + 3 * n4);
  std::size_t temp_bytes = sort_temp_bytes(n_tokens);

  iota_kernel<<<grid_for(n_tokens, 256), 256, 0, stream>>>(n_tokens, pos_in);
  KILN_CUDA_CHECK_LAUNCH();
  KILN_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, reinterpret_cast<const std::uint32_t*>(ids),
                                      keys_out, static_cast<const std::int32_t*>(pos_in), pos_out,
                                      static_cast<int>(n_tokens), 0, 32, stream));

  constexpr int P = 16 / (sizeof(G) > sizeof(O) ? sizeof(G) : sizeof(O));
  const bool vec = dim % P == 0 && aligned16({dout, dtable});
  const int v = vec ? P : 1;
  const int threads = embedding_threads(dim, v);
  const std::int64_t slices = ceil_div(dim, static_cast<std::int64_t>(threads) * v);
  KILN_CHECK(slices <= 65535, "[embedding_backward] dim {} too large", dim);
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(slices));
  if (vec)
    embedding_bwd_kernel<G, O, P>
        <<<grid, threads, 0, stream>>>(n_tokens, vocab, dim, keys_out, pos_out, dout, dtable);
  else
    embedding_bwd_kernel<G, O, 1>
        <<<grid, threads, 0, stream>>>(n_tokens, vocab, dim, keys_out, pos_out, dout, dtable);
  KILN_CUDA_CHECK_LAUNCH();
}

template void embedding_forward<float>(std::int64_t, std::int64_t, std::int64_t,
                                       const std::int32_t*, const float*, float*, StreamHandle);
template void embedding_forward<bf16>(std::int64_t, std::int64_t, std::int64_t, const std::int32_t*,
                                      const bf16*, bf16*, StreamHandle);
template void embedding_forward<f16>(std::int64_t, std::int64_t, std::int64_t, const std::int32_t*,
                                     const f16*, f16*, StreamHandle);

#define KILN_INSTANTIATE_BWD(G, O)                                                              \
  template void embedding_backward<G, O>(std::int64_t, std::int64_t, std::int64_t,              \
                                         const std::int32_t*, const O*, G*, void*, std::size_t, \
                                         StreamHandle);
KILN_INSTANTIATE_BWD(float, float)
KILN_INSTANTIATE_BWD(float, bf16)
KILN_INSTANTIATE_BWD(float, f16)
KILN_INSTANTIATE_BWD(bf16, float)
KILN_INSTANTIATE_BWD(bf16, bf16)
KILN_INSTANTIATE_BWD(bf16, f16)
KILN_INSTANTIATE_BWD(f16, float)
KILN_INSTANTIATE_BWD(f16, bf16)
KILN_INSTANTIATE_BWD(f16, f16)
#undef KILN_INSTANTIATE_BWD

}  // namespace kiln::cuda
