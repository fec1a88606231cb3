// GEMM on cuBLASLt (kernels/cuda/matmul.h, tensor/kernels_cuda_matmul.cpp).
//
// Host tests (run everywhere, no GPU): the row-major -> column-major plan against hand-computed
// layouts and against a naive column-major BLAS run on the plan, the zero-copy view rules, the
// Linear row collapse, pointer alignment, epilogue validation and the descriptor cache key.
//
// GPU tests (skip without a device): CUDA against a float64 CPU reference on odd sizes, batched,
// broadcast b, transposes, non-contiguous views, bias, beta accumulation, K = 0, guard elements
// after the output, and the cache (no heuristic query on a repeated shape). Thresholds, as the
// normalized MSE sum((got - want)^2) / sum(want^2):
//   f32  5e-4 (the project's matmul limit), and 1e-9 for the exact-fp32 check: an fp32 result
//        accumulated in fp32 is off by ~sqrt(K) * 2^-24 relative (< 1e-6 for K = 257, squared
//        1e-12), while TF32 (10-bit mantissa inputs) gives ~1e-7, so 1e-9 proves no TF32.
//   bf16 1e-4: inputs are bf16 (the reference uses the same rounded values), the product is
//        accumulated in f32 and rounded once to bf16: a relative error of at most 2^-8 and
//        ~2^-9 on average per element, i.e. an nMSE of ~3e-6 (the CPU model test below,
//        Bf16RoundingNmseModel, checks that bf16-rounding an exact product lands in 1e-6..6e-6).
//        1e-4 leaves 30x for accumulation order and beta's bf16 C, and any layout or bias bug
//        gives nMSE ~ 1.
//   f16  1e-5 (2^-11 unit roundoff: ~2e-7 expected).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/runtime.h"
#include "tensor/ops.h"

namespace kiln {
namespace {

using cuda::BlasView;
using cuda::GemmArgs;
using cuda::GemmEpilogue;
using cuda::GemmEpilogueArgs;
using cuda::GemmKey;
using cuda::GemmPlan;
using cuda::GemmType;
using V = std::vector<double>;

// ---- host: the plan ---------------------------------------------------------------------------

GemmArgs args(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda,
              std::int64_t ldb, std::int64_t ldc) {
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.M = M;
  g.N = N;
  g.K = K;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  return g;
}

TEST(CudaMatmulPlan, NoTransposeHandComputed) {
  // A (2,4) lda 4, B (4,3) ldb 3, C (2,3) ldc 3  ->  C^T (3,2) = B^T (3,4) A^T (4,2).
  const GemmPlan p = cuda::plan_gemm(args(false, false, 2, 3, 4, 4, 3, 3));
  EXPECT_TRUE(p.swap);
  EXPECT_FALSE(p.transa);
  EXPECT_FALSE(p.transb);
  EXPECT_EQ(p.m, 3);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.k, 4);
  EXPECT_EQ(p.a_rows, 3);  // kiln B (4,3) row-major = column-major (3,4)
  EXPECT_EQ(p.a_cols, 4);
  EXPECT_EQ(p.lda, 3);
  EXPECT_EQ(p.b_rows, 4);  // kiln A (2,4) row-major = column-major (4,2)
  EXPECT_EQ(p.b_cols, 2);
  EXPECT_EQ(p.ldb, 4);
  EXPECT_EQ(p.c_rows, 3);
  EXPECT_EQ(p.c_cols, 2);
  EXPECT_EQ(p.ldc, 3);
  EXPECT_EQ(p.batch, 1);
}

TEST(CudaMatmulPlan, BothTransposedPaddedHandComputed) {
  // A stored (K,M) = (4,2) with lda 8, B stored (N,K) = (3,4) with ldb 5, C (2,3) with ldc 6.
  const GemmPlan p = cuda::plan_gemm(args(true, true, 2, 3, 4, 8, 5, 6));
  EXPECT_TRUE(p.transa);  // cuBLAS A = kiln B, transposed as kiln's B was
  EXPECT_TRUE(p.transb);
  EXPECT_EQ(p.m, 3);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.k, 4);
  EXPECT_EQ(p.a_rows, 4);  // (N,K) row-major = column-major (K,N) = (4,3): op(T) gives (3,4)
  EXPECT_EQ(p.a_cols, 3);
  EXPECT_EQ(p.lda, 5);
  EXPECT_EQ(p.b_rows, 2);  // (K,M) row-major = column-major (M,K) = (2,4): op(T) gives (4,2)
  EXPECT_EQ(p.b_cols, 4);
  EXPECT_EQ(p.ldb, 8);
  EXPECT_EQ(p.ldc, 6);
}

TEST(CudaMatmulPlan, BatchStridesSwapAndZeroForOneMatrix) {
  GemmArgs g = args(false, true, 5, 7, 3, 3, 3, 7);
  g.batch = 4;
  g.stride_a = 15;
  g.stride_b = 0;  // broadcast B
  g.stride_c = 35;
  GemmPlan p = cuda::plan_gemm(g);
  EXPECT_EQ(p.batch, 4);
  EXPECT_EQ(p.stride_a, 0);  // cuBLAS A is kiln B
  EXPECT_EQ(p.stride_b, 15);
  EXPECT_EQ(p.stride_c, 35);
  g.batch = 1;
  p = cuda::plan_gemm(g);
  EXPECT_EQ(p.stride_a, 0);
  EXPECT_EQ(p.stride_b, 0);
  EXPECT_EQ(p.stride_c, 0);
}

TEST(CudaMatmulPlan, RejectsBadArguments) {
  EXPECT_THROW(cuda::plan_gemm(args(false, false, 2, 3, 0, 1, 3, 3)), Error);  // K = 0
  EXPECT_THROW(cuda::plan_gemm(args(false, false, 2, 3, 4, 3, 3, 3)), Error);  // lda < K
  EXPECT_THROW(cuda::plan_gemm(args(true, false, 2, 3, 4, 1, 3, 3)), Error);   // lda < M
  EXPECT_THROW(cuda::plan_gemm(args(false, true, 2, 3, 4, 4, 3, 3)), Error);   // ldb < K
  EXPECT_THROW(cuda::plan_gemm(args(false, false, 2, 3, 4, 4, 3, 2)), Error);  // ldc < N
  EXPECT_THROW(cuda::plan_gemm(args(false, false, std::int64_t(1) << 31, 3, 4, 4, 3, 3)), Error);
  GemmArgs g = args(false, false, 2, 3, 4, 4, 3, 3);
  g.batch = 2;
  g.stride_c = 0;  // every batch entry would write the same output
  EXPECT_THROW(cuda::plan_gemm(g), Error);
  g.stride_c = 6;
  g.stride_a = -1;
  EXPECT_THROW(cuda::plan_gemm(g), Error);
  try {
    cuda::plan_gemm(args(false, false, 2, 3, 4, 3, 3, 3));
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[gemm] ", 0), 0u) << e.what();
  }
}

// Naive column-major BLAS, as cuBLASLt defines it, run on a plan: D = alpha op(A) op(B) + beta C
// with op(A)(i,l) = transa ? A[l + i*lda] : A[i + l*lda].
void colmajor_gemm(const GemmPlan& p, double alpha, const double* A, const double* B, double beta,
                   double* C) {
  for (std::int64_t bi = 0; bi < p.batch; ++bi) {
    const double* a = A + bi * p.stride_a;
    const double* b = B + bi * p.stride_b;
    double* c = C + bi * p.stride_c;
    for (std::int64_t j = 0; j < p.n; ++j)
      for (std::int64_t i = 0; i < p.m; ++i) {
        double s = 0;
        for (std::int64_t l = 0; l < p.k; ++l) {
          const double x = p.transa ? a[l + i * p.lda] : a[i + l * p.lda];
          const double y = p.transb ? b[j + l * p.ldb] : b[l + j * p.ldb];
          s += x * y;
        }
        c[i + j * p.ldc] = alpha * s + (beta == 0 ? 0.0 : beta * c[i + j * p.ldc]);
      }
  }
}

TEST(CudaMatmulPlan, ColumnMajorRunOfThePlanEqualsRowMajorProduct) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> dist(-1, 1);
  int cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (std::int64_t M : {1, 2, 5})
        for (std::int64_t N : {1, 3, 4})
          for (std::int64_t K : {1, 2, 7})
            for (std::int64_t batch : {1, 3})
              for (bool bcast_b : {false, true}) {
                if (bcast_b && batch == 1) continue;
                GemmArgs g;
                g.trans_a = ta;
                g.trans_b = tb;
                g.M = M;
                g.N = N;
                g.K = K;
                g.batch = batch;
                const std::int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
                const std::int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
                g.lda = a_cols + 1;  // padded rows catch a wrong leading dimension
                g.ldb = b_cols + 2;
                g.ldc = N + 3;
                g.stride_a = a_rows * g.lda + 1;
                g.stride_b = bcast_b ? 0 : b_rows * g.ldb;
                g.stride_c = M * g.ldc;
                V A(batch * g.stride_a), B(bcast_b ? b_rows * g.ldb : batch * g.stride_b);
                for (auto& x : A) x = dist(gen);
                for (auto& x : B) x = dist(gen);
                V C0(batch * g.stride_c);
                for (auto& x : C0) x = dist(gen);
                const double alpha = 0.75, beta = -0.5;
                // Row-major reference.
                V want = C0;
                for (std::int64_t bi = 0; bi < batch; ++bi)
                  for (std::int64_t i = 0; i < M; ++i)
                    for (std::int64_t j = 0; j < N; ++j) {
                      double s = 0;
                      for (std::int64_t l = 0; l < K; ++l) {
                        const double* a = A.data() + bi * g.stride_a;
                        const double* b = B.data() + bi * g.stride_b;
                        s += (ta ? a[l * g.lda + i] : a[i * g.lda + l]) *
                             (tb ? b[j * g.ldb + l] : b[l * g.ldb + j]);
                      }
                      double& c = want[bi * g.stride_c + i * g.ldc + j];
                      c = alpha * s + beta * c;
                    }
                const GemmPlan p = cuda::plan_gemm(g);
                // Layout dims must describe what op() reads: op(A) is m x k, op(B) k x n.
                EXPECT_EQ(p.transa ? p.a_cols : p.a_rows, p.m);
                EXPECT_EQ(p.transa ? p.a_rows : p.a_cols, p.k);
                EXPECT_EQ(p.transb ? p.b_cols : p.b_rows, p.k);
                EXPECT_EQ(p.transb ? p.b_rows : p.b_cols, p.n);
                EXPECT_GE(p.lda, p.a_rows);
                EXPECT_GE(p.ldb, p.b_rows);
                EXPECT_GE(p.ldc, p.c_rows);
                V got = C0;
                colmajor_gemm(p, alpha, B.data(), A.data(), beta, got.data());  // swapped
                ASSERT_EQ(got, want) << "ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N
                                     << " K=" << K << " batch=" << batch;
                ++cases;
              }
  EXPECT_EQ(cases, 4 * 27 * 3);
}

// ---- host: views, rows, alignment, epilogue checks, keys -------------------------------------

void expect_view(const BlasView& v, bool ok, bool transposed, std::int64_t ld) {
  EXPECT_EQ(v.ok, ok);
  if (!ok) return;
  EXPECT_EQ(v.transposed, transposed);
  EXPECT_EQ(v.ld, ld);
}

TEST(CudaMatmulViews, BlasViewRules) {
  expect_view(cuda::blas_view(3, 4, 4, 1), true, false, 4);    // contiguous
  expect_view(cuda::blas_view(3, 2, 4, 1), true, false, 4);    // narrowed columns
  expect_view(cuda::blas_view(3, 4, 1, 3), true, true, 3);     // (4,3).transpose(0,1)
  expect_view(cuda::blas_view(3, 4, 1, 10), true, true, 10);   // transposed, padded
  expect_view(cuda::blas_view(1, 5, 100, 1), true, false, 5);  // one row: row stride is free
  expect_view(cuda::blas_view(1, 5, 5, 2), true, true, 2);     // one strided row = a column
  expect_view(cuda::blas_view(5, 1, 3, 7), true, false, 3);    // one column, rows 3 apart
  expect_view(cuda::blas_view(1, 1, 9, 9), true, false, 1);    // a scalar
  expect_view(cuda::blas_view(3, 4, 0, 1), false, false, 0);   // broadcast rows
  expect_view(cuda::blas_view(3, 4, 8, 2), false, false, 0);   // no unit stride
  expect_view(cuda::blas_view(3, 4, 2, 1), false, false, 0);   // overlapping rows
  expect_view(cuda::blas_view(3, 4, 1, 2), false, false, 0);   // overlapping columns
  expect_view(cuda::blas_view(3, 4, -4, 1), false, false, 0);  // negative
}

TEST(CudaMatmulViews, CollapsedRowStride) {
  auto rs = [](Shape s, Shape st) {
    return cuda::collapsed_row_stride(s.data(), st.data(), static_cast<int>(s.size()));
  };
  EXPECT_EQ(rs({2, 3, 4}, {12, 4, 1}), 4);   // contiguous
  EXPECT_EQ(rs({2, 3, 4}, {24, 8, 1}), 8);   // narrowed last dim of (2,3,8)
  EXPECT_EQ(rs({2, 3, 4}, {4, 8, 1}), -1);   // permuted leading dims
  EXPECT_EQ(rs({2, 3, 4}, {30, 8, 1}), -1);  // gap between batches
  EXPECT_EQ(rs({1, 3, 4}, {99, 4, 1}), 4);   // size-1 dims do not matter
  EXPECT_EQ(rs({2, 1, 4}, {4, 99, 1}), 4);
  EXPECT_EQ(rs({1, 1, 4}, {7, 7, 1}), 0);  // a single row
  EXPECT_EQ(rs({2, 2, 3, 5}, {30, 15, 5, 1}), 5);
  EXPECT_EQ(rs({5}, {1}), -1);  // needs 2 dims
}

TEST(CudaMatmulViews, Alignment) {
  EXPECT_EQ(cuda::gemm_alignment(0x1000, 0, 1, 4), 16);
  EXPECT_EQ(cuda::gemm_alignment(0x1100, 0, 1, 4), 16);  // capped at 16
  EXPECT_EQ(cuda::gemm_alignment(0x1008, 0, 1, 4), 8);
  EXPECT_EQ(cuda::gemm_alignment(0x1004, 0, 1, 4), 4);
  EXPECT_EQ(cuda::gemm_alignment(0x1002, 0, 1, 2), 2);
  EXPECT_EQ(cuda::gemm_alignment(0, 0, 1, 2), 16);       // absent pointer
  EXPECT_EQ(cuda::gemm_alignment(0x1000, 3, 2, 4), 4);   // batch entries 12 bytes apart
  EXPECT_EQ(cuda::gemm_alignment(0x1000, 3, 1, 4), 16);  // one matrix: stride irrelevant
  EXPECT_EQ(cuda::gemm_alignment(0x1000, 0, 5, 4), 16);  // broadcast
  EXPECT_EQ(cuda::gemm_alignment(0x1000, 1, 5, 2), 2);
  EXPECT_EQ(cuda::gemm_alignment(0x1000, 8, 5, 2), 16);
}

TEST(CudaMatmulViews, EpilogueChecks) {
  int dummy = 0;
  EXPECT_NO_THROW(cuda::check_gemm_epilogue(GemmEpilogue::None, nullptr));
  EXPECT_NO_THROW(cuda::check_gemm_epilogue(GemmEpilogue::Bias, &dummy));
  EXPECT_THROW(cuda::check_gemm_epilogue(GemmEpilogue::Bias, nullptr), Error);
  EXPECT_TRUE(cuda::epilogue_has_bias(GemmEpilogue::Bias));
  EXPECT_FALSE(cuda::epilogue_has_bias(GemmEpilogue::None));
}

TEST(CudaMatmulViews, CacheKey) {
  GemmArgs g = args(false, true, 5, 24, 7, 7, 7, 24);
  const GemmPlan p = cuda::plan_gemm(g);
  GemmEpilogueArgs none;
  const GemmKey k = cuda::make_gemm_key(0, GemmType::BF16, false, p, none, 16, 16, 16, 16);
  EXPECT_EQ(k.m, 24);
  EXPECT_EQ(k.n, 5);
  EXPECT_EQ(k.k, 7);
  EXPECT_EQ(k.transa, 1);
  EXPECT_EQ(k.transb, 0);
  EXPECT_EQ(k.lda, 7);
  EXPECT_EQ(k.ldb, 7);
  EXPECT_EQ(k.ldc, 24);
  cuda::GemmKeyHash h;
  auto same = [&](const GemmKey& o) { return o == k && h(o) == h(k); };
  // TF32 means nothing for bf16; bias alignment nothing without a bias epilogue.
  EXPECT_TRUE(same(cuda::make_gemm_key(0, GemmType::BF16, true, p, none, 16, 16, 16, 2)));
  EXPECT_FALSE(same(cuda::make_gemm_key(1, GemmType::BF16, false, p, none, 16, 16, 16, 16)));
  EXPECT_FALSE(same(cuda::make_gemm_key(0, GemmType::F16, false, p, none, 16, 16, 16, 16)));
  EXPECT_FALSE(same(cuda::make_gemm_key(0, GemmType::BF16, false, p, none, 8, 16, 16, 16)));
  EXPECT_FALSE(same(cuda::make_gemm_key(0, GemmType::BF16, false, p, none, 16, 16, 2, 16)));
  const GemmKey f32 = cuda::make_gemm_key(0, GemmType::F32, false, p, none, 16, 16, 16, 16);
  EXPECT_NE(f32, cuda::make_gemm_key(0, GemmType::F32, true, p, none, 16, 16, 16, 16));
  GemmEpilogueArgs bias;
  bias.epilogue = GemmEpilogue::Bias;
  const GemmKey kb = cuda::make_gemm_key(0, GemmType::BF16, false, p, bias, 16, 16, 16, 16);
  EXPECT_NE(kb, k);
  EXPECT_NE(kb, cuda::make_gemm_key(0, GemmType::BF16, false, p, bias, 16, 16, 16, 2));
  g.ldb = 8;  // another leading dimension
  EXPECT_FALSE(same(
      cuda::make_gemm_key(0, GemmType::BF16, false, cuda::plan_gemm(g), none, 16, 16, 16, 16)));
  std::unordered_map<GemmKey, int, cuda::GemmKeyHash> map;
  map[k] = 1;
  map[kb] = 2;
  map[f32] = 3;
  map[cuda::make_gemm_key(0, GemmType::BF16, true, p, none, 16, 16, 16, 2)] = 4;  // == k
  EXPECT_EQ(map.size(), 3u);
  EXPECT_EQ(map[k], 4);
}

// The bf16 threshold's premise: rounding an exact product to bf16 costs an nMSE of ~3e-6.
TEST(CudaMatmulViews, Bf16RoundingNmseModel) {
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<double> dist(-1, 1);
  V exact(4096);
  for (auto& x : exact) {
    double s = 0;
    for (int l = 0; l < 33; ++l) s += dist(gen) * dist(gen);
    x = s;
  }
  Tensor t = ops::from_vector(exact, {4096}, DType::F64);
  const V rounded = t.to(DType::BF16).to_double_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    num += (rounded[i] - exact[i]) * (rounded[i] - exact[i]);
    den += exact[i] * exact[i];
  }
  EXPECT_GT(num / den, 1e-6);
  EXPECT_LT(num / den, 6e-6);
}

// ---- host: the GEMV's eligibility and launch shape
// ------------------------------------------------

TEST(CudaGemvPlan, SupportedAndBlocks) {
  alignas(16) static std::uint16_t buf[64];
  const void* a = buf;
  const void* odd = buf + 1;  // 2-byte aligned only
  EXPECT_TRUE(cuda::gemv_supported(4096, 4096, a, a, a));
  EXPECT_TRUE(cuda::gemv_supported(1, 8, a, a, odd));    // y is written element by element
  EXPECT_FALSE(cuda::gemv_supported(1, 12, a, a, a));    // K not whole 16-byte chunks
  EXPECT_FALSE(cuda::gemv_supported(4, 64, odd, a, a));  // W unaligned
  EXPECT_FALSE(cuda::gemv_supported(4, 64, a, odd, a));  // x unaligned
  EXPECT_FALSE(cuda::gemv_supported(0, 64, a, a, a));
  EXPECT_FALSE(cuda::gemv_supported(4, 0, a, a, a));
  // Fewer than 8192 rows: the 4 warps of a block share a row; more: a warp per row.
  EXPECT_EQ(cuda::gemv_ksplit(1024), cuda::kGemvWarps);
  EXPECT_EQ(cuda::gemv_ksplit(4096), cuda::kGemvWarps);
  EXPECT_EQ(cuda::gemv_ksplit(12288), 1);
  EXPECT_EQ(cuda::gemv_blocks(1, 1), 1);
  EXPECT_EQ(cuda::gemv_blocks(cuda::kGemvWarps, 1), 1);
  EXPECT_EQ(cuda::gemv_blocks(cuda::kGemvWarps + 1, 1), 2);
  EXPECT_EQ(cuda::gemv_blocks(151936, 1), 151936 / cuda::kGemvWarps);
  EXPECT_EQ(cuda::gemv_blocks(1024, cuda::kGemvWarps), 1024);
}

// ---- GPU: CUDA against a float64 reference ------------------------------------------------------

#if defined(KILN_CUDA)

class CudaMatmul : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0)
      GTEST_SKIP() << "no CUDA device: the cuBLASLt GEMM comparisons need a GPU";
  }
};

// Uniform(-1, 1) on the CPU, rounded to dt there: the reference reads the same rounded values.
Tensor rand_cpu(const Shape& s, std::uint64_t seed, DType dt) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  V v(static_cast<std::size_t>(shape_numel(s)));
  for (auto& x : v) x = dist(gen);
  return ops::from_vector(v, s, DType::F64).to(dt);
}
Tensor gpu(const Tensor& t) { return t.to(Device::cuda()); }

// op(t) of a 2-d tensor (any strides, any device) as row-major doubles.
V mat(const Tensor& t, bool trans) {
  return trans ? t.transpose(0, 1).to_double_vector() : t.to_double_vector();
}
// (M,K) @ (K,N) in f64.
V mm(const V& a, const V& b, std::int64_t M, std::int64_t N, std::int64_t K) {
  V c(static_cast<std::size_t>(M * N), 0.0);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t l = 0; l < K; ++l) {
      const double x = a[i * K + l];
      for (std::int64_t j = 0; j < N; ++j) c[i * N + j] += x * b[l * N + j];
    }
  return c;
}

double limit(DType dt) { return dt == DType::F32 ? 5e-4 : dt == DType::BF16 ? 1e-4 : 1e-5; }

::testing::AssertionResult nmse_ok(const V& got, const V& want, double lim) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "non-finite at " << i;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  const double nmse = den > 0 ? num / den : num;
  if (nmse <= lim) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "nmse " << nmse << " > " << lim;
}
::testing::AssertionResult nmse_ok(const Tensor& got, const V& want, double lim) {
  return nmse_ok(got.to_double_vector(), want, lim);
}

TEST_F(CudaMatmul, TwoDimOddSizesAllTransposes) {
  const std::int64_t sizes[] = {1, 7, 33, 100, 257};
  for (DType dt : {DType::F32, DType::BF16}) {
    int i = 0;
    for (std::int64_t M : sizes)
      for (std::int64_t N : sizes)
        for (std::int64_t K : sizes) {
          const bool ta = i % 2, tb = (i / 2) % 2;  // every combination, over the sizes
          ++i;
          Tensor a = rand_cpu(ta ? Shape{K, M} : Shape{M, K}, i, dt);
          Tensor b = rand_cpu(tb ? Shape{N, K} : Shape{K, N}, 1000 + i, dt);
          Tensor c = ops::matmul(gpu(a), gpu(b), ta, tb);
          ASSERT_EQ(c.shape(), (Shape{M, N}));
          ASSERT_EQ(c.dtype(), dt);
          EXPECT_TRUE(nmse_ok(c, mm(mat(a, ta), mat(b, tb), M, N, K), limit(dt)))
              << dtype_name(dt) << " M=" << M << " N=" << N << " K=" << K << " ta=" << ta
              << " tb=" << tb;
        }
  }
}

TEST_F(CudaMatmul, F16) {
  Tensor a = rand_cpu({33, 100}, 1, DType::F16), b = rand_cpu({7, 100}, 2, DType::F16);
  Tensor c = ops::matmul(gpu(a), gpu(b), false, true);
  EXPECT_TRUE(nmse_ok(c, mm(mat(a, false), mat(b, true), 33, 7, 100), limit(DType::F16)));
}

// Batched reference: a (B,M,K) or its per-batch transposes, b 2-d or 3-d.
V bmm(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const std::int64_t B = a.size(0);
  V out;
  for (std::int64_t i = 0; i < B; ++i) {
    const Tensor ai = a.select(0, i), bi = b.dim() == 3 ? b.select(0, i) : b;
    const std::int64_t M = ta ? ai.size(1) : ai.size(0), K = ta ? ai.size(0) : ai.size(1);
    const std::int64_t N = tb ? bi.size(0) : bi.size(1);
    const V c = mm(mat(ai, ta), mat(bi, tb), M, N, K);
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

TEST_F(CudaMatmul, BatchedBroadcastAndStridedBatches) {
  const std::int64_t B = 3, M = 33, N = 7, K = 100;
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Tensor a = rand_cpu(ta ? Shape{B, K, M} : Shape{B, M, K}, 1, dt);
        Tensor b3 = rand_cpu(tb ? Shape{B, N, K} : Shape{B, K, N}, 2, dt);
        Tensor b2 = rand_cpu(tb ? Shape{N, K} : Shape{K, N}, 3, dt);
        Tensor ga = gpu(a);
        // 3-d b; 2-d b (one GEMM when !ta, batch stride 0 when ta); b expanded (stride 0).
        EXPECT_TRUE(nmse_ok(ops::matmul(ga, gpu(b3), ta, tb), bmm(a, b3, ta, tb), limit(dt)));
        EXPECT_TRUE(nmse_ok(ops::matmul(ga, gpu(b2), ta, tb), bmm(a, b2, ta, tb), limit(dt)));
        Tensor bx = gpu(b2).unsqueeze(0).expand({B, b2.size(0), b2.size(1)});
        EXPECT_TRUE(nmse_ok(ops::matmul(ga, bx, ta, tb), bmm(a, b2, ta, tb), limit(dt)));
      }
    // Batches that are not back to back: a (M,B,K) transposed to (B,M,K): batch stride K.
    Tensor p = rand_cpu({M, B, K}, 4, dt);
    Tensor b2 = rand_cpu({K, N}, 5, dt);
    Tensor pa = p.transpose(0, 1);
    EXPECT_TRUE(nmse_ok(ops::matmul(gpu(p).transpose(0, 1), gpu(b2)), bmm(pa, b2, false, false),
                        limit(dt)));
    // M == 1: single rows with a padded batch stride, folded into one GEMM.
    Tensor r = rand_cpu({B, 1, K + 4}, 6, dt);
    Tensor ra = r.narrow(2, 1, K);
    EXPECT_TRUE(nmse_ok(ops::matmul(gpu(r).narrow(2, 1, K), gpu(b2)), bmm(ra, b2, false, false),
                        limit(dt)));
  }
}

TEST_F(CudaMatmul, NonContiguousInputs) {
  const std::int64_t M = 100, N = 33, K = 257;
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor at = rand_cpu({K, M}, 1, dt);      // a = at^T: a transposed view, no copy
    Tensor ap = rand_cpu({M, K + 5}, 2, dt);  // a = narrowed columns: ld K+5, offset 2
    Tensor as = rand_cpu({M, K, 2}, 3, dt);   // a = every other element: copied
    Tensor b = rand_cpu({K, N}, 4, dt);
    Tensor row = rand_cpu({1, N}, 5, dt);  // b = one row broadcast: copied
    const V want_b = mat(b, false);
    struct Case {
      Tensor cpu, dev;
    };
    const Case cases[] = {{at.transpose(0, 1), gpu(at).transpose(0, 1)},
                          {ap.narrow(1, 2, K), gpu(ap).narrow(1, 2, K)},
                          {as.select(2, 1), gpu(as).select(2, 1)}};
    for (const auto& c : cases) {
      EXPECT_TRUE(
          nmse_ok(ops::matmul(c.dev, gpu(b)), mm(mat(c.cpu, false), want_b, M, N, K), limit(dt)));
      // The same view with trans_a: op(view^T^T).
      Tensor ct = c.dev.transpose(0, 1);
      EXPECT_TRUE(nmse_ok(ops::matmul(ct, gpu(b), true, false),
                          mm(mat(c.cpu, false), want_b, M, N, K), limit(dt)));
    }
    Tensor bx = gpu(row).expand({K, N});
    EXPECT_TRUE(nmse_ok(ops::matmul(gpu(at).transpose(0, 1), bx),
                        mm(mat(at, true), mat(row.expand({K, N}), false), M, N, K), limit(dt)));
  }
}

V linear_ref(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const std::int64_t K = w.size(1), N = w.size(0), rows = x.numel() / K;
  V out = mm(x.reshape({rows, K}).to_double_vector(), mat(w, true), rows, N, K);
  if (bias.defined()) {
    const V bv = bias.to_double_vector();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < N; ++j) out[r * N + j] += bv[j];
  }
  return out;
}

TEST_F(CudaMatmul, LinearBiasShapesAndViews) {
  for (DType dt : {DType::F32, DType::BF16})
    for (std::int64_t N : {7, 100}) {
      const std::int64_t K = 33;
      Tensor x = rand_cpu({2, 5, K}, 1, dt), w = rand_cpu({N, K}, 2, dt);
      Tensor bias = rand_cpu({N}, 3, dt);
      Tensor gx = gpu(x), gw = gpu(w), gb = gpu(bias);
      Tensor y = ops::linear(gx, gw, gb);
      ASSERT_EQ(y.shape(), (Shape{2, 5, N}));
      EXPECT_TRUE(nmse_ok(y, linear_ref(x, w, bias), limit(dt))) << dtype_name(dt) << " " << N;
      EXPECT_TRUE(nmse_ok(ops::linear(gx, gw, Tensor()), linear_ref(x, w, Tensor()), limit(dt)));
      // x 1-d; x with padded rows (collapsible, no copy); x permuted (copied); w transposed view.
      Tensor x1 = x.select(0, 1).select(0, 3);
      EXPECT_TRUE(nmse_ok(ops::linear(gpu(x1), gw, gb), linear_ref(x1, w, bias), limit(dt)));
      Tensor xp = rand_cpu({2, 5, K + 3}, 4, dt);
      EXPECT_TRUE(nmse_ok(ops::linear(gpu(xp).narrow(2, 3, K), gw, gb),
                          linear_ref(xp.narrow(2, 3, K), w, bias), limit(dt)));
      Tensor xq = rand_cpu({5, 2, K}, 5, dt);
      EXPECT_TRUE(nmse_ok(ops::linear(gpu(xq).transpose(0, 1), gw, gb),
                          linear_ref(xq.transpose(0, 1), w, bias), limit(dt)));
      Tensor wt = rand_cpu({K, N}, 6, dt);
      EXPECT_TRUE(nmse_ok(ops::linear(gx, gpu(wt).transpose(0, 1), gb),
                          linear_ref(x, wt.transpose(0, 1), bias), limit(dt)));
      // A bias in another dtype is converted to the output's.
      Tensor b32 = bias.to(DType::F32);
      EXPECT_TRUE(nmse_ok(ops::linear(gx, gw, gpu(b32)), linear_ref(x, w, bias), limit(dt)));
    }
}

TEST_F(CudaMatmul, GemmBetaAccumulationGuardsAndNaN) {
  const std::int64_t M = 33, N = 100, K = 7, kGuard = 64;
  const double sentinel = 7.0;
  for (DType dt : {DType::F32, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Tensor a = rand_cpu(ta ? Shape{K, M} : Shape{M, K}, 1, dt);
        Tensor b = rand_cpu(tb ? Shape{N, K} : Shape{K, N}, 2, dt);
        Tensor c0 = rand_cpu({M, N}, 3, dt);
        const V prod = mm(mat(a, ta), mat(b, tb), M, N, K), cv = c0.to_double_vector();
        // c is the head of a larger buffer: the tail must be untouched.
        Tensor buf = ops::full({M * N + kGuard}, sentinel, dt, Device::cuda());
        Tensor c = buf.narrow(0, 0, M * N).view({M, N});
        c.copy_(gpu(c0));
        ops::gemm_(c, gpu(a), gpu(b), ta, tb, 1.0, 1.0);  // c += a b
        V want(prod.size());
        for (std::size_t i = 0; i < want.size(); ++i) want[i] = prod[i] + cv[i];
        EXPECT_TRUE(nmse_ok(c, want, limit(dt))) << dtype_name(dt) << " ta=" << ta << " tb=" << tb;
        ops::gemm_(c, gpu(a), gpu(b), ta, tb, 0.5, 2.0);  // c = 0.5 a b + 2 c
        for (std::size_t i = 0; i < want.size(); ++i) want[i] = 0.5 * prod[i] + 2.0 * want[i];
        EXPECT_TRUE(nmse_ok(c, want, limit(dt)));
        ops::fill_(c, std::numeric_limits<double>::quiet_NaN());
        ops::gemm_(c, gpu(a), gpu(b), ta, tb, 1.0, 0.0);  // beta 0: NaNs in c must not leak
        EXPECT_TRUE(nmse_ok(c, prod, limit(dt)));
        for (double g : buf.narrow(0, M * N, kGuard).to_double_vector()) ASSERT_EQ(g, sentinel);
      }
}

TEST_F(CudaMatmul, EmptyInnerDimension) {
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor a = ops::zeros({5, 0}, dt, Device::cuda()), b = ops::zeros({0, 7}, dt, Device::cuda());
    EXPECT_TRUE(nmse_ok(ops::matmul(a, b), V(35, 0.0), 0.0));
    Tensor bias = rand_cpu({7}, 1, dt);
    Tensor w = ops::zeros({7, 0}, dt, Device::cuda());
    Tensor y = ops::linear(a, w, gpu(bias));
    V want;
    const V bv = bias.to_double_vector();
    for (int r = 0; r < 5; ++r) want.insert(want.end(), bv.begin(), bv.end());
    EXPECT_TRUE(nmse_ok(y, want, 0.0));
    Tensor c0 = rand_cpu({5, 7}, 2, dt);
    Tensor c = gpu(c0);
    ops::gemm_(c, a, b, false, false, 1.0, 2.0);
    V twice = c0.to_double_vector();
    for (auto& v : twice) v *= 2;
    EXPECT_TRUE(nmse_ok(c, twice, 0.0));
  }
}

TEST_F(CudaMatmul, RepeatedShapeMakesNoHeuristicQuery) {
  cuda::gemm_cache_clear();
  Tensor a = gpu(rand_cpu({64, 96}, 1, DType::BF16)), b = gpu(rand_cpu({96, 48}, 2, DType::BF16));
  (void)ops::matmul(a, b);
  const cuda::GemmCacheStats s1 = cuda::gemm_cache_stats();
  for (int i = 0; i < 3; ++i) (void)ops::matmul(a, b);
  const cuda::GemmCacheStats s2 = cuda::gemm_cache_stats();
  EXPECT_EQ(s2.heuristic_queries, s1.heuristic_queries);
  EXPECT_EQ(s2.hits, s1.hits + 3);
  EXPECT_EQ(s2.entries, s1.entries);
}

TEST_F(CudaMatmul, F32IsExactUnlessTf32IsAllowed) {
  ASSERT_FALSE(cuda::allow_tf32());
  const std::int64_t n = 257;
  Tensor a = rand_cpu({n, n}, 1, DType::F32), b = rand_cpu({n, n}, 2, DType::F32);
  const V want = mm(mat(a, false), mat(b, false), n, n, n);
  EXPECT_TRUE(nmse_ok(ops::matmul(gpu(a), gpu(b)), want, 1e-9));
  cuda::set_allow_tf32(true);
  Tensor c = ops::matmul(gpu(a), gpu(b));
  cuda::set_allow_tf32(false);
  EXPECT_TRUE(nmse_ok(c, want, 5e-6));  // TF32: ~2e-7 expected
}

// Decode's single bf16 row goes to kiln's GEMV (kernels/cuda/gemv.h): it must match a float64
// reference within what f32 accumulation of K bf16 products allows, |err| <= K u32 sum_k |w x|
// + one bf16 rounding of the result, element by element; and cuBLASLt's result (the GEMV
// turned off) within the same bound. Shapes: a row shorter than a warp's chunk, odd N, N not a
// multiple of the block's rows, Qwen3-8B's (q_proj, k_proj, down_proj, gate_proj), and both
// splits of a row's work (4 warps a row below 8192 rows, a warp a row above).
TEST_F(CudaMatmul, DecodeGemvMatchesFloat64AndCublasLt) {
  ASSERT_TRUE(cuda::gemv_enabled()) << "KILN_CUDA_GEMV=0 in the environment";
  for (auto [N, K] : {std::pair<std::int64_t, std::int64_t>{1, 8},
                      {7, 64},
                      {13, 264},
                      {4096, 4096},
                      {1024, 4096},
                      {4096, 12288},
                      {1003, 1032},
                      {12289, 136},
                      {12288, 4096}}) {
    SCOPED_TRACE("N " + std::to_string(N) + " K " + std::to_string(K));
    const Tensor x = rand_cpu({1, 1, K}, 10 + K, DType::BF16);
    const Tensor w = rand_cpu({N, K}, 20 + N, DType::BF16);
    const V xv = x.to_double_vector(), wv = w.to_double_vector();
    V want(static_cast<std::size_t>(N)), mag(static_cast<std::size_t>(N));
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < K; ++k) {
        want[n] += wv[n * K + k] * xv[k];
        mag[n] += std::fabs(wv[n * K + k] * xv[k]);
      }
    const Tensor xg = gpu(x), wg = gpu(w);
    ASSERT_TRUE(cuda::gemv_supported(N, K, wg.raw_data(), xg.raw_data(), xg.raw_data()));
    const V kiln = ops::linear(xg, wg, Tensor()).to_double_vector();
    cuda::set_gemv_enabled(false);
    const V lt = ops::linear(xg, wg, Tensor()).to_double_vector();
    cuda::set_gemv_enabled(true);
    ASSERT_EQ(kiln.size(), want.size());
    const double u = std::ldexp(1.0, -24), half_ulp = std::ldexp(1.0, -8);
    for (std::int64_t n = 0; n < N; ++n) {
      const double bound = static_cast<double>(K) * u * mag[n] + half_ulp * std::fabs(want[n]);
      ASSERT_LE(std::fabs(kiln[n] - want[n]), bound) << "kiln row " << n;
      ASSERT_LE(std::fabs(lt[n] - want[n]), bound) << "cuBLASLt row " << n;
    }
    // The GEMV is deterministic: the same bits twice.
    EXPECT_EQ(ops::linear(xg, wg, Tensor()).to_double_vector(), kiln);
  }
}

// Up to kGemvMaxRows rows of x (kiln serve's batches on CUDA): each row within the same bound of
// its float64 product, and bitwise the row computed alone (the GEMV is batch-invariant).
TEST_F(CudaMatmul, DecodeGemvRowsEqualTheirSoloRuns) {
  ASSERT_TRUE(cuda::gemv_enabled()) << "KILN_CUDA_GEMV=0 in the environment";
  for (auto [N, K] :
       {std::pair<std::int64_t, std::int64_t>{7, 64}, {1003, 1032}, {4096, 4096}, {12289, 136}}) {
    const Tensor w = rand_cpu({N, K}, 30 + N, DType::BF16);
    const Tensor x = rand_cpu({cuda::kGemvMaxRows, K}, 40 + K, DType::BF16);
    const V xv = x.to_double_vector(), wv = w.to_double_vector();
    const Tensor wg = gpu(w), xg = gpu(x);
    std::vector<V> alone;
    for (std::int64_t m = 0; m < cuda::kGemvMaxRows; ++m)
      alone.push_back(ops::linear(xg.narrow(0, m, 1), wg, Tensor()).to_double_vector());
    const double u = std::ldexp(1.0, -24), half_ulp = std::ldexp(1.0, -8);
    for (std::int64_t M = 2; M <= cuda::kGemvMaxRows; ++M) {
      SCOPED_TRACE("N " + std::to_string(N) + " K " + std::to_string(K) + " M " +
                   std::to_string(M));
      const V got = ops::linear(xg.narrow(0, 0, M), wg, Tensor()).to_double_vector();
      ASSERT_EQ(got.size(), static_cast<std::size_t>(M * N));
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n) {
          double want = 0, mag = 0;
          for (std::int64_t k = 0; k < K; ++k) {
            want += wv[n * K + k] * xv[m * K + k];
            mag += std::fabs(wv[n * K + k] * xv[m * K + k]);
          }
          const double bound = static_cast<double>(K) * u * mag + half_ulp * std::fabs(want);
          ASSERT_LE(std::fabs(got[m * N + n] - want), bound) << "row " << m << " col " << n;
          ASSERT_EQ(got[m * N + n], alone[m][n]) << "row " << m << " col " << n;
        }
    }
  }
}

#else

TEST(CudaMatmul, Skipped) { GTEST_SKIP() << "kiln was built without CUDA: no cuBLASLt GEMM"; }

#endif  // KILN_CUDA

}  // namespace
}  // namespace kiln
