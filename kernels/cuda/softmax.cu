// Softmax / log-softmax over rows (math in softmax.h). A group (one warp, or one block for rows
// wider than kWarpRowMax) owns a row; thread `lane` touches columns lane*V + k*size*V + [0, V).
// x, y, dy, dx: (rows, cols); inputs with a row stride, outputs dense.
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax.h"
#include "kernels/cuda/row_group.cuh"

namespace kiln::cuda {
namespace {

// One step of the online max/sum: s is sum(exp(x_i - m)) over the values seen so far.
// -inf values add nothing (and never form -inf - -inf); a NaN makes s NaN.
__device__ __forceinline__ void online_add(float v, float& m, float& s) {
  if (v > m) {
    s = s * expf(m - v) + 1.0f;
    m = v;
  } else if (v != -INFINITY) {
    s += expf(v - m);
  }
}

template <typename T, bool kWarp, int V, bool kLog>
__global__ void __launch_bounds__(1024)
    softmax_fwd_kernel(std::int64_t rows, std::int64_t cols, const T* x, std::int64_t xs, T* y) {
  const Group g = make_group<kWarp>();
  if (g.index >= rows) return;  // whole warps only (block mode: index < rows always)
  const T* xr = x + g.index * xs;
  T* yr = y + g.index * cols;
  const std::int64_t step = static_cast<std::int64_t>(g.size) * V;
  float m = -INFINITY, s = 0.f;
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < cols; c += step) {
    const Pack<T, V> xp = ldp<T, V>(xr + c);
#pragma unroll
    for (int e = 0; e < V; ++e) online_add(load(xp.v[e]), m, s);
  }
  const float row_max = group_max<kWarp>(m);
  // Rescale to the row max; a thread that saw only -inf (s == 0) adds 0, not 0 * exp(NaN).
  const float row_sum = group_sum<kWarp>(s == 0.f ? 0.f : s * expf(m - row_max));
  const float inv = 1.0f / row_sum, log_sum = logf(row_sum);
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < cols; c += step) {
    const Pack<T, V> xp = ldp<T, V>(xr + c);
    Pack<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = load(xp.v[e]) - row_max;
      o.v[e] = store<T>(kLog ? d - log_sum : expf(d) * inv);
    }
    stp<T, V>(yr + c, o);
  }
}

template <typename T, bool kWarp, int V, bool kLog>
__global__ void __launch_bounds__(1024)
    softmax_bwd_kernel(std::int64_t rows, std::int64_t cols, const T* y, std::int64_t ys,
                       const T* dy, std::int64_t dys, T* dx) {
  const Group g = make_group<kWarp>();
  if (g.index >= rows) return;
  const T* yr = y + g.index * ys;
  const T* dyr = dy + g.index * dys;
  T* dxr = dx + g.index * cols;
  const std::int64_t step = static_cast<std::int64_t>(g.size) * V;
  float s = 0.f;  // log: sum(dy); softmax: sum(dy * y)
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < cols; c += step) {
    const Pack<T, V> dp = ldp<T, V>(dyr + c);
    if constexpr (kLog) {
#pragma unroll
      for (int e = 0; e < V; ++e) s += load(dp.v[e]);
    } else {
      const Pack<T, V> yp = ldp<T, V>(yr + c);
#pragma unroll
      for (int e = 0; e < V; ++e) s += load(dp.v[e]) * load(yp.v[e]);
    }
  }
  s = group_sum<kWarp>(s);  // every read of the row happens before any write (dx may be dy)
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < cols; c += step) {
    const Pack<T, V> yp = ldp<T, V>(yr + c), dp = ldp<T, V>(dyr + c);
    Pack<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float yv = load(yp.v[e]), dv = load(dp.v[e]);
      o.v[e] = store<T>(kLog ? dv - expf(yv) * s : yv * (dv - s));
    }
    stp<T, V>(dxr + c, o);
  }
}

// Calls f(warp, V, log) as std::integral_constants for the launch shape.
template <typename T, typename F>
void with_shape(const RowLaunch& l, int vec, bool log, F&& f) {
  constexpr int P = 16 / sizeof(T);
  KILN_CHECK(l.blocks <= 0x7fffffffLL, "[softmax] {} blocks exceed the grid limit", l.blocks);
  auto pick_log = [&](auto warp, auto v) {
    if (log)
      f(warp, v, std::true_type{});
    else
      f(warp, v, std::false_type{});
  };
  auto pick_vec = [&](auto warp) {
    if (vec == P)
      pick_log(warp, std::integral_constant<int, P>{});
    else
      pick_log(warp, std::integral_constant<int, 1>{});
  };
  if (l.warp_per_row)
    pick_vec(std::true_type{});
  else
    pick_vec(std::false_type{});
}

}  // namespace

template <typename T>
void softmax_forward(std::int64_t rows, std::int64_t cols, const T* x, std::int64_t x_stride,
                     bool log, T* y, StreamHandle stream) {
  const char* op = log ? "log_softmax" : "softmax";
  KILN_CHECK(rows >= 0 && cols >= 0, "[{}] negative size ({}, {})", op, rows, cols);
  KILN_CHECK(x_stride >= cols, "[{}] row stride {} below cols {}", op, x_stride, cols);
  if (rows == 0 || cols == 0) return;
  const int vec = row_vec_width(sizeof(T), cols, {x, y}, {x_stride});
  const RowLaunch l = row_launch(rows, cols, vec);
  with_shape<T>(l, vec, log, [&](auto warp, auto v, auto lg) {
    softmax_fwd_kernel<T, decltype(warp)::value, decltype(v)::value, decltype(lg)::value>
        <<<static_cast<unsigned>(l.blocks), l.threads, 0, stream>>>(rows, cols, x, x_stride, y);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

template <typename T>
void softmax_backward(std::int64_t rows, std::int64_t cols, const T* y, std::int64_t y_stride,
                      const T* dy, std::int64_t dy_stride, bool log, T* dx, StreamHandle stream) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  KILN_CHECK(rows >= 0 && cols >= 0, "[{}] negative size ({}, {})", op, rows, cols);
  KILN_CHECK(y_stride >= cols && dy_stride >= cols, "[{}] row strides {} / {} below cols {}", op,
             y_stride, dy_stride, cols);
  if (rows == 0 || cols == 0) return;
  const int vec = row_vec_width(sizeof(T), cols, {y, dy, dx}, {y_stride, dy_stride});
  const RowLaunch l = row_launch(rows, cols, vec);
  with_shape<T>(l, vec, log, [&](auto warp, auto v, auto lg) {
    softmax_bwd_kernel<T, decltype(warp)::value, decltype(v)::value, decltype(lg)::value>
        <<<static_cast<unsigned>(l.blocks), l.threads, 0, stream>>>(rows, cols, y, y_stride, dy,
                                                                    dy_stride, dx);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

#define KILN_INSTANTIATE(T)                                                                       \
  template void softmax_forward<T>(std::int64_t, std::int64_t, const T*, std::int64_t, bool, T*,  \
                                   StreamHandle);                                                 \
  template void softmax_backward<T>(std::int64_t, std::int64_t, const T*, std::int64_t, const T*, \
                                    std::int64_t, bool, T*, StreamHandle);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(f16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
