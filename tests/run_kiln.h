// Runs the kiln binary from a test and captures what it prints.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

struct KilnRun {
  int exit_code = -1;  // -1: did not start, or killed by a signal
  std::string output;
};

inline std::string kiln_binary() { return std::string(KILN_BINARY_DIR) + "/apps/kiln"; }
inline bool have_kiln() { return std::filesystem::exists(kiln_binary()); }

// stdout (and stderr too, unless with_stderr is false, e.g. to parse --json).
inline KilnRun run_kiln(const std::string& args, bool with_stderr = true) {
  std::string cmd = kiln_binary() + " " + args + (with_stderr ? " 2>&1" : "");
  KilnRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}
