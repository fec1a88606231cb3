// SimulatedCuda: whole training steps and whole generations on the simulated CUDA device, in CPU
// CI, where no GPU exists.
//
// The simulated device is the meta device with set_meta_simulates(DeviceType::CUDA), the path
// `kiln budget --simulate cuda` takes: every tensor has its real shape, dtype and device, every
// allocation goes through the simulated CUDA caching allocator, every op asks the kernel table
// for its CUDA kernel (conversions and scratch included), and no kernel runs (values read as
// zeros). What these tests catch is host logic that only a GPU run used to reveal: a tensor left
// on the host and handed to a device op. The dispatcher refuses a tensor on another device than
// its op's, on every backend, with one message (tensor/kernel_table.h: check_devices), so a
// misplaced tensor fails here as it fails on CUDA.
//
// The first GPU run (H200, 2026-11-26) died on `kiln generate --device cuda` with "[embedding]
// tensors on different devices: cpu and cuda": GenerationSession built the prompt's ids on the
// host and never moved them. SimulatedCuda.GenerateKeepsEveryTensorOnTheDevice failed the same
// way before the fix ("cpu and meta").
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/generation_config.h"
#include "models/sampling.h"
#include "models/trainer.h"
#include "tensor/memory.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tests/error_of.h"
#include "tests/models/pseudo_text.h"
#include "tests/models/tiny_hf.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// The meta device simulates CUDA inside one scope (the allocator's rounding, the CUDA kernels'
// registrations), as `kiln budget --simulate cuda` does.
struct SimulateCuda : MetaSimulatesScope {
  SimulateCuda() : MetaSimulatesScope(DeviceType::CUDA) {}
};

}  // namespace

// Two optimizer steps of the real Trainer (batches moved to the device, forward, backward, loss
// read back, clipping, AdamW with f32 masters) with the model on the simulated CUDA device in
// bf16, as `kiln train --device cuda` runs them.
TEST(SimulatedCuda, TrainStepKeepsEveryTensorOnTheDevice) {
  SimulateCuda sim;
  const fs::path dir = fs::temp_directory_path() / "kiln_test_simulated_cuda_train";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "data.txt") << test::pseudo_text(20000, 7);
  models::TrainOptions o;
  o.device = "cuda";
  o.data_path = (dir / "data.txt").string();
  o.preset = "stories260K";
  o.tokenizer = "char";
  o.batch = 2;
  o.seq = 32;
  o.steps = 2;
  o.warmup = 1;
  o.eval_interval = 0;
  o.log_interval = 1000;
  o.out_dir = (dir / "run").string();
  o.progress = 0;
  std::ostringstream log;
  MemoryTracker& tracker = MemoryTracker::get(DeviceType::Meta);
  tracker.reset_peaks();
  models::Trainer t(o, Device::meta(), DType::BF16, log);
  for (int i = 1; i <= 2; ++i) {
    const models::StepStats s = t.step();
    EXPECT_EQ(s.step, i);
    EXPECT_FALSE(s.skipped) << "a zero loss and norm are finite: the step must update";
  }
  // The step charged the device's categories as a CUDA run does: weights (bf16 and the f32
  // masters), gradients and AdamW moments, activations at the peak.
  const MemStats m = tracker.stats();
  for (MemCategory c : {MemCategory::Weights, MemCategory::Gradients, MemCategory::OptimizerState,
                        MemCategory::Activations})
    EXPECT_GT(m.peak[static_cast<int>(c)], 0) << mem_category_name(c);
  fs::remove_all(dir);
}

// A whole generation (prefill, then decode token by token through the KV cache) with the model
// on the simulated CUDA device, as `kiln generate --device cuda` runs it.
TEST(SimulatedCuda, GenerateKeepsEveryTensorOnTheDevice) {
  SimulateCuda sim;
  for (DType dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    models::DecoderModel model(test_hf::tiny_qwen3(/*tied=*/false), 1, dt, Device::meta());
    ASSERT_TRUE(model.device().is_meta());
    models::GenerationSession session(model, 32);
    EXPECT_TRUE(session.cache().k.front().device().is_meta());
    models::GenerateOptions g;
    g.max_new_tokens = 5;
    g.sampling.temperature = 0;  // greedy
    std::vector<std::int32_t> seen;
    const std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
    const models::GenerationStats st = session.generate(prompt, g, [&](std::int32_t id) {
      seen.push_back(id);
      return true;
    });
    EXPECT_EQ(st.new_tokens, 5);
    EXPECT_EQ(seen.size(), 5u);
    // Prompt + 4 fed-back tokens are in the cache; the last sampled one is pending.
    EXPECT_EQ(session.cached(), 7 + 4);
  }
}

// `kiln generate --model <folder> --device cuda`'s load: the model is built on meta and every
// weight materialized on the device (a converted copy; only the CPU uses file bytes in place),
// the rope tables made there too, then a generation runs with every tensor on the device.
TEST(SimulatedCuda, LoadingAFolderPutsEveryWeightOnTheDevice) {
  const fs::path dir = fs::temp_directory_path() / "kiln_test_simulated_cuda_load";
  fs::remove_all(dir);
  {
    models::DecoderModel src(test_hf::tiny_qwen3(/*tied=*/false), 3, DType::F32, Device::cpu());
    test_hf::write_hf_folder(src, dir, nullptr, DType::BF16);
  }
  SimulateCuda sim;
  for (DType dt : {DType::BF16, DType::F32}) {  // bf16: the file's dtype; f32: converted
    SCOPED_TRACE(std::string(dtype_name(dt)));
    models::ModelSource s;
    s.model = dir.string();
    s.dtype = dt;
    s.device = Device::meta();  // the simulated CUDA device
    const models::LoadedModel l = models::load_model(s);
    for (const auto& [name, p] : l.model->named_parameters()) {
      EXPECT_TRUE(p.device().is_meta()) << name;
      EXPECT_FALSE(p.storage()->mapped()) << name << " is file bytes in place, not on the device";
      EXPECT_EQ(p.dtype(), dt) << name;
    }
    ASSERT_NE(l.model->rope, nullptr);
    models::GenerationSession session(*l.model, 16);
    models::GenerateOptions g;
    g.max_new_tokens = 3;
    g.sampling.temperature = 0;
    const std::vector<std::int32_t> prompt = {1, 2, 3};
    EXPECT_EQ(session.generate(prompt, g, [](std::int32_t) { return true; }).new_tokens, 3);
  }
  fs::remove_all(dir);
}

// The refusal these tests rely on: a host tensor handed to a device op fails by name, from the
// front end and from the dispatcher alike, on the simulated device as on CUDA.
TEST(SimulatedCuda, MixedDevicesAreRefusedAsOnCuda) {
  SimulateCuda sim;
  models::DecoderModel model(test_hf::tiny_qwen3(/*tied=*/true), 1, DType::BF16, Device::meta());
  const Tensor host_ids = ops::from_vector(std::vector<std::int32_t>{1, 2, 3}, {1, 3});
  {
    NoGradGuard no_grad;
    const std::string e = test::error_of([&] { (void)model.hidden(host_ids); });
    EXPECT_NE(e.find("tensors on different devices"), std::string::npos) << e;
    EXPECT_NE(e.find("cpu"), std::string::npos) << e;
    EXPECT_NE(e.find("meta"), std::string::npos) << e;
  }
  // An op whose front end does not compare devices: the dispatcher refuses it.
  const Tensor w = ops::zeros({8}, DType::BF16, Device::meta());
  const Tensor x = ops::zeros({2, 8}, DType::BF16);  // host
  const std::string e = test::error_of([&] { (void)ops::rmsnorm(x, w, 1e-6); });
  EXPECT_NE(e.find("[rmsnorm] tensors on different devices"), std::string::npos) << e;
}
