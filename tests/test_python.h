// The Python that runs the reference scripts in tests/: $KILN_PYTHON when set,
// else Debian's /usr/bin/python3 (torch 1.13 from python3-torch). The GPU
// image keeps torch in a virtual environment of its own; gpu_check.sh sets it.
#pragma once

#include <cstdlib>
#include <string>

inline std::string test_python() {
  const char* p = std::getenv("KILN_PYTHON");
  return p && *p ? std::string(p) : std::string("/usr/bin/python3");
}
