// Where the tests read the shared data files (tinyshakespeare, the Qwen configs and vocabulary,
// tokenizer vectors): $KILN_SHARED_DATA when set, else ../shared/data beside the source tree,
// else data/ in it.
// scripts/get_data.sh and scripts/gpu_check.sh read the same variable, so a GPU machine (where
// the source path compiled in does not exist) points the tests at the bundle's data with it.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

// Without ../shared (a checkout of its own), the data/ that scripts/get_data.sh filled.
inline std::string test_shared_data() {
  const char* d = std::getenv("KILN_SHARED_DATA");
  if (d && *d) return d;
  const std::string shared = std::string(KILN_SOURCE_DIR) + "/../shared/data";
  if (std::filesystem::exists(shared)) return shared;
  return std::string(KILN_SOURCE_DIR) + "/data";
}
