// A fresh, empty directory under the system's temporary directory, for tests that write files.
#pragma once

#include <filesystem>
#include <string>

namespace kiln::test {

// <tmp>/<name>, emptied first: a rerun does not see the files of the run before.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace kiln::test
