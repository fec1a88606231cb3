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
//
// Library: gemm<float> and gemm_batched<float> hand a product to oneDNN's f32 matmul (gemm:jit,
// kernels/cpu/matmul_dnnl.h) or to OpenBLAS by f32_gemm_library. The rule follows measurements
// (docs/cpu_gemm.md), not a guess: on an AVX2-only EPYC (2 threads) oneDNN ran the op(A) = A
// products of the training shapes 1.01-1.48x as fast as OpenBLAS (it makes no separate pass
// over C for beta, as OpenBLAS's sgemm_beta does), while OpenBLAS ran the weight gradients' A^T
// products (K = the batch's rows) 1.02-1.25x and a K = 32000 product 1.13x as fast as oneDNN.
// So oneDNN takes op(A) = A with M >= 16 and K <= 4096 at the Avx2 level. Everything else stays
// on OpenBLAS: the other levels (not measured yet), every call from inside an OpenMP parallel
// region (the attention's per-block products, each on one thread), and double. oneDNN needs no
// scratchpad for these f32 products (checked per call: one that would runs on OpenBLAS), and,
// like OpenBLAS, packs into buffers of its own.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace kiln::cpu {

enum class F32GemmLibrary : std::uint8_t { OpenBlas, Onednn };

// The library the rule above picks at `level` for a top-level (not nested) call with M > 1,
// K > 0 and alpha != 0 (the cases gemm hands to any library at all). N does not enter: every N
// measured agreed.
F32GemmLibrary f32_gemm_library(CpuIsa level, bool trans_a, int64_t M, int64_t K);

// Tests and benchmarks: every top-level f32 product on one library (null: the rule). Also set
// once from KILN_F32_GEMM=openblas|onednn (auto or unset: the rule), for whole-step comparisons.
// Not thread-safe against running GEMMs.
void set_f32_gemm_library_override(const F32GemmLibrary* library);

// OpenBLAS whatever the rule says: the widening bf16 path's f32 blocks (measured on it).
void sgemm_openblas(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc);

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
