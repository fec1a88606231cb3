// What the checkpoint probe (models/io/checkpoint_probe.h) costs next to the load it guards.
//
//   kiln_bench_checkpoint_probe CKPT [--reps N]
//
// For a checkpoint written by `kiln train`, times (median of --reps, file in the page cache):
//   probe: probe_checkpoint() alone (fork, the child reads every dataset and attribute, exit);
//   load:  what `kiln sample` does after it: read_checkpoint_meta, build the model, and
//          load_checkpoint with an AdamW optimizer (weights and both moments, as --resume does),
//          with the file already probed so that the load itself is not probed again.
// Prints one JSON line: {"bench":"checkpoint_probe","file_mb":...,"probe_ms":...,"load_ms":...}.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "models/checkpoint.h"
#include "models/io/checkpoint_probe.h"
#include "nn/optim.h"

using namespace kiln;

namespace {

using kiln::bench::median_ms;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint probe cost next to the load"};
  std::string path;
  int reps = 5;
  app.add_option("ckpt", path, "A checkpoint written by kiln train")->required();
  app.add_option("--reps", reps, "Repetitions (median)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  try {
    const double probe = median_ms(reps, [&] {
      io::forget_probed_checkpoints();
      io::probe_checkpoint(path);
    });
    io::probe_checkpoint(path);  // leave it probed: the loads below time the load alone
    const double load = median_ms(reps, [&] {
      models::CheckpointMeta meta = models::read_checkpoint_meta(path);
      models::DecoderModel model(meta.config, 0);
      nn::AdamW opt(model.named_parameters(), nn::AdamWOptions{});
      models::load_checkpoint(path, model, &opt);
    });
    nlohmann::json j = {{"bench", "checkpoint_probe"},
                        {"file_mb", std::filesystem::file_size(path) / 1048576.0},
                        {"reps", reps},
                        {"probe_ms", probe},
                        {"load_ms", load},
                        {"probe_over_load", probe / load}};
    std::printf("%s\n", j.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
