// ag::linear_cross_entropy (the LM head and the loss in chunks of rows, both gradients computed
// in forward) against the graph it replaces, ag::cross_entropy(ag::linear(h, w)): same loss,
// same d(loss)/dh and d(loss)/dW, for every chunking, with ignored rows, an upstream gradient
// other than 1 and a weight that also gets a gradient from elsewhere (a tied embedding).
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/ops.h"
#include "kernels/cuda/runtime.h"

using namespace kiln;

namespace {

struct LossAndGrads {
  double loss = 0;
  std::vector<double> dh, dw;
};

// loss = up * CE(h W^T, t) + sum(W) * 0.5: the second term gives W a gradient from outside the
// fused node, as a tied embedding table does. chunk_rows < 0: the unfused graph.
LossAndGrads run_lce(DType dt, std::int64_t chunk_rows, double up) {
  Generator gen(11);
  const std::int64_t N = 7, C = 5, V = 9;
  Tensor h = ops::randn({N, C}, gen).to(dt);
  Tensor w = ops::randn({V, C}, gen).to(dt);
  h.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor t = ops::from_vector(std::vector<std::int32_t>{0, 8, -100, 3, 3, -100, 5}, {N});
  Tensor ce = chunk_rows < 0 ? ag::cross_entropy(ag::linear(h, w), t, -100)
                             : ag::linear_cross_entropy(h, w, t, -100, chunk_rows);
  const double loss = ce.to(DType::F64).item();
  Tensor total = ag::add(ag::affine(ce, up), ag::affine(ag::sum_all(w), 0.5));
  backward(total);
  return {loss, h.grad().to_double_vector(), w.grad().to_double_vector()};
}

void expect_near_all(const std::vector<double>& a, const std::vector<double>& b, double tol,
                     const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], tol) << what << " [" << i << "]";
    norm += b[i] * b[i];
  }
  EXPECT_GT(norm, 0.0) << what << ": the reference gradient is all zeros";
}

}  // namespace

TEST(LinearCrossEntropy, EveryChunkingMatchesTheUnfusedGraph) {
  for (DType dt : {DType::F64, DType::F32}) {
    const double tol = dt == DType::F64 ? 1e-12 : 2e-6;
    for (double up : {1.0, 2.5}) {
      const LossAndGrads ref = run_lce(dt, -1, up);
      for (std::int64_t chunk : {0, 1, 2, 3, 6, 7, 100}) {
        SCOPED_TRACE(testing::Message()
                     << dtype_name(dt) << " chunk_rows " << chunk << " up " << up);
        const LossAndGrads got = run_lce(dt, chunk, up);
        EXPECT_NEAR(got.loss, ref.loss, tol * std::abs(ref.loss) + tol);
        expect_near_all(got.dh, ref.dh, tol, "dh");
        expect_near_all(got.dw, ref.dw, tol, "dw");
      }
    }
  }
}

TEST(LinearCrossEntropy, NoGradientRecordsNothing) {
  Generator gen(3);
  Tensor h = ops::randn({4, 3}, gen);
  Tensor w = ops::randn({6, 3}, gen);
  Tensor t = ops::from_vector(std::vector<std::int32_t>{0, 1, 2, 5}, {4});
  Tensor fused = ag::linear_cross_entropy(h, w, t, -100, 3);
  Tensor ref = ag::cross_entropy(ag::linear(h, w), t, -100);
  EXPECT_FALSE(fused.grad_fn());
  EXPECT_NEAR(fused.item(), ref.item(), 1e-6);
  EXPECT_GT(ref.item(), 0.0);
}

TEST(LinearCrossEntropy, EveryRowIgnoredGivesZeroLossAndGradients) {
  Generator gen(4);
  Tensor h = ops::randn({3, 2}, gen);
  Tensor w = ops::randn({4, 2}, gen);
  h.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor t = ops::from_vector(std::vector<std::int32_t>{-1, -1, -1}, {3});
  Tensor loss = ag::linear_cross_entropy(h, w, t, -1, 2);
  EXPECT_EQ(loss.item(), 0.0);
  backward(loss);
  for (double v : h.grad().to_double_vector()) EXPECT_EQ(v, 0.0);
  for (double v : w.grad().to_double_vector()) EXPECT_EQ(v, 0.0);
}

TEST(LinearCrossEntropy, RefusesMismatchedShapes) {
  Tensor h = ops::zeros({4, 3}, DType::F32, Device::cpu());
  Tensor w = ops::zeros({6, 2}, DType::F32, Device::cpu());
  Tensor t = ops::from_vector(std::vector<std::int32_t>{0, 1, 2, 5}, {4});
  EXPECT_THROW(ag::linear_cross_entropy(h, w, t, -100, 0), Error);
  Tensor w3 = ops::zeros({6, 3}, DType::F32, Device::cpu());
  Tensor t3 = ops::from_vector(std::vector<std::int32_t>{0, 1, 2}, {3});
  EXPECT_THROW(ag::linear_cross_entropy(h, w3, t3, -100, 0), Error);
  Tensor h0 = ops::zeros({0, 3}, DType::F32, Device::cpu());
  Tensor t0 = ops::zeros({0}, DType::I32, Device::cpu());
  EXPECT_THROW(ag::linear_cross_entropy(h0, w3, t0, -100, 0), Error);
}

// The fused op on CUDA (f32 and bf16, in row chunks: narrowed views through the GEMMs, the loss
// kernels and the copies) against the CPU's unfused graph in f64.
TEST(LinearCrossEntropy, CudaChunksMatchTheCpu) {
  if (cuda::device_count() == 0)
    GTEST_SKIP() << "no CUDA device: ag::linear_cross_entropy on CUDA is not checked";
  const std::int64_t N = 300, C = 40, V = 257;
  Generator gen(21);
  const Tensor h0 = ops::randn({N, C}, gen), w0 = ops::randn({V, C}, gen);
  std::vector<std::int32_t> tv(N);
  for (std::int64_t i = 0; i < N; ++i)
    tv[i] = i % 11 == 0 ? -100 : static_cast<std::int32_t>((i * 37) % V);
  const Tensor t = ops::from_vector(tv, {N});
  auto grads = [&](Device dev, DType dt, std::int64_t chunk) {
    Tensor h = h0.to(dt).to(dev), w = w0.to(dt).to(dev);
    h.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor tt = t.to(dev);
    Tensor loss = chunk < 0 ? ag::cross_entropy(ag::linear(h, w), tt, -100)
                            : ag::linear_cross_entropy(h, w, tt, -100, chunk);
    backward(loss);
    return LossAndGrads{loss.to(Device::cpu()).to(DType::F64).item(),
                        h.grad().to(Device::cpu()).to_double_vector(),
                        w.grad().to(Device::cpu()).to_double_vector()};
  };
  const LossAndGrads ref = grads(Device::cpu(), DType::F64, -1);
  for (DType dt : {DType::F32, DType::BF16}) {
    // bf16: inputs and outputs rounded to 8 bits of mantissa; f32: TF32-free cuBLASLt GEMMs.
    const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
    for (std::int64_t chunk : {0, 64, 7}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " chunk_rows " << chunk);
      const LossAndGrads got = grads(Device::cuda(0), dt, chunk);
      EXPECT_NEAR(got.loss, ref.loss, tol * std::abs(ref.loss));
      double err_h = 0, ref_h = 0, err_w = 0, ref_w = 0;
      for (std::size_t i = 0; i < ref.dh.size(); ++i)
        err_h += (got.dh[i] - ref.dh[i]) * (got.dh[i] - ref.dh[i]), ref_h += ref.dh[i] * ref.dh[i];
      for (std::size_t i = 0; i < ref.dw.size(); ++i)
        err_w += (got.dw[i] - ref.dw[i]) * (got.dw[i] - ref.dw[i]), ref_w += ref.dw[i] * ref.dw[i];
      // Normalized mean squared error of each gradient.
      EXPECT_LT(err_h / ref_h, tol * tol) << "dh";
      EXPECT_LT(err_w / ref_w, tol * tol) << "dw";
      EXPECT_GT(ref_h, 0.0);
    }
  }
}
