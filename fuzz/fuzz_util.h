// Shared helpers of the libFuzzer targets (docs/fuzzing.md).
//
// Most loaders take a path, and their file handling (mmap, ifstream, HDF5's own I/O) is part of
// what is fuzzed, so each input is written to a scratch file and loaded through the loader's
// public entry point. The scratch folder is under $KILN_FUZZ_SCRATCH (scripts/fuzz.sh points it at
// tmpfs, where a write costs a few microseconds), else /dev/shm, else the temp folder. A loader may
// refuse an input only with kiln::Error: any other exception escapes the target, and libFuzzer
// reports it as a crash (uncaught exception, abort).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/common/error.h"

namespace kiln::fuzz {

// A folder of this process's own: libFuzzer's -jobs/-workers run several processes at once.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const char* env = std::getenv("KILN_FUZZ_SCRATCH");
    fs::path base = env && *env                    ? fs::path(env)
                    : fs::is_directory("/dev/shm") ? fs::path("/dev/shm")
                                                   : fs::temp_directory_path();
    fs::path d = base / ("kiln_fuzz_" + std::to_string(getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/name and returns its path.
inline std::string write_file(const std::string& name, std::string_view bytes) {
  std::string path = scratch_dir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Cuts an input into up to `n` parts at NUL bytes (for loaders that read several files, e.g.
// vocab.json + merges.txt): none of the text formats involved has a NUL in a valid file, so the
// fuzzer can still reach every valid combination. Missing parts are empty.
inline std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t n) {
  std::string_view s(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    size_t z = s.find('\0');
    if (z == std::string_view::npos) break;
    parts.push_back(s.substr(0, z));
    s.remove_prefix(z + 1);
  }
  parts.push_back(s);
  parts.resize(n);
  return parts;
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `f`, accepting a clean refusal (kiln::Error) and nothing else.
template <typename F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const kiln::Error&) {
  }
}

}  // namespace kiln::fuzz
