// A fresh, empty directory under the system's temporary directory, for tests that write files.
#pragma once

#include <filesystem>
#include <set>
#include <string>

namespace kiln::test {

// <tmp>/<name>, emptied first: a rerun does not see the files of the run before.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Removes dir (and what is in it) when the test binary exits, for folders named after the process
// (a pid), which no later run would reuse and empty.
inline void remove_at_exit(const std::filesystem::path& dir) {
  struct Folders {
    std::set<std::filesystem::path> dirs;
    ~Folders() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Folders made;
  made.dirs.insert(dir);
}

}  // namespace kiln::test
