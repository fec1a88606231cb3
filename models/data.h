// Token data for training: a tokenized text split into train (first 90%) and
// validation (last 10%) and a seeded, resumable batch sampler.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace kiln::models {

struct TokenSplit {
  std::vector<std::int32_t> train, val;
};
// The last `val_fraction` of the tokens are held out.
TokenSplit split_tokens(const std::vector<std::int32_t>& tokens, double val_fraction = 0.1);

std::string read_text_file(const std::string& path);

// Batch p, row b starts at a Philox-drawn offset (seed, counter p·B + b), so
// a run is reproducible and resumes exactly from `position`.
class BatchSampler {
 public:
  // With `rows` >= 0, next() returns only rows [row_begin, row_begin + rows) of each batch of
  // `batch` rows (one data-parallel rank's share of the global batch).
  BatchSampler(std::span<const std::int32_t> tokens, std::int64_t batch, std::int64_t seq,
               std::uint64_t seed, std::uint64_t position = 0, std::int64_t row_begin = 0,
               std::int64_t rows = -1);
  // ids and next-token targets, i32 (rows, T), charged to MemCategory::Inputs.
  std::pair<Tensor, Tensor> next();
  std::uint64_t position() const { return position_; }
  std::uint64_t seed() const { return seed_; }

 private:
  std::span<const std::int32_t> tokens_;
  std::int64_t batch_, seq_, row_begin_, rows_;
  std::uint64_t seed_, position_;
};

}  // namespace kiln::models
