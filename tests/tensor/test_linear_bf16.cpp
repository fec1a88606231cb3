// bf16 Linear and embedding on the CPU (tensor/kernels_cpu_matmul_bf16.cpp, kernels_cpu_nn.cpp):
// decode's row counts run the bf16 GEMV on the weight in place (no f32 copy, nothing in
// Temporaries), larger ones the bf16 GEMM (oneDNN, or widened blocks), whose only allocation is
// its declared scratch, never an f32 copy of the weight; both match a float64 reference, and the
// dry run charges what the real run allocates.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/common/half.h"
#include "tensor/op_args.h"
#include "tensor/ops.h"
#include "tests/tensor/mem_measure.h"

namespace kiln::ops {
namespace {

using test::kTemps;

using test::measure;

struct SimulateCpu : MetaSimulatesScope {
  SimulateCpu() : MetaSimulatesScope(DeviceType::CPU) {}
};

std::vector<float> values(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return v;
}

// out = x w^T + bias in bf16 against float64 on the same bf16 values. Tolerance per element,
// S = sum_k |x_k w_k| + |bias|: K * 2^-24 * S for the f32 sums (GEMV, or the f32 kernel on
// widened copies) plus 2^-8 * |ref| for the bf16 rounding of out.
void check_linear(std::int64_t M, std::int64_t N, std::int64_t K, bool expect_in_place) {
  Tensor x = from_vector(values(M * K, 1), {1, M, K}).to(DType::BF16);
  Tensor w = from_vector(values(N * K, 2), {N, K}).to(DType::BF16);
  Tensor b = from_vector(values(N, 3), {N}).to(DType::BF16);
  Tensor out;
  const MemStats real = measure(Device::cpu(), [&] { out = linear(x, w, b); });
  ASSERT_EQ(out.dtype(), DType::BF16);
  ASSERT_EQ(out.shape(), (Shape{1, M, N}));
  const std::vector<float> xv = x.to_float_vector(), wv = w.to_float_vector(),
                           bv = b.to_float_vector(), got = out.to_float_vector();
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double ref = bv[n], mag = std::abs(ref);
      for (std::int64_t k = 0; k < K; ++k) {
        const double p = double(xv[m * K + k]) * double(wv[n * K + k]);
        ref += p;
        mag += std::abs(p);
      }
      const double tol = double(K + 2) * 0x1p-24 * mag + 0x1p-8 * std::abs(ref);
      ASSERT_NEAR(got[m * N + n], ref, tol) << "M " << M << " at [" << m << ", " << n << "]";
    }
  if (expect_in_place)
    EXPECT_EQ(real.peak[kTemps], 0) << "M " << M << ": the GEMV reads the bf16 weight in place";
  else  // out and at most the GEMM's scratch; f32 copies would add x, w, bias and out's buffer
    EXPECT_LE(real.num_allocs, 2) << "M " << M << ": the GEMM makes no f32 copies";

  SimulateCpu simulate;
  Tensor xm = Tensor::empty(x.shape(), DType::BF16, Device::meta());
  Tensor wm = Tensor::empty(w.shape(), DType::BF16, Device::meta());
  Tensor bm = Tensor::empty(b.shape(), DType::BF16, Device::meta());
  const MemStats dry = measure(Device::meta(), [&] { (void)linear(xm, wm, bm); });
  EXPECT_EQ(dry.peak[kTemps], real.peak[kTemps]) << "M " << M;
  EXPECT_EQ(dry.num_allocs, real.num_allocs) << "M " << M;
}

TEST(LinearBf16Cpu, DecodeRowsRunTheGemvOnTheWeightInPlace) {
  EXPECT_TRUE(has_native_kernel<LinearArgs>(Device::cpu(), DType::BF16));
  for (std::int64_t M : {1, 3, 4}) check_linear(M, 37, 77, /*expect_in_place=*/true);
}

TEST(LinearBf16Cpu, PrefillRowsRunTheGemmWithoutF32Copies) {
  for (std::int64_t M : {5, 17, 40}) check_linear(M, 37, 77, /*expect_in_place=*/false);
}

TEST(EmbeddingBf16Cpu, GathersRowsInPlaceBitExactly) {
  EXPECT_TRUE(has_native_kernel<EmbeddingArgs>(Device::cpu(), DType::BF16));
  const std::int64_t V = 50, C = 24;
  Tensor table = from_vector(values(V * C, 4), {V, C}).to(DType::BF16);
  Tensor ids = from_vector(std::vector<std::int32_t>{3, 0, 49, 3}, {1, 4});
  Tensor out;
  const MemStats real = measure(Device::cpu(), [&] { out = embedding(ids, table); });
  EXPECT_EQ(real.peak[kTemps], 0);
  ASSERT_EQ(out.dtype(), DType::BF16);
  ASSERT_EQ(out.shape(), (Shape{1, 4, C}));
  const bf16* t = table.data<bf16>();
  const bf16* o = out.data<bf16>();
  const int rows[] = {3, 0, 49, 3};
  for (int i = 0; i < 4; ++i)
    for (std::int64_t c = 0; c < C; ++c) EXPECT_EQ(o[i * C + c].bits, t[rows[i] * C + c].bits);
}

}  // namespace
}  // namespace kiln::ops
