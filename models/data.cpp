#include "models/data.h"

#include <fstream>
#include <sstream>

#include "kernels/common/philox.h"
#include "models/io/mapped_file.h"

namespace kiln::models {

TokenSplit split_tokens(const std::vector<std::int32_t>& tokens, double val_fraction) {
  KILN_CHECK(val_fraction >= 0 && val_fraction < 1, "[data] val fraction {} out of range",
             val_fraction);
  auto n_train =
      static_cast<std::size_t>(static_cast<double>(tokens.size()) * (1.0 - val_fraction));
  TokenSplit s;
  s.train.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n_train));
  s.val.assign(tokens.begin() + static_cast<std::ptrdiff_t>(n_train), tokens.end());
  return s;
}

std::string read_text_file(const std::string& path) {
  // A regular file only: --data /dev/zero or a FIFO is refused instead of read without end.
  return io::read_regular_file(path, "data");
}

BatchSampler::BatchSampler(std::span<const std::int32_t> tokens, std::int64_t batch,
                           std::int64_t seq, std::uint64_t seed, std::uint64_t position,
                           std::int64_t row_begin, std::int64_t rows)
    : tokens_(tokens),
      batch_(batch),
      seq_(seq),
      row_begin_(row_begin),
      rows_(rows < 0 ? batch : rows),
      seed_(seed),
      position_(position) {
  KILN_CHECK(batch > 0 && seq > 0, "[data] batch {} and seq {} must be positive", batch, seq);
  KILN_CHECK(row_begin_ >= 0 && rows_ > 0 && row_begin_ + rows_ <= batch,
             "[data] rows [{}, {}) are not inside a batch of {}", row_begin_, row_begin_ + rows_,
             batch);
  KILN_CHECK(static_cast<std::int64_t>(tokens.size()) > seq + 1,
             "[data] {} tokens are too few for sequences of {} (+1 for targets)", tokens.size(),
             seq);
}

std::pair<Tensor, Tensor> BatchSampler::next() {
  MemoryScope scope(MemCategory::Inputs);
  Tensor ids = Tensor::empty({rows_, seq_}, DType::I32);
  Tensor tgt = Tensor::empty({rows_, seq_}, DType::I32);
  auto* pi = ids.data<std::int32_t>();
  auto* pt = tgt.data<std::int32_t>();
  std::uint64_t span = tokens_.size() - static_cast<std::uint64_t>(seq_);  // valid starts [0, span)
  for (std::int64_t b = 0; b < rows_; ++b) {
    std::uint64_t ctr =
        position_ * static_cast<std::uint64_t>(batch_) + static_cast<std::uint64_t>(row_begin_ + b);
    Philox4 r = philox_block(seed_, ctr);
    std::uint64_t bits = (static_cast<std::uint64_t>(r.v[0]) << 32) | r.v[1];
    std::uint64_t start = bits % span;
    for (std::int64_t t = 0; t < seq_; ++t) {
      pi[b * seq_ + t] = tokens_[start + t];
      pt[b * seq_ + t] = tokens_[start + t + 1];
    }
  }
  position_++;
  return {ids, tgt};
}

}  // namespace kiln::models
