// Issue 13's examples through the kiln binary: each ends in "error: [...]" naming the file, field
// or flag and the value, with exit code 1, or in correct behaviour. Library-level tests of the
// same classes are in tests/models/test_hardening.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/run_kiln.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;

namespace {

fs::path harden_dir(const std::string& name) {
  return kiln::test::fresh_temp_dir("kiln_test_harden_" + name);
}

// A tiny Qwen3 config.json (HF names) with `extra` merged in.
fs::path write_config(const fs::path& d, const nlohmann::json& extra) {
  nlohmann::json j = {
      {"model_type", "qwen3"},    {"vocab_size", 300},      {"hidden_size", 32},
      {"intermediate_size", 64},  {"num_hidden_layers", 2}, {"num_attention_heads", 4},
      {"num_key_value_heads", 2}, {"head_dim", 8},          {"max_position_embeddings", 64},
      {"torch_dtype", "bfloat16"}};
  if (!extra.is_null()) j.merge_patch(extra);
  std::ofstream(d / "config.json") << j.dump();
  return d / "config.json";
}

// `kiln generate` with random weights for `cfg`; a timeout so that a hang fails instead of waits.
KilnRun generate(const fs::path& cfg, const std::string& more = "") {
  return run_kiln("generate --random-weights --config " + cfg.string() +
                  " --prompt-ids 1,2 --max-new-tokens 2 " + more);
}

fs::path text_file(const fs::path& d, std::size_t chars) {
  std::string s;
  while (s.size() < chars) s += "the quick brown fox jumps over the lazy dog. ";
  s.resize(chars);
  std::ofstream(d / "t.txt") << s;
  return d / "t.txt";
}

// A train command on a small text with a small model; `more` adds flags.
std::string train_args(const fs::path& d, const std::string& more) {
  const std::string steps = more.find("--steps") == std::string::npos ? " --steps 2" : "";
  return "train --data " + text_file(d, 20000).string() + steps +
         " --batch 2 --seq 16 --eval-batches 1 --progress 0 --out " + (d / "run").string() + " " +
         more;
}

#define EXPECT_REFUSED(run, ...)                                                   \
  do {                                                                             \
    const KilnRun& r_ = (run);                                                     \
    EXPECT_EQ(r_.exit_code, 1) << r_.output;                                       \
    EXPECT_NE(r_.output.find("error: "), std::string::npos) << r_.output;          \
    for (const std::string& s_ : std::vector<std::string>{__VA_ARGS__})            \
      EXPECT_NE(r_.output.find(s_), std::string::npos) << s_ << "\n" << r_.output; \
  } while (0)

}  // namespace

// ---- class 1 ------------------------------------------------------------------------------

TEST(HardeningCli, UnsupportedConfigFieldsRefusedByName) {
  fs::path d = harden_dir("fields");
  fs::path cfg = write_config(d, {{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}}});
  EXPECT_REFUSED(generate(cfg), cfg.string().c_str(), "rope_scaling", "\"yarn\"", "not supported");
  cfg = write_config(d, {{"use_sliding_window", true}, {"sliding_window", 32}});
  EXPECT_REFUSED(generate(cfg), "use_sliding_window true is not supported");
  cfg = write_config(d, {{"hidden_act", "relu"}});
  EXPECT_REFUSED(generate(cfg), "hidden_act \"relu\" is not supported");
  cfg = write_config(d, {{"quantization_config", {{"bits", 4}}}});
  EXPECT_REFUSED(generate(cfg), "field 'quantization_config' = {\"bits\":4}");
  cfg = write_config(d, {{"use_sliding_window", false}, {"max_window_layers", 2}});
  KilnRun ok = generate(cfg);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  KilnRun help = run_kiln("generate --help");
  EXPECT_NE(help.output.find("config.json fields"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("rope_scaling"), std::string::npos) << help.output;
}

// ---- classes 2, 3 and 6: flag values --------------------------------------------------------

TEST(HardeningCli, FloatFlagsHaveCheckedRanges) {
  fs::path d = harden_dir("floats");
  EXPECT_REFUSED(run_kiln(train_args(d, "--lr inf")), "--lr", "'inf' is not finite");
  EXPECT_REFUSED(run_kiln(train_args(d, "--beta2 nan")), "--beta2", "'nan' is not finite");
  EXPECT_REFUSED(run_kiln(train_args(d, "--weight-decay 1e30")), "--weight-decay",
                 "1e30 is out of range [0, 10]");
  EXPECT_REFUSED(run_kiln(train_args(d, "--lr 0")), "--lr", "0 is out of range (0, 10]");
  EXPECT_REFUSED(run_kiln(train_args(d, "--dtype f16")), "[train] --dtype f16",
                 "f16 training needs loss scaling");
  fs::path cfg = write_config(d, {});
  EXPECT_REFUSED(generate(cfg, "--temperature -1"), "--temperature", "-1 is out of range");
  EXPECT_REFUSED(generate(cfg, "--top-p 0"), "--top-p", "0 is out of range (0, 1]");
  EXPECT_REFUSED(generate(cfg, "--min-p 2"), "--min-p", "2 is out of range [0, 1]");
  EXPECT_FALSE(fs::exists(d / "run" / "ckpt.h5"));
}

TEST(HardeningCli, IntegerFlagsHaveCheckedRanges) {
  fs::path d = harden_dir("ints");
  EXPECT_REFUSED(run_kiln(train_args(d, "--log-interval 0")), "--log-interval",
                 "value 0 is out of range [1, ");
  EXPECT_REFUSED(run_kiln(train_args(d, "--batch 99999999999999999999")), "--batch",
                 "does not fit a 64-bit integer");
  EXPECT_REFUSED(run_kiln(train_args(d, "--seed -1")), "--seed", "'-1' is not an integer");
  EXPECT_REFUSED(run_kiln("params --model stories260K --layers 1e9"), "--layers",
                 "'1e9' is not an integer");
  EXPECT_REFUSED(run_kiln("params --model stories260K --layers 1000000000"), "--layers",
                 "1000000000 is out of range [1, 4096]");
  fs::path cfg = write_config(d, {});
  EXPECT_REFUSED(generate(cfg, "--max-new-tokens 99999999999999999999"), "--max-new-tokens",
                 "does not fit a 64-bit integer");
  // INT64_MAX is a valid request: generate until the context (64) is full, no overflow.
  KilnRun full = run_kiln("generate --random-weights --config " + cfg.string() +
                          " --prompt-ids 1,2 --max-new-tokens 9223372036854775807");
  EXPECT_EQ(full.exit_code, 0) << full.output;
  EXPECT_NE(full.output.find("62 new (stop: context full)"), std::string::npos) << full.output;
}

TEST(HardeningCli, ThreadsAreCappedWithAMessage) {
  fs::path d = harden_dir("threads");
  KilnRun r = run_kiln(train_args(d, "--threads 100000"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--threads 100000 capped at"), std::string::npos) << r.output;
}

// ---- class 4: regular files only ----------------------------------------------------------

TEST(HardeningCli, FifosAndDevicesRefusedWithoutBlocking) {
  fs::path d = harden_dir("fifo");
  fs::path fifo = d / "config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Before the fix this blocked forever in open(); now it is refused at once.
  KilnRun r = run_kiln("generate --random-weights --config " + fifo.string() + " --prompt-ids 1");
  EXPECT_REFUSED(r, fifo.string().c_str(), "is a FIFO, not a regular file");
  EXPECT_REFUSED(run_kiln("tokenize --tokenizer llama2c:" + fifo.string() + " --text hi"),
                 fifo.string().c_str(), "FIFO");
  EXPECT_REFUSED(run_kiln("train --data /dev/zero --steps 1 --out " + (d / "run").string()),
                 "[data] /dev/zero", "is a character device, not a regular file");
  EXPECT_REFUSED(run_kiln("tokenize --tokenizer byte --file /dev/zero"), "[tokenize] /dev/zero",
                 "is a character device, not a regular file");
}

// ---- class 5 -----------------------------------------------------------------------------

TEST(HardeningCli, HugeConfigsRefusedBeforeBuilding) {
  fs::path d = harden_dir("huge");
  fs::path cfg = write_config(d, {{"num_hidden_layers", 1000000000}});
  const std::string culprit = "num_hidden_layers) = 1000000000 is out of range [1, 4096]";
  EXPECT_REFUSED(generate(cfg), cfg.string().c_str(), culprit.c_str());
  EXPECT_REFUSED(run_kiln("params --model " + cfg.string()), culprit.c_str());
  EXPECT_REFUSED(run_kiln("budget --model " + cfg.string()), culprit.c_str());
  cfg = write_config(d, {{"max_position_embeddings", 100000000000}});
  EXPECT_REFUSED(generate(cfg), "max_position_embeddings) = 100000000000 is out of range");
  // Within the limits but beyond the machine: a typed out-of-memory naming the fields and file.
  cfg = write_config(d, {{"vocab_size", 16777216}, {"hidden_size", 131072}, {"head_dim", 128}});
  EXPECT_REFUSED(generate(cfg), "out of memory", "for weights", "allocated so far",
                 "vocab_size 16777216 x hidden_size 131072", cfg.string().c_str());
}

// ---- class 6 -----------------------------------------------------------------------------

TEST(HardeningCli, JsonErrorsNameFileAndField) {
  fs::path d = harden_dir("json");
  fs::path cfg = write_config(d, {{"num_hidden_layers", "two"}});
  KilnRun r = generate(cfg);
  EXPECT_REFUSED(r, (cfg.string() + ": num_hidden_layers must be an integer, got \"two\"").c_str());
  EXPECT_EQ(r.output.find("json.exception"), std::string::npos) << r.output;
  // A million nested arrays in a key nothing reads: refused while parsing, not SIGSEGV.
  std::string text = nlohmann::json::parse(std::ifstream(write_config(d, nullptr))).dump();
  text.insert(1, "\"unused\": " + std::string(1'000'000, '[') + std::string(1'000'000, ']') + ",");
  std::ofstream(cfg) << text;
  r = generate(cfg);
  EXPECT_REFUSED(r, ("[json] config file " + cfg.string() +
                     ": nested deeper than 64 levels of arrays and objects")
                        .c_str());
}

// ---- class 7 -----------------------------------------------------------------------------

TEST(HardeningCli, TooSmallValidationSplitRefusedBeforeStepOne) {
  fs::path d = harden_dir("valsplit");
  // 300 characters: the last 10% (30 tokens) cannot hold --seq 64 + 1.
  KilnRun r = run_kiln("train --data " + text_file(d, 300).string() +
                       " --seq 64 --batch 1 --steps 5 --out " + (d / "run").string());
  EXPECT_REFUSED(r, "the validation split (the last 10%) has 30 tokens, too few for --seq 64");
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
}

TEST(HardeningCli, FreshRunRefusesToReplaceACheckpointAndLogsWholeLines) {
  fs::path d = harden_dir("overwrite");
  KilnRun first = run_kiln(train_args(d, ""));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_TRUE(fs::exists(d / "run" / "ckpt.h5"));
  EXPECT_REFUSED(run_kiln(train_args(d, "--steps 3")), "already holds a checkpoint", "--resume",
                 "--overwrite");
  // A torn last line (a kill in the middle of a write) is cut on resume, never glued to.
  { std::ofstream(d / "run" / "log.jsonl", std::ios::app) << "{\"step\": 3, \"lo"; }
  KilnRun resumed = run_kiln(train_args(d, "--steps 4 --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  std::ifstream log(d / "run" / "log.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(log, line)) {
    EXPECT_NO_THROW(nlohmann::json::parse(line)) << line;
    ++n;
  }
  EXPECT_GE(n, 4);
  KilnRun again = run_kiln(train_args(d, "--overwrite"));
  EXPECT_EQ(again.exit_code, 0) << again.output;
}
