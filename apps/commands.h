// Subcommands of the `kiln` binary. Each registers its options on the CLI11
// app and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kiln::apps {

using Run = std::function<int()>;
Run add_train_command(CLI::App& app);
Run add_sample_command(CLI::App& app);
Run add_tokenize_command(CLI::App& app);
Run add_params_command(CLI::App& app);
Run add_budget_command(CLI::App& app);
Run add_generate_command(CLI::App& app);
Run add_chat_command(CLI::App& app);
Run add_quantize_command(CLI::App& app);
Run add_serve_command(CLI::App& app);

}  // namespace kiln::apps
