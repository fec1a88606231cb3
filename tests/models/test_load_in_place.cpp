// Loading a Hugging Face folder for CPU inference (models::load_model): weights whose file dtype
// is the asked dtype are used in place in the safetensors mapping, not copied; the others are
// converted into CPU memory. The memory report tells mapped file pages from allocated bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "models/generation_config.h"
#include "tests/models/tiny_hf.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test_hf::tiny_qwen3;

constexpr auto kWeights = static_cast<std::size_t>(MemCategory::Weights);

// The address ranges at which this process maps `file` (from /proc/self/maps).
std::vector<std::pair<std::uintptr_t, std::uintptr_t>> mapped_ranges(const fs::path& file) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> out;
  std::ifstream maps("/proc/self/maps");
  const std::string want = fs::canonical(file).string();
  for (std::string line; std::getline(maps, line);) {
    if (line.size() < want.size() || line.compare(line.size() - want.size(), want.size(), want))
      continue;
    std::istringstream in(line);
    std::string range;
    in >> range;
    const auto dash = range.find('-');
    out.emplace_back(std::stoull(range.substr(0, dash), nullptr, 16),
                     std::stoull(range.substr(dash + 1), nullptr, 16));
  }
  return out;
}

class LoadInPlace : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_in_place_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  models::LoadedModel load(DType dt) {
    models::ModelSource s;
    s.model = dir_.string();
    s.dtype = dt;
    return models::load_model(s);
  }
  fs::path dir_;
};

TEST_F(LoadInPlace, Bf16WeightsOfABf16FolderAreUsedFromTheMapping) {
  models::DecoderModel ref(tiny_qwen3(/*tied=*/false), 11, DType::BF16);
  test_hf::init_weights(ref, 12);
  test_hf::write_hf_folder(ref, dir_, nullptr, DType::BF16);
  const std::vector<fs::path> shards = {dir_ / "model-00001-of-00002.safetensors",
                                        dir_ / "model-00002-of-00002.safetensors"};

  const MemStats before = MemoryTracker::get(DeviceType::CPU).stats();
  std::int64_t param_bytes = 0;
  {
    models::LoadedModel m = load(DType::BF16);
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
    for (const auto& s : shards)
      for (auto r : mapped_ranges(s)) ranges.push_back(r);
    ASSERT_FALSE(ranges.empty()) << "the shards are not mapped";
    for (const auto& [name, p] : m.model->named_parameters()) {
      ASSERT_TRUE(p.device().is_cpu()) << name;
      EXPECT_TRUE(p.storage()->mapped()) << name;
      const auto a = reinterpret_cast<std::uintptr_t>(p.raw_data());
      bool inside = false;
      for (auto [lo, hi] : ranges) inside |= a >= lo && a + p.nbytes() <= hi;
      EXPECT_TRUE(inside) << name << " at " << a << " is not inside a shard's mapping";
      param_bytes += static_cast<std::int64_t>(p.nbytes());
    }
    const MemStats st = MemoryTracker::get(DeviceType::CPU).stats();
    EXPECT_EQ(st.mapped[kWeights] - before.mapped[kWeights], param_bytes);
    EXPECT_EQ(st.current[kWeights], before.current[kWeights]) << "no weight bytes are allocated";
    const std::string report = format_memory_summary(st, "memory");
    EXPECT_NE(report.find("weights (mapped)"), std::string::npos) << report;

    // The same numbers as the model the folder was written from.
    Tensor ids = ops::from_vector(std::vector<std::int32_t>{1, 5, 7, 998}, {1, 4});
    NoGradGuard no_grad;
    EXPECT_EQ(m.model->forward(ids).to_float_vector(), ref.forward(ids).to_float_vector());
  }
  // The tensors are gone: so are their mapped bytes (and the mapping with the last of them).
  EXPECT_EQ(MemoryTracker::get(DeviceType::CPU).stats().mapped[kWeights], before.mapped[kWeights]);
  for (const auto& s : shards) EXPECT_TRUE(mapped_ranges(s).empty()) << s;
}

TEST_F(LoadInPlace, AnotherDtypeIsConvertedIntoAllocatedMemory) {
  models::DecoderModel ref(tiny_qwen3(/*tied=*/true), 11, DType::BF16);
  test_hf::init_weights(ref, 12);
  test_hf::write_hf_folder(ref, dir_, nullptr, DType::BF16);
  const MemStats before = MemoryTracker::get(DeviceType::CPU).stats();
  models::LoadedModel m = load(DType::F32);
  std::int64_t param_bytes = 0;
  for (const auto& [name, p] : m.model->named_parameters()) {
    EXPECT_FALSE(p.storage()->mapped()) << name;
    EXPECT_EQ(p.dtype(), DType::F32) << name;
    param_bytes += static_cast<std::int64_t>(p.nbytes());
  }
  const MemStats st = MemoryTracker::get(DeviceType::CPU).stats();
  EXPECT_EQ(st.mapped[kWeights], before.mapped[kWeights]);
  EXPECT_GE(st.current[kWeights] - before.current[kWeights], param_bytes);
  // bf16 -> f32 is exact: the loaded weights are the written ones.
  auto want = ref.named_parameters();
  for (const auto& [name, p] : m.model->named_parameters())
    for (const auto& [wname, w] : want)
      if (wname == name) EXPECT_EQ(p.to_float_vector(), w.to_float_vector()) << name;
}

}  // namespace
}  // namespace kiln
