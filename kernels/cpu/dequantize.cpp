#include "kernels/cpu/dequantize.h"

#include <type_traits>

#include "kernels/common/quant.h"
#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/isa.h"

#if KILN_CPU_X86
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

template <typename T>
void q8_0_scalar(const std::uint8_t* b, T* o) {
  const float d = quant::f16_at(b);
  for (int j = 0; j < 32; ++j)
    o[j] = from_compute<T>(d * static_cast<float>(static_cast<std::int8_t>(b[2 + j])));
}

#if KILN_CPU_X86
template <typename T>
KILN_TARGET_AVX512 void q8_0_avx512(const std::uint8_t* b, T* o) {
  const __m512 d = _mm512_set1_ps(quant::f16_at(b));
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  const __m512 lo =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d);
  const __m512 hi =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d);
  if constexpr (std::is_same_v<T, bf16>) {
    store_bf16x16(o, lo);
    store_bf16x16(o + 16, hi);
  } else {
    static_assert(std::is_same_v<T, float>);
    _mm512_storeu_ps(o, lo);
    _mm512_storeu_ps(o + 16, hi);
  }
}
#endif

}  // namespace

template <typename T>
void dequantize_q8_0(const std::uint8_t* blocks, std::int64_t nblocks, T* out) {
#if KILN_CPU_X86
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (cpu_has(CpuIsa::Avx512)) {
#pragma omp parallel for schedule(static) if (nblocks >= 1024)
      for (std::int64_t k = 0; k < nblocks; ++k) q8_0_avx512<T>(blocks + 34 * k, out + 32 * k);
      return;
    }
  }
#endif
#pragma omp parallel for schedule(static) if (nblocks >= 1024)
  for (std::int64_t k = 0; k < nblocks; ++k) q8_0_scalar<T>(blocks + 34 * k, out + 32 * k);
}

template void dequantize_q8_0<float>(const std::uint8_t*, std::int64_t, float*);
template void dequantize_q8_0<bf16>(const std::uint8_t*, std::int64_t, bf16*);
template void dequantize_q8_0<f16>(const std::uint8_t*, std::int64_t, f16*);
template void dequantize_q8_0<double>(const std::uint8_t*, std::int64_t, double*);

}  // namespace kiln::cpu
