// GEMM on OpenBLAS (row-major).
//   gemm:         C = alpha * op(A) @ op(B) + beta * C        (= when beta == 0, else += scaled)
//   gemm_batched: the same for batch matrices at A + b*stride_a, B + b*stride_b, C + b*stride_c.
// op(X) is X or X^T. op(A): (M, K), op(B): (K, N), C: (M, N). lda/ldb/ldc are row strides of the
// stored (untransposed) matrices: A is stored (M, K) with lda >= K, or (K, M) with lda >= M when
// trans_a. When beta == 0, C is not read (NaNs in it do not leak).
//
// Threading: the installed OpenBLAS is the pthread build (libopenblas0-pthread 0.3.21), which has
// its own thread pool and does not know about OpenMP. OpenBLAS already runs a GEMM on one thread
// when M*N*K <= 65536 * GEMM_MULTITHREAD_THRESHOLD (= 262144). gemm_batched therefore
// parallelizes over the batch with OpenMP only for such small matrices (each BLAS call is then
// single-threaded: no oversubscription), and runs larger matrices one after another, each using
// the OpenBLAS pool. Calling gemm from inside an OpenMP parallel region is safe (OpenBLAS 0.3.21
// serializes concurrent use of its pool), but only small matrices run concurrently there.
#pragma once

#include <cstdint>

namespace kiln::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// stride_a / stride_b may be 0 to use one matrix for every batch entry; stride_c must be nonzero
// when batch > 1 (each output is written once).
template <typename T>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
                  const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb,
                  int64_t stride_b, T beta, T* C, int64_t ldc, int64_t stride_c, int64_t batch);

}  // namespace kiln::cpu
