// Tests for kernels/cpu/matmul.h against a float64 reference, all transpose combinations, with
// the f32 products on each library (OpenBLAS and oneDNN) as well as by the rule.
#include <gtest/gtest.h>
#include <omp.h>

#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_dnnl.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

KILN_OP_TESTED(Op::Gemm);

// Reference: C = alpha * op(A) op(B) + beta * C0 with A, B stored with leading dims lda, ldb.
std::vector<double> ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                             const std::vector<double>& A, int64_t lda,
                             const std::vector<double>& B, int64_t ldb, double beta,
                             const std::vector<double>& C0, int64_t ldc) {
  std::vector<double> C = C0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
      }
      C[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * C0[i * ldc + j]);
    }
  return C;
}

template <typename T>
void check_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, T beta, int pad,
                uint64_t seed) {
  const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  const int64_t arows = ta ? K : M, brows = tb ? N : K;
  auto A = test::random_uniform_vec<T>(arows * lda, seed);
  auto B = test::random_uniform_vec<T>(brows * ldb, seed + 1);
  auto C = test::random_uniform_vec<T>(M * ldc, seed + 2);
  const auto ref = ref_gemm(ta, tb, M, N, K, alpha, test::to_f64(A), lda, test::to_f64(B), ldb,
                            beta, test::to_f64(C), ldc);
  cpu::gemm<T>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  const double tol = (std::is_same_v<T, float> ? 2e-6 : 1e-13) * double(K + 1);
  EXPECT_TRUE(test::all_close(C, ref, tol, tol))
      << "ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K;
}

// Holds every top-level f32 product on one library for the scope (null: matmul.h's rule).
class ScopedF32Library {
 public:
  explicit ScopedF32Library(const cpu::F32GemmLibrary* lib) {
    cpu::set_f32_gemm_library_override(lib);
  }
  ~ScopedF32Library() { cpu::set_f32_gemm_library_override(nullptr); }
};

constexpr cpu::F32GemmLibrary kOpenBlas = cpu::F32GemmLibrary::OpenBlas;
constexpr cpu::F32GemmLibrary kOnednn = cpu::F32GemmLibrary::Onednn;
// The f32 tests run three times: by the rule, all on OpenBLAS, all on oneDNN (both libraries
// take every transpose, alpha, beta and leading dimension).
const std::vector<const cpu::F32GemmLibrary*> kLibraries = {nullptr, &kOpenBlas, &kOnednn};
std::string library_name(const cpu::F32GemmLibrary* lib) {
  return lib == nullptr ? "by the rule" : *lib == kOnednn ? "oneDNN" : "OpenBLAS";
}

// Runs body(lib) once per entry of kLibraries, with that library held and named in failures.
template <class Body>
void on_each_library(Body&& body) {
  for (const cpu::F32GemmLibrary* lib : kLibraries) {
    SCOPED_TRACE(library_name(lib));
    ScopedF32Library scoped(lib);
    body(lib);
  }
}

TEST(Gemm, AllTransposesOddSizes) {
  on_each_library([&](const cpu::F32GemmLibrary*) {
    uint64_t seed = 1;
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int64_t M : {1, 7, 16, 33})
          for (int64_t N : {1, 7, 129})
            for (int64_t K : {1, 33, 129})
              check_gemm<float>(ta, tb, M, N, K, 1.0f, 0.0f, 0, seed += 3);
  });
  uint64_t seed = 2;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t M : {1, 7, 33})
        for (int64_t N : {1, 7, 129})
          for (int64_t K : {1, 33, 129}) {
            check_gemm<double>(ta, tb, M, N, K, 1.0, 0.0, 0, seed += 3);
          }
}

TEST(Gemm, AlphaBetaAndLeadingDims) {
  on_each_library([&](const cpu::F32GemmLibrary*) {
    uint64_t seed = 100;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_gemm<float>(ta, tb, 33, 17, 65, 0.5f, 1.0f, 3, seed += 3);  // accumulate
        check_gemm<float>(ta, tb, 33, 17, 65, -2.0f, 0.25f, 5, seed += 3);
      }
    // Large enough for OpenBLAS (and oneDNN) to use their threads.
    check_gemm<float>(false, true, 256, 192, 130, 1.0f, 0.0f, 0, 7);
  });
  uint64_t seed = 200;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_gemm<double>(ta, tb, 9, 129, 7, 1.5, -1.0, 2, seed += 3);
}

TEST(Gemm, BetaZeroIgnoresNanAndKZero) {
  on_each_library([&](const cpu::F32GemmLibrary* lib) {
    // 16 rows, so that the rule takes oneDNN at Avx2: beta 0 must not read C there either.
    std::vector<float> A(16 * 3, 1.f), B(6, 1.f), C(16 * 2, NAN);
    const cpu::OnednnCacheStats before = cpu::onednn_cache_stats();
    cpu::gemm<float>(false, false, 16, 2, 3, 1.f, A.data(), 3, B.data(), 2, 0.f, C.data(), 2);
    for (float c : C) EXPECT_EQ(c, 3.f);
    // Forced onto oneDNN, the product did go there (it needs no scratchpad, so none fell back).
    const cpu::OnednnCacheStats after = cpu::onednn_cache_stats();
    if (lib == &kOnednn) EXPECT_GT(after.created + after.hits, before.created + before.hits);
    if (lib == &kOpenBlas) EXPECT_EQ(after.created + after.hits, before.created + before.hits);
  });
  std::vector<float> A(6, 1.f), B(6, 1.f), C(4, NAN);
  cpu::gemm<float>(false, false, 2, 2, 3, 1.f, A.data(), 3, B.data(), 2, 0.f, C.data(), 2);
  for (float c : C) EXPECT_EQ(c, 3.f);
  std::vector<float> C2(4, 2.f);
  cpu::gemm<float>(false, false, 2, 2, 0, 1.f, A.data(), 1, B.data(), 2, 0.5f, C2.data(), 2);
  for (float c : C2) EXPECT_EQ(c, 1.f);
  std::vector<float> C3(4, NAN);
  cpu::gemm<float>(false, false, 2, 2, 0, 1.f, A.data(), 1, B.data(), 2, 0.f, C3.data(), 2);
  for (float c : C3) EXPECT_EQ(c, 0.f);
}

template <typename T>
void check_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch, bool bcast_a,
                   bool bcast_b, T beta, uint64_t seed) {
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
  const int64_t sa = bcast_a ? 0 : M * K, sb = bcast_b ? 0 : K * N, sc = M * N;
  auto A = test::random_uniform_vec<T>((bcast_a ? 1 : batch) * M * K, seed);
  auto B = test::random_uniform_vec<T>((bcast_b ? 1 : batch) * K * N, seed + 1);
  auto C = test::random_uniform_vec<T>(batch * M * N, seed + 2);
  std::vector<double> ref;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> a(A.begin() + b * sa, A.begin() + b * sa + M * K);
    std::vector<double> bb(B.begin() + b * sb, B.begin() + b * sb + K * N);
    std::vector<double> c(C.begin() + b * sc, C.begin() + (b + 1) * sc);
    auto r = ref_gemm(ta, tb, M, N, K, 1.0, a, lda, bb, ldb, beta, c, ldc);
    ref.insert(ref.end(), r.begin(), r.end());
  }
  cpu::gemm_batched<T>(ta, tb, M, N, K, T(1), A.data(), lda, sa, B.data(), ldb, sb, beta, C.data(),
                       ldc, sc, batch);
  const double tol = (std::is_same_v<T, float> ? 2e-6 : 1e-13) * double(K + 1);
  EXPECT_TRUE(test::all_close(C, ref, tol, tol)) << "batch " << batch << " M " << M;
}

TEST(Gemm, BatchedWithBroadcast) {
  on_each_library([&](const cpu::F32GemmLibrary*) {
    uint64_t seed = 700;
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        check_batched<float>(ta, tb, 33, 20, 17, 3, false, true, 1.f, seed += 3);
  });
  uint64_t seed = 500;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t batch : {1, 7, 33}) {
        check_batched<float>(ta, tb, 7, 33, 16, batch, false, false, 0.f, seed += 3);
        check_batched<float>(ta, tb, 7, 9, 33, batch, true, false, 1.f, seed += 3);
        check_batched<double>(ta, tb, 5, 3, 7, batch, false, true, 0.5, seed += 3);
      }
  // Large matrices: sequential over batch, OpenBLAS threads inside.
  check_batched<float>(false, true, 96, 80, 64, 3, false, false, 0.f, 9);
  // Attention-shaped: many small heads, OpenMP over the batch.
  check_batched<float>(false, true, 64, 64, 16, 48, false, false, 0.f, 10);
}

class GemmNested : public ::testing::TestWithParam<int64_t> {};

TEST_P(GemmNested, CallableInsideParallelRegion) {
  // Callers (e.g. per-head attention) may call gemm from OpenMP threads: results must be right
  // and nothing may deadlock, both below OpenBLAS's threading threshold (M*N*K <= 262144) and
  // above it, where OpenBLAS would use its own thread pool.
  const int64_t M = GetParam(), N = 40, K = 70, n = 8;
  auto A = test::random_uniform_vec<float>(n * M * K, 1);
  auto B = test::random_uniform_vec<float>(K * N, 2);
  std::vector<float> C(n * M * N);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i)
    cpu::gemm<float>(false, false, M, N, K, 1.f, A.data() + i * M * K, K, B.data(), N, 0.f,
                     C.data() + i * M * N, N);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> a(A.begin() + i * M * K, A.begin() + (i + 1) * M * K);
    auto ref = test::ref_matmul(M, N, K, a, test::to_f64(B));
    std::vector<float> c(C.begin() + i * M * N, C.begin() + (i + 1) * M * N);
    EXPECT_TRUE(test::all_close(c, ref, 1e-4, 1e-4));
  }
}
INSTANTIATE_TEST_SUITE_P(Sizes, GemmNested, ::testing::Values(33, 200));

// The rule of matmul.h, at each level (a pure function of the level, so every level is checked
// on any machine): oneDNN for op(A) = A with M >= 16 and K <= 4096 at Avx2 only.
TEST(Gemm, LibraryRuleFollowsTheMeasuredShapes) {
  using cpu::CpuIsa;
  // shakespeare-char's and stories15M's forward products and input gradients.
  EXPECT_EQ(cpu::f32_gemm_library(CpuIsa::Avx2, false, 2048, 192), kOnednn);
  EXPECT_EQ(cpu::f32_gemm_library(CpuIsa::Avx2, false, 2048, 288), kOnednn);
  EXPECT_EQ(cpu::f32_gemm_library(CpuIsa::Avx2, false, 16, 192), kOnednn);
  EXPECT_EQ(cpu::f32_gemm_library(CpuIsa::Avx2, false, 128, 4096), kOnednn);
  // Weight gradients (A^T), few rows, and a K = 32000 input gradient stay on OpenBLAS.
  EXPECT_EQ(cpu::f32_gemm_library(CpuIsa::Avx2, true, 192, 2048), kOpenBlas);
  EXPECT_EQ(cpu::f32_gemm_library(CpuIsa::Avx2, false, 15, 192), kOpenBlas);
  EXPECT_EQ(cpu::f32_gemm_library(CpuIsa::Avx2, false, 2048, 32000), kOpenBlas);
  // Levels where it was not measured: OpenBLAS everywhere.
  for (CpuIsa level : {CpuIsa::Scalar, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx})
    EXPECT_EQ(cpu::f32_gemm_library(level, false, 2048, 192), kOpenBlas)
        << cpu::cpu_isa_name(level);
}

TEST(Gemm, RejectsBadArguments) {
  float x = 0;
  EXPECT_THROW(cpu::gemm<float>(false, false, -1, 1, 1, 1.f, &x, 1, &x, 1, 0.f, &x, 1), Error);
  EXPECT_THROW(cpu::gemm<float>(false, false, 2, 2, 3, 1.f, &x, 2, &x, 2, 0.f, &x, 2), Error);
  EXPECT_THROW(
      cpu::gemm<float>(false, false, int64_t(1) << 32, 1, 1, 1.f, &x, 1, &x, 1, 0.f, &x, 1), Error);
  EXPECT_THROW(
      cpu::gemm_batched<float>(false, false, 1, 1, 1, 1.f, &x, 1, 1, &x, 1, 1, 0.f, &x, 1, 0, 2),
      Error);
}

}  // namespace
}  // namespace kiln
