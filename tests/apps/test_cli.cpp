// The kiln binary on bad input: a clear "error: [...]" message and exit code
// 1, never a crash; --help explains each subcommand.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cuda/runtime.h"
#include "models/generation_config.h"
#include "models/gguf_model.h"
#include "models/param_count.h"
#include "models/weights.h"
#include "tests/run_kiln.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  return kiln::test::fresh_temp_dir("kiln_test_cli_" + name);
}

}  // namespace

TEST(Cli, HelpDescribesSubcommands) {
  KilnRun r = run_kiln("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("train"), std::string::npos);
  EXPECT_NE(r.output.find("sample"), std::string::npos);
  KilnRun t = run_kiln("train --help");
  EXPECT_EQ(t.exit_code, 0);
  for (const char* opt :
       {"--data", "--tokenizer", "--preset", "--device", "--batch", "--seq", "--steps", "--lr",
        "--warmup", "--weight-decay", "--clip", "--eval-interval", "--out", "--resume", "--seed",
        "--dtype", "--attention", "--peak-tflops"})
    EXPECT_NE(t.output.find(opt), std::string::npos) << opt;
  KilnRun g = run_kiln("generate --help");
  EXPECT_EQ(g.exit_code, 0);
  EXPECT_NE(g.output.find("--attention"), std::string::npos);
  KilnRun b = run_kiln("budget --help");
  EXPECT_EQ(b.exit_code, 0);
  EXPECT_NE(b.output.find("--device"), std::string::npos);
}

TEST(Cli, MissingDataFileFails) {
  KilnRun r = run_kiln("train --data /nonexistent/file.txt");
  EXPECT_GT(r.exit_code, 0);
  EXPECT_NE(r.output.find("/nonexistent/file.txt"), std::string::npos) << r.output;
}

TEST(Cli, CorruptCheckpointFailsCleanly) {
  fs::path d = temp_dir("corrupt");
  std::ofstream(d / "bad.h5") << "this is not an HDF5 file at all";
  KilnRun r = run_kiln("sample --ckpt " + (d / "bad.h5").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: [checkpoint]"), std::string::npos) << r.output;
}

TEST(Cli, SequenceLongerThanContextFails) {
  fs::path d = temp_dir("seq");
  std::ofstream(d / "t.txt") << std::string(5000, 'a') + std::string(5000, 'b');
  KilnRun r = run_kiln("train --data " + (d / "t.txt").string() + " --seq 100000 --steps 1 --out " +
                       (d / "run").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("exceeds the model's context"), std::string::npos) << r.output;
}

TEST(Cli, UnknownPresetAndDeviceFail) {
  fs::path d = temp_dir("preset");
  std::ofstream(d / "t.txt") << std::string(5000, 'x') + "yz";
  KilnRun r = run_kiln("train --data " + (d / "t.txt").string() + " --preset nope --out " +
                       (d / "run").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("unknown preset 'nope'"), std::string::npos) << r.output;
  KilnRun c = run_kiln("train --data " + (d / "t.txt").string() + " --device tpu --out " +
                       (d / "run").string());
  EXPECT_EQ(c.exit_code, 1) << c.output;
  EXPECT_NE(c.output.find("unknown device 'tpu'"), std::string::npos) << c.output;
  KilnRun a = run_kiln("train --data " + (d / "t.txt").string() + " --attention flash --out " +
                       (d / "run").string());
  EXPECT_NE(a.exit_code, 0) << a.output;  // CLI11 rejects it before kiln runs
}

namespace {

// What a CUDA request says on a machine without one: the build's reason, and the way out.
void expect_no_cuda_error(const KilnRun& r, const std::string& who) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: [" + who + "] --device cuda"), std::string::npos) << r.output;
  if (kiln::cuda::compiled_with_cuda())
    EXPECT_NE(r.output.find("no CUDA device found"), std::string::npos) << r.output;
  else
    EXPECT_NE(r.output.find("built without CUDA"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("use --device cpu"), std::string::npos) << r.output;
}

}  // namespace

TEST(Cli, DeviceCudaWithoutAGpuFailsClearly) {
  if (kiln::cuda::device_count() > 0) {
    // Not skipped on a GPU machine: there an index past the last device is the clear error.
    fs::path d = temp_dir("cuda_index");
    std::ofstream(d / "t.txt") << std::string(5000, 'x') + "yz";
    KilnRun r = run_kiln("train --data " + (d / "t.txt").string() +
                         " --device cuda:" + std::to_string(kiln::cuda::device_count()) +
                         " --out " + (d / "run").string());
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("CUDA device(s) visible"), std::string::npos) << r.output;
    return;
  }
  fs::path d = temp_dir("no_cuda");
  std::ofstream(d / "t.txt") << std::string(5000, 'x') + "yz";
  expect_no_cuda_error(run_kiln("train --data " + (d / "t.txt").string() +
                                " --device cuda --steps 1 --out " + (d / "run").string()),
                       "train");
  std::ofstream(d / "config.json") << R"({"model_type": "qwen3", "vocab_size": 300,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 16})";
  expect_no_cuda_error(
      run_kiln("generate --random-weights --config " + (d / "config.json").string() +
               " --prompt-ids 1,2 --max-new-tokens 1 --device cuda"),
      "generate");
  expect_no_cuda_error(
      run_kiln("budget --model stories260K --mode train --seq 32 --measure --device cuda"),
      "budget");
  // Without --measure, --device cuda only makes the dry run simulate the CUDA allocator.
  KilnRun sim = run_kiln("budget --model stories260K --mode train --seq 32 --device cuda");
  EXPECT_EQ(sim.exit_code, 0) << sim.output;
  EXPECT_NE(sim.output.find("allocates like the CUDA allocator"), std::string::npos) << sim.output;
}

TEST(Cli, TrainPrintsThroughputAndMfu) {
  fs::path d = temp_dir("mfu");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog.\n";
  std::ofstream(d / "t.txt") << text;
  const std::string base = "train --device cpu --data " + (d / "t.txt").string() +
                           " --steps 2 --batch 2 --seq 16 --eval-interval 0 --eval-batches 1 "
                           "--progress 0 --log-interval 1 --out " +
                           (d / "run").string();
  // No GPU name to look the peak up by: MFU is not guessed.
  KilnRun r = run_kiln(base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tok/s | MFU n/a"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MFU n/a: unknown peak, pass --peak-tflops"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("6N + 12 L H Dh T"), std::string::npos) << r.output;
  // With a peak, a percentage per log line and in the summary.
  KilnRun p = run_kiln(base + " --peak-tflops 0.001 --overwrite");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(p.output.find("% of 0.001 TFLOP/s"), std::string::npos) << p.output;
  EXPECT_EQ(p.output.find("MFU n/a"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("memory (cpu), by category:"), std::string::npos) << p.output;
}

// The same commands on a GPU (skipped without one; gpu_check.sh fails on that skip there).
TEST(Cli, TrainGenerateBudgetOnCuda) {
  if (kiln::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: kiln --device cuda";
  fs::path d = temp_dir("cuda_run");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "to be or not to be, that is the question.\n";
  std::ofstream(d / "t.txt") << text;
  for (const char* dtype : {"bf16", "f32"}) {
    KilnRun r = run_kiln("train --device cuda --dtype " + std::string(dtype) + " --data " +
                         (d / "t.txt").string() +
                         " --steps 4 --batch 4 --seq 32 --eval-interval 2 --eval-batches 1 "
                         "--progress 0 --log-interval 1 --out " +
                         (d / ("run_" + std::string(dtype))).string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("cuda:0"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("step 4/4 | loss "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("| MFU "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("unattributed"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("runtime"), std::string::npos) << r.output;
    // The checkpoint is the usual f32 file: sample reads it on the CPU; resume continues.
    KilnRun s =
        run_kiln("sample --ckpt " + (d / ("run_" + std::string(dtype)) / "final.h5").string() +
                 " --prompt to --max-new-tokens 5 --temperature 0");
    EXPECT_EQ(s.exit_code, 0) << s.output;
  }
  KilnRun resume = run_kiln("train --device cuda --resume --data " + (d / "t.txt").string() +
                            " --steps 6 --batch 4 --seq 32 --eval-interval 0 --eval-batches 1 "
                            "--progress 0 --log-interval 1 --out " +
                            (d / "run_bf16").string());
  ASSERT_EQ(resume.exit_code, 0) << resume.output;
  EXPECT_NE(resume.output.find("resumed from"), std::string::npos) << resume.output;
  EXPECT_NE(resume.output.find("step 6/6"), std::string::npos) << resume.output;

  std::ofstream(d / "config.json") << R"({"model_type": "qwen3", "vocab_size": 300,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 64, "tie_word_embeddings": true})";
  for (const char* attn : {"kiln", "cudnn"}) {
    KilnRun g = run_kiln("generate --random-weights --config " + (d / "config.json").string() +
                         " --dtype bf16 --device cuda --attention " + attn +
                         " --prompt-ids 1,2,3,4 --max-new-tokens 8 --temperature 0");
    ASSERT_EQ(g.exit_code, 0) << attn << ": " << g.output;
    EXPECT_NE(g.output.find("decode"), std::string::npos) << g.output;
    EXPECT_NE(g.output.find("unattributed"), std::string::npos) << g.output;
  }

  KilnRun b = run_kiln(
      "budget --model stories260K --mode both --batch 2 --seq 64 --measure "
      "--device cuda --dtype bf16 --json",
      /*with_stderr=*/false);
  ASSERT_EQ(b.exit_code, 0) << b.output;  // 2 would mean measured != dry run
  auto j = nlohmann::json::parse(b.output);
  for (const auto& r : j) {
    EXPECT_EQ(r["simulate"], "cuda");
    EXPECT_EQ(r["measured"]["total_peak"], r["dry_run"]["total_peak"]) << r["mode"];
    const auto& dev = r["measured"]["device"];
    EXPECT_GT(dev["cuda_context"].get<std::int64_t>(), 0);
    EXPECT_GE(dev["kiln_reserved"].get<std::int64_t>(),
              r["measured"]["total_peak"].get<std::int64_t>());
    EXPECT_EQ(r["measured"]["at_peak"]["unattributed"], dev["unattributed"]);
  }
}

TEST(Cli, TrainThenSample) {
  fs::path d = temp_dir("train_sample");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "to be or not to be, that is the question.\n";
  std::ofstream(d / "t.txt") << text;
  KilnRun r = run_kiln("train --device cpu --data " + (d / "t.txt").string() +
                       " --steps 6 --batch 2 --seq 16 --eval-interval 3 --eval-batches 1 --out " +
                       (d / "run").string() + " --progress 0 --log-interval 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2/6 | loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("val loss"), std::string::npos);
  EXPECT_NE(r.output.find("optimizer state"), std::string::npos);  // the memory summary
  EXPECT_TRUE(fs::exists(d / "run" / "log.jsonl"));
  KilnRun s = run_kiln("sample --ckpt " + (d / "run" / "final.h5").string() +
                       " --prompt to --max-new-tokens 20 --temperature 0");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.output.rfind("to", 0), 0u) << s.output;
  EXPECT_GE(s.output.size(), 20u);
}

namespace {

// A tiny Qwen3 config.json (random weights need no safetensors).
fs::path tiny_qwen3(const std::string& name) {
  fs::path d = temp_dir(name);
  std::ofstream(d / "config.json") << R"({"model_type": "qwen3", "vocab_size": 300,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": true})";
  return d;
}

}  // namespace

// kiln quantize on a folder of bf16 weights loads them in bf16 (in place, not a float copy of
// the model) and widens each tensor only while quantizing it: the file is byte for byte the one
// quantized from the same weights loaded in f32.
TEST(Cli, QuantizeOfABf16FolderEqualsQuantizingItsF32Load) {
  fs::path d = tiny_qwen3("quantize_bf16");
  {
    kiln::models::DecoderModel m(kiln::models::resolve_model_config((d / "config.json").string()),
                                 5);
    kiln::models::save_safetensors(m, (d / "model.safetensors").string(), kiln::DType::BF16);
  }
  for (const char* type : {"q8_0", "q4_k_m"}) {
    SCOPED_TRACE(type);
    const fs::path got = d / (std::string(type) + "_cli.gguf");
    KilnRun q =
        run_kiln("quantize --model " + d.string() + " --type " + type + " --out " + got.string());
    ASSERT_EQ(q.exit_code, 0) << q.output;
    kiln::models::ModelSource src;
    src.model = d.string();
    src.dtype = kiln::DType::F32;
    src.tokenizer = "byte";
    const kiln::models::LoadedModel f32 = kiln::models::load_model(src);
    const fs::path want = d / (std::string(type) + "_f32.gguf");
    kiln::models::save_gguf_model(*f32.model, want.string(), kiln::models::parse_gguf_scheme(type));
    auto bytes = [](const fs::path& p) {
      std::ifstream f(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(f), {});
    };
    EXPECT_EQ(bytes(got), bytes(want));
  }
}

TEST(Cli, GenerateWithRandomWeightsPrintsSpeedsAndMemory) {
  fs::path d = tiny_qwen3("gen_ok");
  KilnRun r = run_kiln("generate --random-weights --config " + (d / "config.json").string() +
                       " --prompt-ids 1,2,3 --max-new-tokens 4 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("decode"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kv cache"), std::string::npos) << r.output;
}

TEST(Cli, GenerateRejectsOutOfRangeIdsAndLongPrompts) {
  fs::path d = tiny_qwen3("gen_bad");
  std::string base = "generate --random-weights --config " + (d / "config.json").string();
  KilnRun id = run_kiln(base + " --prompt-ids 1,2,300 --max-new-tokens 2");
  EXPECT_EQ(id.exit_code, 1) << id.output;
  EXPECT_NE(id.output.find("out of range"), std::string::npos) << id.output;
  std::string ids = "1";
  for (int i = 0; i < 20; ++i) ids += ",1";
  KilnRun longp = run_kiln(base + " --prompt-ids " + ids + " --max-new-tokens 2");
  EXPECT_EQ(longp.exit_code, 1) << longp.output;
  EXPECT_NE(longp.output.find("error:"), std::string::npos) << longp.output;
  KilnRun badcfg = run_kiln("generate --random-weights --config " + (d / "nope.json").string() +
                            " --prompt-ids 1");
  EXPECT_GT(badcfg.exit_code, 0) << badcfg.output;
}

// kiln quantize -> a Q8_0 GGUF that generate runs with its Linear weights quantized; bad
// requests are refused by name.
TEST(Cli, QuantizeWritesAQ8_0FileThatGenerateRuns) {
  fs::path d = tiny_qwen3("quantize");
  const std::string cfg = (d / "config.json").string(), out = (d / "m.gguf").string();
  KilnRun q = run_kiln("quantize --random-weights --config " + cfg + " --out " + out);
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_NE(q.output.find("q8_0"), std::string::npos) << q.output;
  KilnRun g = run_kiln("generate --model " + out +
                       " --tokenizer byte --prompt-ids 1,2,3 --max-new-tokens 3 --temperature 0");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  // 2 layers x 7 projections and the (tied) token embedding.
  EXPECT_NE(g.output.find("with 15 q8_0 weights"), std::string::npos) << g.output;
  KilnRun again = run_kiln("quantize --random-weights --config " + cfg + " --out " + out);
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_NE(again.output.find("exists; pass --force"), std::string::npos) << again.output;
  KilnRun k =
      run_kiln("quantize --random-weights --config " + cfg + " --type q4_k --force --out " + out);
  EXPECT_EQ(k.exit_code, 1) << k.output;
  EXPECT_NE(k.output.find("unknown quantization 'q4_k' (expected f32, q8_0 or q4_k_m)"),
            std::string::npos)
      << k.output;
  // Rows of 32 and 64 are not whole Q4_K blocks of 256: q4_k_m falls back to Q8_0 for them.
  KilnRun km =
      run_kiln("quantize --random-weights --config " + cfg + " --type q4_k_m --force --out " + out);
  ASSERT_EQ(km.exit_code, 0) << km.output;
  KilnRun gk = run_kiln("generate --model " + out +
                        " --tokenizer byte --prompt-ids 1,2 --max-new-tokens 2 --temperature 0");
  ASSERT_EQ(gk.exit_code, 0) << gk.output;
  EXPECT_NE(gk.output.find("with 15 q8_0 weights"), std::string::npos) << gk.output;
  // kiln budget reads the file's config and budgets its weights as the file stores them; the
  // dry run and the measured CPU run agree (exit 0), and --weights float overrides.
  KilnRun b = run_kiln("budget --model " + out + " --mode infer --seq 8 --decode 2 --measure");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("f32, weights q8_0 | batch 1"), std::string::npos) << b.output;
  KilnRun bf = run_kiln("budget --model " + out + " --mode infer --seq 8 --weights float");
  ASSERT_EQ(bf.exit_code, 0) << bf.output;
  EXPECT_EQ(bf.output.find("weights q8_0"), std::string::npos) << bf.output;
  KilnRun bt = run_kiln("budget --model " + out + " --mode train --weights q8_0");
  EXPECT_EQ(bt.exit_code, 1) << bt.output;
  EXPECT_NE(bt.output.find("quantized weights are for inference"), std::string::npos) << bt.output;
  KilnRun deq = run_kiln("generate --random-weights --config " + cfg +
                         " --dequantize --prompt-ids 1 --max-new-tokens 1");
  EXPECT_EQ(deq.exit_code, 1) << deq.output;
  EXPECT_NE(deq.output.find("--dequantize applies to a .gguf --model only"), std::string::npos)
      << deq.output;
}
