// Dropout (math and RNG contract in dropout.h). Work is split in Philox blocks of 4 elements,
// so each thread draws exactly the counters of its own elements.
#include "kernels/cpu/dropout.h"

#include <omp.h>

#include <algorithm>

#include "kernels/common/error.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/bf16_util.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements

void check_p(int64_t n, float p) {
  KILN_CHECK(n >= 0, "[dropout] negative size {}", n);
  KILN_CHECK(p >= 0.0f && p <= 1.0f, "[dropout] probability {} outside [0, 1]", p);
}

// 1 / (1 - p) as the GPU computes it (float), then in T; 0 when everything is dropped.
template <typename T>
compute_t<T> keep_scale(float p) {
  using C = compute_t<T>;
  return p >= 1.0f ? C(0) : C(1.0f / (1.0f - p));
}

}  // namespace

template <typename T>
void dropout_forward(int64_t n, float p, uint64_t seed, uint64_t offset, const T* x, T* y,
                     uint8_t* mask) {
  check_p(n, p);
  if (p == 0.0f) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      y[i] = x[i];
      if (mask) mask[i] = 1;
    }
    return;
  }
  KILN_CHECK(mask != nullptr, "[dropout] mask is required when p > 0");
  const compute_t<T> scale = keep_scale<T>(p);
  const int64_t nblocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const Philox4 r = philox_block(seed, offset + static_cast<uint64_t>(blk));
    const int64_t i0 = blk * 4;
    const int lanes = static_cast<int>(std::min<int64_t>(4, n - i0));
    for (int l = 0; l < lanes; ++l) {
      const bool keep = uniform01(r.v[l]) >= p;
      const int64_t i = i0 + l;
      mask[i] = keep ? 1 : 0;
      y[i] = from_compute<T>(keep ? to_compute(x[i]) * scale : compute_t<T>(0));
    }
  }
}

template <typename T>
void dropout_backward(int64_t n, float p, const uint8_t* mask, const T* dy, T* dx) {
  check_p(n, p);
  if (p == 0.0f) {
    if (dx != dy) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i];
    }
    return;
  }
  KILN_CHECK(mask != nullptr, "[dropout] mask is required when p > 0");
  const compute_t<T> scale = keep_scale<T>(p);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    dx[i] = from_compute<T>(mask[i] ? to_compute(dy[i]) * scale : compute_t<T>(0));
}

#define KILN_DROPOUT_INST(T)                                                                    \
  template void dropout_forward<T>(int64_t, float, uint64_t, uint64_t, const T*, T*, uint8_t*); \
  template void dropout_backward<T>(int64_t, float, const uint8_t*, const T*, T*);
KILN_DROPOUT_INST(float)
KILN_DROPOUT_INST(double)
KILN_DROPOUT_INST(bf16)
KILN_DROPOUT_INST(f16)
#undef KILN_DROPOUT_INST

}  // namespace kiln::cpu
