// kiln: one binary, subcommands.
#include <fmt/format.h>

#include <cstdio>
#include <map>

#include "apps/commands.h"
#include "distributed/communicator.h"
#include "kernels/common/error.h"
#include "kernels/cpu/isa.h"

#if KILN_CUDA
#define KILN_BUILD_KIND "CUDA + CPU"
#else
#define KILN_BUILD_KIND "CPU-only"
#endif

namespace {

int run_kiln(int argc, char** argv) {
  CLI::App app{"kiln: a from-scratch C++/CUDA tensor and autograd framework for small LLMs"};
  app.require_subcommand(1);
  // --version: what this binary was built with and what it will run on here.
  app.set_version_flag("--version", [] {
    std::string isa;
    try {
      isa = kiln::cpu::cpu_isa_summary();
    } catch (const kiln::Error& e) {  // a bad KILN_CPU_ISA
      isa = e.what();
    }
    return fmt::format("kiln ({} build)\ncpu isa: {}", KILN_BUILD_KIND, isa);
  });
  std::map<CLI::App*, kiln::apps::Run> runs;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    runs[sub] = adder(*sub);
  };
  add("train", "Train a decoder (LLaMA-style) on a text file", kiln::apps::add_train_command);
  add("sample", "Generate text from a training checkpoint", kiln::apps::add_sample_command);
  add("tokenize", "Text to token ids (or --decode ids to text)", kiln::apps::add_tokenize_command);
  add("params", "Per-component parameter counts, formula vs model", kiln::apps::add_params_command);
  add("budget", "Memory budget: analytic vs dry run vs measured, train and infer",
      kiln::apps::add_budget_command);
  add("generate", "Generate text from an HF folder, a llama2.c .bin or random weights",
      kiln::apps::add_generate_command);
  add("chat", "Multi-turn ChatML chat on stdin (Qwen3)", kiln::apps::add_chat_command);
  add("quantize",
      "An HF Qwen3/Qwen2 folder to a Q8_0 or Q4_K_M GGUF file (generate --model f.gguf)",
      kiln::apps::add_quantize_command);
  add("serve",
      "OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /health, "
      "/metrics, /tokenize, /detokenize) with continuous batching over a paged KV cache",
      kiln::apps::add_serve_command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // A bad command line is refused like any other bad input: "error: ..." and exit code 1.
    fmt::print(stderr, "error: [kiln] {}\nRun with --help for more information.\n", e.what());
    return 1;
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const kiln::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

// Under mpirun a failing rank ends the whole job (dist::finalize_world), so no peer waits for it.
int main(int argc, char** argv) { return kiln::dist::finalize_world(run_kiln(argc, argv)); }
