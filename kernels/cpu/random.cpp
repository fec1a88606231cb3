// Philox random fills; see random.h and kernels/common/philox.h for the stream layout.
// Each iteration handles one Philox block (4 elements), so each block is computed once.
#include "kernels/cpu/random.h"

#include "kernels/common/error.h"
#include "kernels/common/philox.h"

namespace kiln::cpu {
namespace {
constexpr int64_t kParallelMin = 8192;
}

template <typename T>
void random_uniform(int64_t n, double lo, double hi, uint64_t seed, uint64_t offset, T* out) {
  KILN_CHECK(n >= 0, "[random_uniform] negative size {}", n);
  const T tlo = static_cast<T>(lo), span = static_cast<T>(hi - lo);
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox_block(seed, offset + static_cast<uint64_t>(b));
    const int64_t i0 = b * 4;
    for (int64_t k = 0; k < 4 && i0 + k < n; ++k)
      out[i0 + k] = tlo + span * static_cast<T>(uniform01(r.v[k]));
  }
}

template <typename T>
void random_normal(int64_t n, double mean, double std, uint64_t seed, uint64_t offset, T* out) {
  KILN_CHECK(n >= 0, "[random_normal] negative size {}", n);
  const T tmean = static_cast<T>(mean), tstd = static_cast<T>(std);
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox_block(seed, offset + static_cast<uint64_t>(b));
    float z[4];
    box_muller(r.v[0], r.v[1], z[0], z[1]);
    box_muller(r.v[2], r.v[3], z[2], z[3]);
    const int64_t i0 = b * 4;
    for (int64_t k = 0; k < 4 && i0 + k < n; ++k) out[i0 + k] = tmean + tstd * static_cast<T>(z[k]);
  }
}

template void random_uniform<float>(int64_t, double, double, uint64_t, uint64_t, float*);
template void random_uniform<double>(int64_t, double, double, uint64_t, uint64_t, double*);
template void random_normal<float>(int64_t, double, double, uint64_t, uint64_t, float*);
template void random_normal<double>(int64_t, double, double, uint64_t, uint64_t, double*);

}  // namespace kiln::cpu
