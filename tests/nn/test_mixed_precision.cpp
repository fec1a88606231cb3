// bf16 parameters with f32 master weights: 2 + 2 + 4 + 4 + 4 bytes per
// parameter by category, and a loss curve that tracks the f32 run.
#include <gtest/gtest.h>

#include <cmath>

#include "models/decoder.h"
#include "nn/optim.h"

using namespace kiln;

namespace {

std::int64_t rounded(std::int64_t bytes) { return (bytes + 63) / 64 * 64; }

models::ModelConfig tiny() {
  models::ModelConfig c = models::preset("stories260K");
  c.max_seq_len = 32;
  return c;
}

std::vector<double> train_losses(DType dtype, int steps) {
  models::DecoderModel m(tiny(), 3, dtype);
  nn::AdamW opt(m.named_parameters(), {3e-3, 0.9, 0.95, 1e-8, 0.1});
  std::vector<std::int32_t> ids(4 * 16), tg(4 * 16);
  for (int i = 0; i < 64; ++i) ids[i] = (i * 37 + 11) % 512, tg[i] = (i * 37 + 48) % 512;
  Tensor x = ops::from_vector(ids, {4, 16}), y = ops::from_vector(tg, {4, 16});
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) {
    Tensor loss = m.loss(x, y);
    out.push_back(loss.item());
    backward(loss);
    opt.step();
    opt.zero_grad();
  }
  return out;
}

}  // namespace

TEST(MixedPrecision, BytesPerParameterByCategory) {
  auto& tr = MemoryTracker::get(DeviceType::CPU);
  MemStats before = tr.stats();
  {
    models::DecoderModel m(tiny(), 1, DType::BF16);
    nn::AdamW opt(m.named_parameters(), {});
    Tensor x = ops::from_vector(std::vector<std::int32_t>(8, 5), {1, 8});
    Tensor loss = m.loss(x, x);
    backward(loss);
    loss = Tensor();
    opt.step();
    std::int64_t w2 = 0, w4 = 0;
    for (auto& [n, p] : m.named_parameters()) {
      EXPECT_EQ(p.dtype(), DType::BF16) << n;
      EXPECT_EQ(p.grad().dtype(), DType::BF16) << n;
      w2 += rounded(p.numel() * 2);
      w4 += rounded(p.numel() * 4);
    }
    MemStats s = tr.stats();
    auto cur = [&](MemCategory c) {
      auto i = static_cast<std::size_t>(c);
      return s.current[i] - before.current[i];
    };
    EXPECT_EQ(cur(MemCategory::Weights), w2);
    EXPECT_EQ(cur(MemCategory::Gradients), w2);
    EXPECT_EQ(cur(MemCategory::MasterWeights), w4);
    EXPECT_EQ(cur(MemCategory::OptimizerState), 2 * w4);
    // The bf16 parameters are the master copies rounded to bf16.
    for (const auto& st : opt.state()) {
      ASSERT_TRUE(st.master.defined());
      EXPECT_EQ(st.param.to(DType::F32).to_float_vector(),
                st.master.to(DType::BF16).to(DType::F32).to_float_vector());
    }
  }
  EXPECT_EQ(tr.stats().total, before.total);  // everything freed
}

TEST(MixedPrecision, Bf16LossTracksF32) {
  auto f32 = train_losses(DType::F32, 30);
  auto b16 = train_losses(DType::BF16, 30);
  EXPECT_LT(b16.back(), b16.front() - 1.0);  // it learns
  // bf16 activations carry ~3 significant digits: the curves agree within 2%.
  for (std::size_t i = 0; i < f32.size(); ++i)
    EXPECT_NEAR(b16[i], f32[i], 0.02 * f32[i]) << "step " << i;
}
