#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/error.h"
#include "kernels/common/half.h"

namespace kiln::cpu {

void quantize_q8_0(const float* x, std::int64_t n, std::uint8_t* out) {
  KILN_CHECK(n % 32 == 0, "[quantize] {} weights are not whole q8_0 blocks of 32", n);
  for (std::int64_t i = 0; i < n; ++i)
    KILN_CHECK(std::isfinite(x[i]), "[quantize] weight {} is {}: q8_0 holds finite values only", i,
               x[i]);
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    std::uint8_t* o = out + 34 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const f16 h = float_to_f16(d);
    o[0] = static_cast<std::uint8_t>(h.bits & 0xff);
    o[1] = static_cast<std::uint8_t>(h.bits >> 8);
    for (int j = 0; j < 32; ++j)
      o[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::roundf(xb[j] * id)));
  }
}

}  // namespace kiln::cpu
