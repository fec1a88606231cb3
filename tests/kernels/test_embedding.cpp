// Tests for kernels/cpu/embedding.h: gather, deterministic scatter-add, id range checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/embedding.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

KILN_OP_TESTED(Op::Embedding);

template <typename T>
void check_embedding(int64_t n, int64_t vocab, int64_t dim, uint64_t seed) {
  const auto ids = test::random_int_vec<int32_t>(n, seed, 0, vocab);
  const auto table = test::random_uniform_vec<T>(vocab * dim, seed + 1);
  const auto dout = test::random_uniform_vec<T>(n * dim, seed + 2);
  std::vector<T> out(n * dim);
  cpu::embedding_forward<T>(n, vocab, dim, ids.data(), table.data(), out.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < dim; ++c) ASSERT_EQ(out[t * dim + c], table[ids[t] * dim + c]);
  // Backward accumulates into an existing gradient.
  auto dtable = test::random_uniform_vec<T>(vocab * dim, seed + 3);
  std::vector<double> ref = test::to_f64(dtable);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < dim; ++c) ref[ids[t] * dim + c] += dout[t * dim + c];
  cpu::embedding_backward<T>(n, vocab, dim, ids.data(), dout.data(), dtable.data());
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  EXPECT_TRUE(test::all_close(dtable, ref, tol, tol)) << n << " " << vocab << " " << dim;
}

TEST(Embedding, OddSizes) {
  uint64_t seed = 1;
  for (int64_t n : {1, 7, 129})
    for (int64_t vocab : {1, 7, 33})
      for (int64_t dim : {1, 7, 33, 129}) {
        check_embedding<float>(n, vocab, dim, seed += 4);
        check_embedding<double>(n, vocab, dim, seed += 4);
      }
  check_embedding<float>(3000, 256, 64, 5);  // parallel paths, many repeated ids
  check_embedding<float>(2000, 50, 300, 6);
}

TEST(Embedding, BackwardIsDeterministic) {
  const int64_t n = 4000, vocab = 10, dim = 96;
  const auto ids = test::random_int_vec<int32_t>(n, 1, 0, vocab);
  const auto dout = test::random_normal_vec<float>(n * dim, 2);
  std::vector<float> a(vocab * dim, 0.f), serial(vocab * dim, 0.f);
  cpu::embedding_backward<float>(n, vocab, dim, ids.data(), dout.data(), a.data());
  for (int64_t t = 0; t < n; ++t)  // the same float additions in token order
    for (int64_t c = 0; c < dim; ++c) serial[ids[t] * dim + c] += dout[t * dim + c];
  EXPECT_EQ(a, serial);
}

TEST(Embedding, OutOfRangeIdsFailWithoutWriting) {
  const std::vector<float> table(4 * 2, 1.f);
  for (int32_t bad : {4, -1, 70000}) {
    const std::vector<int32_t> ids = {0, bad, 1};
    std::vector<float> out(6, -7.f), dtable(8, 0.f);
    try {
      cpu::embedding_forward<float>(3, 4, 2, ids.data(), table.data(), out.data());
      FAIL() << "no error for id " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "[embedding] token id " + std::to_string(bad) + " out of range [0, 4)");
    }
    for (float v : out) EXPECT_EQ(v, -7.f);
    EXPECT_THROW(cpu::embedding_backward<float>(3, 4, 2, ids.data(), out.data(), dtable.data()),
                 Error);
    for (float v : dtable) EXPECT_EQ(v, 0.f);
  }
}

}  // namespace
}  // namespace kiln
