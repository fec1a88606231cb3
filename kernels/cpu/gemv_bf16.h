// Matrix-vector products on bf16 (and f16) weights, for decode (a few rows of activations).
//
//   gemv_bf16:  y(M, N) = x(M, K) @ w(N, K)^T (+ bias(N))          (=, y is not read)
//
// w is the Linear weight layout (out_features x in_features), row-major with row stride ldw;
// x rows have stride ldx, y rows stride ldy. x is bf16 or f32, y (and bias) bf16 or f32.
// Products are summed in f32 and rounded once into y.
//
// Decode is bound by the bytes of w, so the kernel reads w exactly once from memory: a block of
// rows of w (16, 8 or kGemvRowBlock, as many as the accumulator registers allow for the rows of
// x) is used for every row of x before the next block is read (for more x rows than one
// register block holds, the w block is read again from L1/L2, not from memory).
// OpenMP threads take contiguous ranges of row blocks, so each thread streams its part of w in
// order. No scratch is allocated.
//
// Implementations, picked at run time by cpu_isa() (kernels/cpu/isa.h):
//   Avx512Bf16 (and Amx)  vdpbf16ps on pairs of bf16: x is used as bf16 (f32 x is rounded to
//                         bf16 in registers), 32 products per instruction and row.
//   Avx512                w widened to f32 by a 16-bit shift, f32 FMAs, 16 lanes.
//   Avx2                  the same on 8 lanes.
//   Scalar                plain loops.
// K need not be a multiple of the vector width (masked loads, or a scalar tail on AVX2), nor N
// of the row block.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"

namespace kiln::cpu {

// The shortest row block (rows of w one register block reads together).
inline constexpr int64_t kGemvRowBlock = 4;

// X and Y: bf16 or float. bias may be null.
template <typename X, typename Y>
void gemv_bf16(int64_t M, int64_t N, int64_t K, const X* x, int64_t ldx, const bf16* w, int64_t ldw,
               const Y* bias, Y* y, int64_t ldy);

// The same on f16 weights (an f16 safetensors model, used in place): widened by F16C's
// vcvtph2ps in registers at AVX2 and AVX-512 (AVX512-BF16 has no f16 dot product, so it takes the
// AVX-512 FMA blocks), so an f16 model decodes at its 2 bytes per weight, exactly, where a bf16
// copy would round away 3 bits of each weight and an f32 one would double the bytes. X and Y:
// f16 and f16, or float and float.
template <typename X, typename Y>
void gemv_f16(int64_t M, int64_t N, int64_t K, const X* x, int64_t ldx, const f16* w, int64_t ldw,
              const Y* bias, Y* y, int64_t ldy);

}  // namespace kiln::cpu
