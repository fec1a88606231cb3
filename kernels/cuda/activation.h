// Pointwise activations on CUDA: the activations of kernels/op_list.h (kActivations) and
// SwiGLU, with the math of kernels/common/activation_math.h (shared with the CPU kernels).
// All arrays are contiguous with n elements of T (float, bf16, f16); the math is f32. Every
// launcher writes (=) its outputs; an output may alias an input exactly (each element is read
// before it is written, by the same thread). When every pointer is 16-byte aligned the kernels
// move 16 bytes per access (4 floats or 8 bf16), with a scalar tail for n % pack elements.
//
// This header also holds the small host-side helpers the nn kernels share (pack width and
// alignment checks); it is plain C++, compiled by g++ too.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/runtime.h"
#include "kernels/op_list.h"

namespace kiln::cuda {

// ---- shared helpers (host and device) ---------------------------------------------------------

// Elements of a `elem_size`-byte type in one 16-byte access.
constexpr int pack_elems(int elem_size) {
  return elem_size > 0 && elem_size <= 16 ? 16 / elem_size : 1;
}

// N elements moved as one aligned access (N * sizeof(T) = 16 bytes for the vector paths).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// True when every non-null pointer is 16-byte aligned.
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Access width (elements per load/store) for a row kernel over (rows, cols) arrays whose rows
// start at ptr + r * stride: the 16-byte pack when cols, every row stride and every base
// pointer allow it, else 1. strides are in elements of `elem_size` bytes.
inline int row_vec_width(int elem_size, std::int64_t cols, std::initializer_list<const void*> ptrs,
                         std::initializer_list<std::int64_t> strides) {
  const int pack = pack_elems(elem_size);
  if (pack <= 1 || cols % pack != 0 || !aligned16(ptrs)) return 1;
  for (std::int64_t s : strides)
    if (s % pack != 0) return 1;
  return pack;
}

// ---- launchers ----------------------------------------------------------------------------------

// y = act(x) and dx = dy act'(x) for a pointwise activation op (kernels/op_list.h:
// kActivations; the math in kernels/common/activation_math.h).
template <typename T>
void activation_forward(Op op, std::int64_t n, const T* x, T* y, StreamHandle stream);
template <typename T>
void activation_backward(Op op, std::int64_t n, const T* x, const T* dy, T* dx,
                         StreamHandle stream);
template <typename T>
void silu_forward(std::int64_t n, const T* x, T* y, StreamHandle stream) {
  activation_forward(Op::Silu, n, x, y, stream);
}

template <typename T>
void swiglu_forward(std::int64_t n, const T* gate, const T* up, T* out, StreamHandle stream);
template <typename T>
void swiglu_backward(std::int64_t n, const T* gate, const T* up, const T* dout, T* dgate, T* dup,
                     StreamHandle stream);

}  // namespace kiln::cuda
