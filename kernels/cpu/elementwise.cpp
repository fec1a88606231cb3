// Elementwise kernels; see elementwise.h for the math.
// binary: dims of size 1 are dropped and neighbouring dims merged when both operands are
// contiguous across them, so "same shape, contiguous" becomes one flat loop, "b scalar" a flat
// loop with a constant, and "bias add" (rows, C) + (C) a row loop of contiguous runs. The inner
// run is specialised on its strides (1/1, 1/0, 0/1, general) so the common cases vectorize.
#include "kernels/cpu/elementwise.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/common/error.h"

namespace kiln::cpu {
namespace {

constexpr int kMaxDims = 16;
constexpr int64_t kParallelMin = 32768;
constexpr int64_t kChunk = 8192;

struct AddF {
  template <typename C>
  C operator()(C a, C b) const {
    return a + b;
  }
};
struct SubF {
  template <typename C>
  C operator()(C a, C b) const {
    return a - b;
  }
};
struct MulF {
  template <typename C>
  C operator()(C a, C b) const {
    return a * b;
  }
};
struct DivF {
  template <typename C>
  C operator()(C a, C b) const {
    return a / b;
  }
};
struct MaxF {  // NaN in either operand gives NaN
  template <typename C>
  C operator()(C a, C b) const {
    return (a != a || a > b) ? a : b;
  }
};
struct MinF {
  template <typename C>
  C operator()(C a, C b) const {
    return (a != a || a < b) ? a : b;
  }
};

// Elements are read in compute type and each result rounded once to T. 16-bit runs that are
// contiguous or broadcast go through f32 blocks (the vectorized conversions of bf16_util.h
// around the plain f32 loop).
constexpr int64_t kBlock = 512;

template <typename T, typename F>
inline void binary_run(int64_t n, const T* a, int64_t sa, const T* b, int64_t sb, T* out, F f) {
  if constexpr (is_half_v<T>) {
    if (sa <= 1 && sb <= 1) {
      float ab[kBlock], bb[kBlock], ob[kBlock];
      const float a0 = to_compute(a[0]), b0 = to_compute(b[0]);
      for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
        const int64_t len = std::min(kBlock, n - i0);
        const float* ap = sa == 1 ? widen(len, a + i0, ab) : &a0;
        const float* bp = sb == 1 ? widen(len, b + i0, bb) : &b0;
        binary_run(len, ap, sa, bp, sb, ob, f);
        narrow(len, ob, out + i0);
      }
      return;
    }
  }
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = from_compute<T>(f(to_compute(a[i]), to_compute(b[i])));
  } else if (sa == 1 && sb == 0) {
    const compute_t<T> bv = to_compute(b[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = from_compute<T>(f(to_compute(a[i]), bv));
  } else if (sa == 0 && sb == 1) {
    const compute_t<T> av = to_compute(a[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = from_compute<T>(f(av, to_compute(b[i])));
  } else {
    for (int64_t i = 0; i < n; ++i)
      out[i] = from_compute<T>(f(to_compute(a[i * sa]), to_compute(b[i * sb])));
  }
}

template <typename T, typename F>
void binary_impl(int ndim, const int64_t* shape, const T* a, const int64_t* a_strides, const T* b,
                 const int64_t* b_strides, T* out, F f) {
  int64_t sh[kMaxDims], sa[kMaxDims], sb[kMaxDims];
  int nd = 0;
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    KILN_CHECK(shape[d] >= 0, "[binary] negative size {} in dim {}", shape[d], d);
    KILN_CHECK(a_strides[d] >= 0 && b_strides[d] >= 0, "[binary] negative stride in dim {}", d);
    total *= shape[d];
    if (shape[d] == 1) continue;
    if (nd > 0 && sa[nd - 1] == a_strides[d] * shape[d] && sb[nd - 1] == b_strides[d] * shape[d]) {
      sh[nd - 1] *= shape[d];
      sa[nd - 1] = a_strides[d];
      sb[nd - 1] = b_strides[d];
    } else {
      sh[nd] = shape[d];
      sa[nd] = a_strides[d];
      sb[nd] = b_strides[d];
      ++nd;
    }
  }
  if (total == 0) return;
  if (nd == 0) {
    out[0] = from_compute<T>(f(to_compute(a[0]), to_compute(b[0])));
    return;
  }
  if (nd == 1) {
    const int64_t n = sh[0], s0 = sa[0], s1 = sb[0];
    const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
      binary_run(len, a + i0 * s0, s0, b + i0 * s1, s1, out + i0, f);
    }
    return;
  }
  const int64_t inner = sh[nd - 1], ia = sa[nd - 1], ib = sb[nd - 1];
  const int64_t rows = total / inner;
  if (nd == 2 && ia == 1 && ib == 1) {
    // (rows, C) with contiguous runs in both operands, e.g. bias add (rows, C) + (C): a plain
    // row loop, no per-row index arithmetic.
    const int64_t ra = sa[0], rb = sb[0];
#pragma omp parallel for schedule(static) if (total > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const T* ar = a + r * ra;
      const T* br = b + r * rb;
      T* orow = out + r * inner;
      binary_run(inner, ar, 1, br, 1, orow, f);
    }
    return;
  }
#pragma omp parallel if (total > kParallelMin)
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t r0 = rows * tid / nt, r1 = rows * (tid + 1) / nt;
    if (r0 < r1) {
      int64_t idx[kMaxDims];
      int64_t rem = r0, oa = 0, ob = 0;
      for (int d = nd - 2; d >= 0; --d) {
        idx[d] = rem % sh[d];
        rem /= sh[d];
        oa += idx[d] * sa[d];
        ob += idx[d] * sb[d];
      }
      for (int64_t r = r0; r < r1; ++r) {
        binary_run(inner, a + oa, ia, b + ob, ib, out + r * inner, f);
        for (int d = nd - 2; d >= 0; --d) {  // odometer step
          oa += sa[d];
          ob += sb[d];
          if (++idx[d] < sh[d]) break;
          oa -= sa[d] * sh[d];
          ob -= sb[d] * sh[d];
          idx[d] = 0;
        }
      }
    }
  }
}

// out[i] = f(x[i]) over n elements (f on compute_t<T>), in parallel for large n; 16-bit storage
// in f32 blocks, as binary_run.
template <typename T, typename F>
inline void map1(int64_t n, const T* x, T* out, F f) {
  if constexpr (is_half_v<T>) {
    const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t i0 = blk * kBlock, len = std::min(kBlock, n - i0);
      float xb[kBlock], ob[kBlock];
      const float* xp = widen(len, x + i0, xb);
      for (int64_t i = 0; i < len; ++i) ob[i] = f(xp[i]);
      narrow(len, ob, out + i0);
    }
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = f(x[i]);
  }
}

}  // namespace

template <typename T>
void binary(BinaryOp op, int ndim, const int64_t* out_shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out) {
  KILN_CHECK(ndim >= 0 && ndim <= kMaxDims, "[binary] ndim {} out of range [0, {}]", ndim,
             kMaxDims);
  switch (op) {
    case BinaryOp::Add:
      return binary_impl(ndim, out_shape, a, a_strides, b, b_strides, out, AddF{});
    case BinaryOp::Sub:
      return binary_impl(ndim, out_shape, a, a_strides, b, b_strides, out, SubF{});
    case BinaryOp::Mul:
      return binary_impl(ndim, out_shape, a, a_strides, b, b_strides, out, MulF{});
    case BinaryOp::Div:
      return binary_impl(ndim, out_shape, a, a_strides, b, b_strides, out, DivF{});
    case BinaryOp::Max:
      return binary_impl(ndim, out_shape, a, a_strides, b, b_strides, out, MaxF{});
    case BinaryOp::Min:
      return binary_impl(ndim, out_shape, a, a_strides, b, b_strides, out, MinF{});
  }
  fail("[binary] unknown op {}", static_cast<int>(op));
}

template <typename T>
void unary(UnaryOp op, int64_t n, const T* x, T* out) {
  KILN_CHECK(n >= 0, "[unary] negative size {}", n);
  using C = compute_t<T>;
  switch (op) {
    case UnaryOp::Neg:
      return map1(n, x, out, [](C v) { return -v; });
    case UnaryOp::Exp:
      return map1(n, x, out, [](C v) { return std::exp(v); });
    case UnaryOp::Log:
      return map1(n, x, out, [](C v) { return std::log(v); });
    case UnaryOp::Sqrt:
      return map1(n, x, out, [](C v) { return std::sqrt(v); });
    case UnaryOp::Rsqrt:
      return map1(n, x, out, [](C v) { return C(1) / std::sqrt(v); });
    case UnaryOp::Abs:
      return map1(n, x, out, [](C v) { return std::abs(v); });
    case UnaryOp::Square:
      return map1(n, x, out, [](C v) { return v * v; });
    case UnaryOp::Reciprocal:
      return map1(n, x, out, [](C v) { return C(1) / v; });
    case UnaryOp::Tanh:
      return map1(n, x, out, [](C v) { return std::tanh(v); });
    case UnaryOp::Sigmoid:
      return map1(n, x, out, [](C v) { return C(1) / (C(1) + std::exp(-v)); });
  }
  fail("[unary] unknown op {}", static_cast<int>(op));
}

template <typename T>
void scale_add(int64_t n, compute_t<T> alpha, const T* x, compute_t<T> beta, const T* y, T* out) {
  KILN_CHECK(n >= 0, "[scale_add] negative size {}", n);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    out[i] = from_compute<T>(alpha * to_compute(x[i]) + beta * to_compute(y[i]));
}

template <typename T>
void add_scalar(int64_t n, const T* x, compute_t<T> s, T* out) {
  KILN_CHECK(n >= 0, "[add_scalar] negative size {}", n);
  map1(n, x, out, [s](compute_t<T> v) { return v + s; });
}

template <typename T>
void mul_scalar(int64_t n, const T* x, compute_t<T> s, T* out) {
  KILN_CHECK(n >= 0, "[mul_scalar] negative size {}", n);
  map1(n, x, out, [s](compute_t<T> v) { return v * s; });
}

template <typename T>
void affine(int64_t n, const T* x, compute_t<T> alpha, compute_t<T> beta, T* out) {
  KILN_CHECK(n >= 0, "[affine] negative size {}", n);
  // beta == 0 adds nothing, so -0 results stay -0 (as mul_scalar alone).
  if (beta == compute_t<T>(0)) return mul_scalar(n, x, alpha, out);
  map1(n, x, out, [alpha, beta](compute_t<T> v) { return v * alpha + beta; });
}

template <typename T>
void axpy(int64_t n, compute_t<T> alpha, const T* x, T* y) {
  KILN_CHECK(n >= 0, "[axpy] negative size {}", n);
  if constexpr (is_half_v<T>) {  // f32 blocks, as map1
    const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t i0 = blk * kBlock, len = std::min(kBlock, n - i0);
      float xb[kBlock], yb[kBlock];
      const float* xp = widen(len, x + i0, xb);
      float* yp = yb;
      to_compute_n(len, y + i0, yp);
      for (int64_t i = 0; i < len; ++i) yp[i] += alpha * xp[i];
      narrow(len, yp, y + i0);
    }
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }
}

#define KILN_ELEMENTWISE_INST(T)                                                             \
  template void binary<T>(BinaryOp, int, const int64_t*, const T*, const int64_t*, const T*, \
                          const int64_t*, T*);                                               \
  template void unary<T>(UnaryOp, int64_t, const T*, T*);                                    \
  template void scale_add<T>(int64_t, compute_t<T>, const T*, compute_t<T>, const T*, T*);   \
  template void add_scalar<T>(int64_t, const T*, compute_t<T>, T*);                          \
  template void mul_scalar<T>(int64_t, const T*, compute_t<T>, T*);                          \
  template void affine<T>(int64_t, const T*, compute_t<T>, compute_t<T>, T*);                \
  template void axpy<T>(int64_t, compute_t<T>, const T*, T*);
KILN_ELEMENTWISE_INST(float)
KILN_ELEMENTWISE_INST(double)
KILN_ELEMENTWISE_INST(bf16)
KILN_ELEMENTWISE_INST(f16)
#undef KILN_ELEMENTWISE_INST

}  // namespace kiln::cpu
