// Copy with dtype conversion, and fill.
//   copy_strided: dst[i] = convert(src[offset(i)])   (=, dst contiguous, row-major over shape)
//   fill:         dst[i] = value                      (=)
// Element types: float, double, bf16, f16, int32_t, int64_t, uint8_t (the bool dtype).
// Conversion rules: float <-> bf16/f16 round to nearest even (kernels/common/half.h); double to a
// 16-bit float goes through float. Floats to integers truncate toward zero (NaN/out-of-range is
// unspecified, as in C++/PyTorch). Anything to uint8_t is the bool dtype: x != 0 -> 1, else 0;
// uint8_t -> uint8_t copies bytes unchanged.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/half.h"

namespace kiln::cpu {

// src_strides are in elements (may be 0 for broadcast, must be >= 0); shape has ndim entries
// (ndim may be 0: a single element). Empty shapes copy nothing.
template <typename Src, typename Dst>
void copy_strided(int ndim, const int64_t* shape, const Src* src, const int64_t* src_strides,
                  Dst* dst);

template <typename T>
void fill(int64_t n, T value, T* dst);

// The conversion copy_strided applies to each element.
template <typename Dst, typename Src>
inline Dst convert_scalar(Src x) {
  if constexpr (std::is_same_v<Src, Dst>) {
    return x;
  } else if constexpr (std::is_same_v<Src, bf16>) {
    return convert_scalar<Dst>(bf16_to_float(x));
  } else if constexpr (std::is_same_v<Src, f16>) {
    return convert_scalar<Dst>(f16_to_float(x));
  } else if constexpr (std::is_same_v<Dst, bf16>) {
    return float_to_bf16(static_cast<float>(x));
  } else if constexpr (std::is_same_v<Dst, f16>) {
    return float_to_f16(static_cast<float>(x));
  } else if constexpr (std::is_same_v<Dst, uint8_t>) {
    return static_cast<uint8_t>(x != Src(0) ? 1 : 0);
  } else {
    return static_cast<Dst>(x);
  }
}

}  // namespace kiln::cpu
