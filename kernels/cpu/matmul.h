// GEMM on OpenBLAS (row-major).
//   gemm:         C = alpha * op(A) @ op(B) + beta * C        (= when beta == 0, else += scaled)
//   gemm_batched: the same for batch matrices at A + b*stride_a, B + b*stride_b, C + b*stride_c.
// op(X) is X or X^T. op(A): (M, K), op(B): (K, N), C: (M, N). lda/ldb/ldc are row strides of the
// stored (untransposed) matrices: A is stored (M, K) with lda >= K, or (K, M) with lda >= M when
// trans_a. When beta == 0, C is not read (NaNs in it do not leak).
//
// Threading: CMake links Debian's OpenMP build of OpenBLAS (0.3.21) when it is installed, else
// the pthread build. Either way OpenBLAS runs a GEMM on one thread when
// M*N*K <= 65536 * GEMM_MULTITHREAD_THRESHOLD (= 262144), so gemm_batched parallelizes over the
// batch with OpenMP only for such small matrices (each BLAS call then single-threaded: no
// oversubscription) and runs larger ones one after another, each using BLAS's own threads.
// Calling gemm from inside an OpenMP parallel region is safe with both builds: the OpenMP build
// sees omp_in_parallel() and stays on the calling thread; the pthread build serializes
// concurrent use of its pool (correct, but it can oversubscribe cores for large matrices).
#pragma once

#include <cstdint>

namespace kiln::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// stride_a / stride_b may be 0 to use one matrix for every batch entry; stride_c must be nonzero
// when batch > 1 (each output is written once).
template <typename T>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta,
                  T* C, int64_t ldc, int64_t stride_c, int64_t batch);

}  // namespace kiln::cpu
