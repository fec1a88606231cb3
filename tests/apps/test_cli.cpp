// The kiln binary on bad input: a clear "error: [...]" message and exit code
// 1, never a crash; --help explains each subcommand.
#include <gtest/gtest.h>

#include "tests/run_kiln.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("kiln_test_cli_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(Cli, HelpDescribesSubcommands) {
  KilnRun r = run_kiln("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("train"), std::string::npos);
  EXPECT_NE(r.output.find("sample"), std::string::npos);
  KilnRun t = run_kiln("train --help");
  EXPECT_EQ(t.exit_code, 0);
  for (const char* opt : {"--data", "--tokenizer", "--preset", "--device", "--batch", "--seq",
                          "--steps", "--lr", "--warmup", "--weight-decay", "--clip",
                          "--eval-interval", "--out", "--resume", "--seed"})
    EXPECT_NE(t.output.find(opt), std::string::npos) << opt;
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
  KilnRun c = run_kiln("train --data " + (d / "t.txt").string() + " --device cuda --out " +
                      (d / "run").string());
  EXPECT_EQ(c.exit_code, 1) << c.output;
  EXPECT_NE(c.output.find("CUDA"), std::string::npos) << c.output;
}

TEST(Cli, TrainThenSample) {
  fs::path d = temp_dir("train_sample");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "to be or not to be, that is the question.\n";
  std::ofstream(d / "t.txt") << text;
  KilnRun r = run_kiln("train --data " + (d / "t.txt").string() +
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
