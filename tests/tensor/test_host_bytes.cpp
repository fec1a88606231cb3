// tensor/host_bytes.h: host bytes become a CPU tensor in place (no copy, counted as mapped) only
// when aligned for the dtype; any other device says no, so the loader copies; a reader writes
// straight into a dense host tensor of the right dtype and nothing else.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "tensor/host_bytes.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tests/error_of.h"

namespace kiln {
namespace {

TEST(HostBytes, AlignedBytesAreACpuTensorInPlace) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  const Tensor t = host_bytes_in_place(owner->data(), 24, {2, 3}, DType::F32, owner, Device::cpu(),
                                       MemCategory::Weights);
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.raw_data(), owner->data());  // the bytes themselves
  EXPECT_TRUE(t.storage()->mapped());
  EXPECT_EQ(t.storage()->category(), MemCategory::Weights);
  EXPECT_EQ(t.shape(), Shape({2, 3}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(HostBytes, OtherDevicesAndMisalignedBytesAreLeftToACopy) {
  auto owner = std::make_shared<std::vector<std::uint8_t>>(64, 0);
  const std::uint8_t* p = owner->data();
  EXPECT_FALSE(
      host_bytes_in_place(p, 16, {4}, DType::F32, owner, Device::meta(), MemCategory::Weights)
          .defined());
  EXPECT_FALSE(
      host_bytes_in_place(p + 2, 16, {4}, DType::F32, owner, Device::cpu(), MemCategory::Weights)
          .defined());
  EXPECT_TRUE(
      host_bytes_in_place(p + 1, 5, {5}, DType::Bool, owner, Device::cpu(), MemCategory::Weights)
          .defined());  // bytes need no alignment
  EXPECT_NE(test::error_of([&] {
              (void)host_bytes_in_place(p, 12, {4}, DType::F32, owner, Device::cpu(),
                                        MemCategory::Weights);
            }).find("[host_bytes] 12 bytes are not a f32 tensor of shape"),
            std::string::npos);
}

TEST(HostBytes, ReadersWriteOnlyIntoDenseHostTensorsOfTheirDtype) {
  Tensor dense = ops::zeros({2, 3});
  ASSERT_EQ(host_dense_data(dense, DType::F32), dense.raw_data());
  const float v[6] = {1, 2, 3, 4, 5, 6};
  std::memcpy(host_dense_data(dense, DType::F32), v, sizeof v);
  EXPECT_EQ(dense.to_float_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(host_dense_data(dense.transpose(0, 1), DType::F32), nullptr);
  EXPECT_EQ(host_dense_data(dense.to(DType::BF16), DType::F32), nullptr);
  EXPECT_EQ(host_dense_data(ops::zeros({2, 3}, DType::F32, Device::meta()), DType::F32), nullptr);
  EXPECT_EQ(host_dense_data(Tensor(), DType::F32), nullptr);
  auto owner = std::make_shared<std::vector<float>>(6, 0.0f);
  const Tensor mapped = host_bytes_in_place(owner->data(), 24, {2, 3}, DType::F32, owner,
                                            Device::cpu(), MemCategory::Weights);
  EXPECT_EQ(host_dense_data(mapped, DType::F32), nullptr) << "file bytes in place are read-only";
}

}  // namespace
}  // namespace kiln
