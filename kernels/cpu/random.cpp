// Philox random fills; see random.h and kernels/common/philox.h for the stream layout.
// Each iteration handles one Philox block (4 elements), so each block is computed once.
#include "kernels/cpu/random.h"

#include "kernels/common/error.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {
namespace {
constexpr int64_t kParallelMin = 8192;
}

template <typename T>
void random_uniform(int64_t n, double lo, double hi, uint64_t seed, uint64_t offset, T* out) {
  KILN_CHECK(n >= 0, "[random_uniform] negative size {}", n);
  using C = compute_t<T>;  // drawn in f32 for 16-bit storage, so every dtype sees the same numbers
  const C tlo = static_cast<C>(lo), span = static_cast<C>(hi - lo);
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox_block(seed, offset + static_cast<uint64_t>(b));
    const int64_t i0 = b * 4;
    for (int64_t k = 0; k < 4 && i0 + k < n; ++k)
      out[i0 + k] = from_compute<T>(tlo + span * static_cast<C>(uniform01(r.v[k])));
  }
}

template <typename T>
void random_normal(int64_t n, double mean, double std, uint64_t seed, uint64_t offset, T* out) {
  KILN_CHECK(n >= 0, "[random_normal] negative size {}", n);
  using C = compute_t<T>;
  const C tmean = static_cast<C>(mean), tstd = static_cast<C>(std);
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox_block(seed, offset + static_cast<uint64_t>(b));
    float z[4];
    box_muller(r.v[0], r.v[1], z[0], z[1]);
    box_muller(r.v[2], r.v[3], z[2], z[3]);
    const int64_t i0 = b * 4;
    for (int64_t k = 0; k < 4 && i0 + k < n; ++k)
      out[i0 + k] = from_compute<T>(tmean + tstd * static_cast<C>(z[k]));
  }
}

#define KILN_RANDOM_INST(T)                                                         \
  template void random_uniform<T>(int64_t, double, double, uint64_t, uint64_t, T*); \
  template void random_normal<T>(int64_t, double, double, uint64_t, uint64_t, T*);
KILN_RANDOM_INST(float)
KILN_RANDOM_INST(double)
KILN_RANDOM_INST(bf16)
KILN_RANDOM_INST(f16)
#undef KILN_RANDOM_INST

}  // namespace kiln::cpu
