// Where the tests read the shared data files (tinyshakespeare, the Qwen configs and vocabulary,
// tokenizer vectors): $KILN_SHARED_DATA when set, else ../shared/data beside the source tree.
// scripts/get_data.sh and scripts/gpu_check.sh read the same variable, so a GPU machine (where
// the source path compiled in does not exist) points the tests at the bundle's data with it.
#pragma once

#include <cstdlib>
#include <string>

inline std::string test_shared_data() {
  const char* d = std::getenv("KILN_SHARED_DATA");
  return d && *d ? std::string(d) : std::string(KILN_SOURCE_DIR) + "/../shared/data";
}
