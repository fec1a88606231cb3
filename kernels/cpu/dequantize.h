// GGML Q8_0 blocks to floats in bulk, for prefill (tensor/kernels_cpu_quant.cpp dequantizes a
// slice of a weight on every call). Each weight is d q, exact in f32 (kernels/common/quant.h),
// then rounded once to T: the same bits as quant::q8_0_weight, at any ISA level.
//   Avx512 and above  f32 and bf16 out: 16 weights per instruction, i8 -> i32 -> f32, times d,
//                     stored (bf16: the integer rounding of bf16_util.h)
//   otherwise         plain loops (every level; f16 and f64 out)
#pragma once

#include <cstdint>

namespace kiln::cpu {

// T: float, bf16, f16 or double. out holds nblocks * 32 values.
template <typename T>
void dequantize_q8_0(const std::uint8_t* blocks, std::int64_t nblocks, T* out);

}  // namespace kiln::cpu
