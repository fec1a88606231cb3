// The Linear weights one decode step of a model reads, in order (q, k, v, o, gate, up, down per
// layer, then the LM head): the shapes of the GEMV benchmarks (bench_gemv.cpp on the CPU,
// bench_gemv_cuda.cpp on the GPU).
#pragma once

#include <cstdint>
#include <vector>

#include "models/config.h"

namespace kiln::bench {

struct Shape2 {
  std::int64_t n, k;  // out_features, in_features
};

inline std::vector<Shape2> decode_weights(const models::ModelConfig& c) {
  const std::int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  std::vector<Shape2> w;
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    for (Shape2 s :
         {Shape2{q, c.dim}, Shape2{kv, c.dim}, Shape2{kv, c.dim}, Shape2{c.dim, q},
          Shape2{c.hidden_dim, c.dim}, Shape2{c.hidden_dim, c.dim}, Shape2{c.dim, c.hidden_dim}})
      w.push_back(s);
  }
  w.push_back({c.vocab_size, c.dim});
  return w;
}

}  // namespace kiln::bench
