// Deterministic pseudo-text for training tests: words drawn by a fixed LCG, a few dozen distinct
// characters, so a char tokenizer and a tiny model see the same data on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::test {

inline std::string pseudo_text(std::size_t n, std::uint32_t seed = 12345) {
  const std::string words[] = {"the ", "king ", "and ",   "queen ",
                               "of ",  "rome ", "said, ", "now.\n"};
  std::string s;
  std::uint32_t x = seed;
  while (s.size() < n) {
    x = x * 1664525u + 1013904223u;
    s += words[(x >> 16) % 8];
  }
  return s;
}

}  // namespace kiln::test
