// GEMM through cblas_sgemm / cblas_dgemm, and f32 products through oneDNN where matmul.h's rule
// says so. See matmul.h for the threading choice and the rule.
#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <type_traits>

#include "kernels/common/env_choice.h"
#include "kernels/common/error.h"
#include "kernels/cpu/matmul_dnnl.h"

namespace kiln::cpu {
namespace {

// The rule's bounds (matmul.h; the measurements are in docs/cpu_gemm.md).
constexpr int64_t kOnednnMinRows = 16;  // at 16 rows the two ran alike; below, OpenBLAS
constexpr int64_t kOnednnMaxK = 4096;   // K = 32000 (an LM head's input gradient) ran slower

// -1: no override (KILN_F32_GEMM decides, else the rule); else an F32GemmLibrary.
std::atomic<int> g_library_override{-1};

// The choices in F32GemmLibrary's order, so an index is the enum's value.
int env_library() {
  static const int lib = env_choice("KILN_F32_GEMM", {"openblas", "onednn"}, "gemm");
  return lib;
}

// Whether this top-level f32 product goes to oneDNN (matmul.h).
bool f32_on_onednn(bool ta, int64_t M, int64_t K) {
  if (omp_in_parallel()) return false;  // a caller's thread: its own single-threaded product
  int lib = g_library_override.load(std::memory_order_relaxed);
  if (lib < 0) lib = env_library();
  if (lib >= 0) return lib == static_cast<int>(F32GemmLibrary::Onednn);
  return f32_gemm_library(cpu_isa(), ta, M, K) == F32GemmLibrary::Onednn;
}

// OpenBLAS runs one thread at or below this M*N*K (interface/gemm.c: SMP_THRESHOLD_MIN * 4).
constexpr double kBlasSingleThreadMnk = 65536.0 * 4.0;

void check_args(const char* op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                int64_t ldb, int64_t ldc) {
  KILN_CHECK(M >= 0 && N >= 0 && K >= 0, "[{}] negative size M={} N={} K={}", op, M, N, K);
  KILN_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             "[{}] size exceeds BLAS int range (M={} N={} K={} lda={} ldb={} ldc={})", op, M, N, K,
             lda, ldb, ldc);
  const int64_t a_cols = ta ? M : K, b_cols = tb ? K : N;
  // K == 0: A and B are empty and never read (blas_gemm only scales C), whatever their strides
  // (an empty (5, 0) tensor's leading stride may be 0 or 1).
  if (K > 0) {
    KILN_CHECK(lda >= std::max<int64_t>(1, a_cols), "[{}] lda {} < {}", op, lda, a_cols);
    KILN_CHECK(ldb >= std::max<int64_t>(1, b_cols), "[{}] ldb {} < {}", op, ldb, b_cols);
  }
  KILN_CHECK(ldc >= std::max<int64_t>(1, N), "[{}] ldc {} < {}", op, ldc, N);
}

// route: an f32 product may go to oneDNN (f32_on_onednn); false: OpenBLAS only.
template <typename T, bool route = true>
inline void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                      int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  if (K == 0 || alpha == T(0)) {
    // BLAS would also handle this, but do it here so beta == 0 overwrites NaNs in C too.
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  if (M == 1) {
    // One row (decode): a matrix-vector product. sgemm would spend most of its time packing B
    // (~3x slower at the 151936 x 1024 LM head). y (N) = op(B)^T-ish · x, x = A's one row.
    if (beta == T(0))
      for (int64_t j = 0; j < N; ++j) C[j] = T(0);  // gemv scales y by beta: clear NaNs first
    const int64_t incx = ta ? lda : 1;
    // B stored (K, N) when !tb: y = B^T x; stored (N, K) when tb: y = B x.
    const auto op = tb ? CblasNoTrans : CblasTrans;
    const int rows = int(tb ? N : K), cols = int(tb ? K : N);
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemv(CblasRowMajor, op, rows, cols, alpha, B, int(ldb), A, int(incx), beta, C, 1);
    else
      cblas_dgemv(CblasRowMajor, op, rows, cols, alpha, B, int(ldb), A, int(incx), beta, C, 1);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (route && f32_on_onednn(ta, M, K) &&
        try_onednn_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
      return;
    cblas_sgemm(CblasRowMajor, opa, opb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb),
                beta, C, int(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, opa, opb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb),
                beta, C, int(ldc));
  }
}

}  // namespace

F32GemmLibrary f32_gemm_library(CpuIsa level, bool trans_a, int64_t M, int64_t K) {
  const bool onednn = level == CpuIsa::Avx2 && !trans_a && M >= kOnednnMinRows && K <= kOnednnMaxK;
  return onednn ? F32GemmLibrary::Onednn : F32GemmLibrary::OpenBlas;
}

void set_f32_gemm_library_override(const F32GemmLibrary* library) {
  g_library_override.store(library ? static_cast<int>(*library) : -1, std::memory_order_relaxed);
}

void sgemm_openblas(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) {
  check_args("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  blas_gemm<float, false>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  check_args("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  blas_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta,
                  T* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  check_args("gemm_batched", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  KILN_CHECK(batch >= 0, "[gemm_batched] negative batch {}", batch);
  KILN_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0,
             "[gemm_batched] negative stride a={} b={} c={}", stride_a, stride_b, stride_c);
  KILN_CHECK(batch <= 1 || stride_c != 0,
             "[gemm_batched] stride_c 0 with batch {} would write one C many times", batch);
  if (M == 0 || N == 0 || batch == 0) return;
  const double mnk = double(M) * double(N) * double(K);
  // Small matrices: one BLAS thread each, OpenMP over the batch. Skip the OpenMP team when the
  // whole batch is tiny or we are already inside a parallel region.
  const bool par = batch > 1 && mnk <= kBlasSingleThreadMnk && mnk * double(batch) >= 32768.0 &&
                   !omp_in_parallel();
  if (!par) {
    // Not `omp parallel if (false)`: that still opens a (one-thread) region, so OpenBLAS's own
    // parallel region inside becomes a nested team, and libgomp starts a fresh OS thread for
    // each nested team (one thread create + exit per GEMM, ~44 per stories15M train step).
    for (int64_t b = 0; b < batch; ++b)
      blas_gemm(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb,
                beta, C + b * stride_c, ldc);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    blas_gemm(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta,
              C + b * stride_c, ldc);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);
template void gemm_batched<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                  int64_t, int64_t, const float*, int64_t, int64_t, float, float*,
                                  int64_t, int64_t, int64_t);
template void gemm_batched<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                   int64_t, int64_t, const double*, int64_t, int64_t, double,
                                   double*, int64_t, int64_t, int64_t);

}  // namespace kiln::cpu
