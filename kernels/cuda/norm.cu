// RMSNorm and LayerNorm, forward and backward (math and layouts in norm.h).
//
// A "group" is one warp (dim <= kWarpRowMax; 4 warps per block, each on its own row or chunk)
// or one whole block (wider rows). Thread `lane` of a group touches the columns
// lane*V + k*size*V + [0, V) of every row, so in the backward it owns those columns of its
// chunk's partial row: read-modify-write without atomics, in row order, hence deterministic.
// Row statistics are f32 sums over the group (warp_sum / block_sum); x is read twice per row
// (the second read hits L1/L2), except LayerNorm forward which reads it three times (two-pass
// variance, as the CPU kernel, so rows with a large mean keep their precision).
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/row_group.cuh"

namespace kiln::cuda {
namespace {

// part[0, V) (=) or (+=) val[0, V). V is 1 or a multiple of 4; with V >= 4 `part` is 16-byte
// aligned (the launcher checks the base, dim % V == 0 keeps every row start aligned).
template <int V>
__device__ __forceinline__ void accumulate_partial(float* part, const float (&val)[V], bool first) {
  if constexpr (V == 1) {
    part[0] = first ? val[0] : part[0] + val[0];
  } else {
    static_assert(V % 4 == 0);
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      Pack<float, 4> p;
      if (first) {
#pragma unroll
        for (int e = 0; e < 4; ++e) p.v[e] = val[4 * q + e];
      } else {
        p = ldp<float, 4>(part + 4 * q);
#pragma unroll
        for (int e = 0; e < 4; ++e) p.v[e] += val[4 * q + e];
      }
      stp<float, 4>(part + 4 * q, p);
    }
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------------

// x: (rows, dim) row stride xs; w: (dim); y: (rows, dim) dense; rstd: (rows) f32.
// kAdd (add_rmsnorm): the row is s = x + res (res: row stride rs), rounded to T as add() stores
// it, written to s (rows, dim) dense, and normalized; the second pass adds again rather than read
// s back (ldp may take the read-only path, which does not see this kernel's writes).
template <typename T, bool kWarp, int V, bool kAdd>
__global__ void __launch_bounds__(1024)
    rmsnorm_fwd_kernel(std::int64_t rows, std::int64_t dim, float eps, const T* x, std::int64_t xs,
                       const T* res, std::int64_t rs, T* s, const T* w, T* y, float* rstd) {
  const Group g = make_group<kWarp>();
  if (g.index >= rows) return;  // whole warps only (block mode: index < rows always)
  const T* xr = x + g.index * xs;
  T* yr = y + g.index * dim;
  const auto row_pack = [&](std::int64_t c) {
    Pack<T, V> p = ldp<T, V>(xr + c);
    if constexpr (kAdd) {
      const Pack<T, V> rp = ldp<T, V>(res + g.index * rs + c);
#pragma unroll
      for (int e = 0; e < V; ++e) p.v[e] = store<T>(__fadd_rn(load(p.v[e]), load(rp.v[e])));
    }
    return p;
  };
  const std::int64_t step = static_cast<std::int64_t>(g.size) * V;
  float ss = 0.f;
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
    const Pack<T, V> xp = row_pack(c);
    if constexpr (kAdd) stp<T, V>(s + g.index * dim + c, xp);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float v = load(xp.v[e]);
      ss += v * v;
    }
  }
  ss = group_sum<kWarp>(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (g.lane == 0) rstd[g.index] = r;
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
    const Pack<T, V> xp = row_pack(c), wp = ldp<T, V>(w + c);
    Pack<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = store<T>(load(xp.v[e]) * r * load(wp.v[e]));
    stp<T, V>(yr + c, o);
  }
}

// Group `index` = chunk: rows [index * per, min(rows, (index + 1) * per)).
// dx: (rows, dim) dense; part: (nchunks, dim) f32 or null.
template <typename T, bool kWarp, int V>
__global__ void __launch_bounds__(1024)
    rmsnorm_bwd_kernel(std::int64_t rows, std::int64_t dim, std::int64_t nchunks, std::int64_t per,
                       const T* x, std::int64_t xs, const T* w, const float* rstd, const T* dy,
                       std::int64_t dys, T* dx, float* part) {
  const Group g = make_group<kWarp>();
  if (g.index >= nchunks) return;
  const std::int64_t r0 = g.index * per;
  const std::int64_t r1 = r0 + per < rows ? r0 + per : rows;
  float* pr = part ? part + g.index * dim : nullptr;
  const std::int64_t step = static_cast<std::int64_t>(g.size) * V;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  for (std::int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * xs;
    const T* dyr = dy + r * dys;
    T* dxr = dx + r * dim;
    const float rs = rstd[r];
    float dot = 0.f;
    for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
      const Pack<T, V> xp = ldp<T, V>(xr + c), dp = ldp<T, V>(dyr + c), wp = ldp<T, V>(w + c);
#pragma unroll
      for (int e = 0; e < V; ++e) dot += load(wp.v[e]) * load(dp.v[e]) * load(xp.v[e]);
    }
    dot = group_sum<kWarp>(dot);  // also orders every read of this row before the writes
    const float coef = rs * rs * rs * dot * inv_dim;
    for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
      const Pack<T, V> xp = ldp<T, V>(xr + c), dp = ldp<T, V>(dyr + c), wp = ldp<T, V>(w + c);
      Pack<T, V> o;
      float contrib[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xj = load(xp.v[e]), dyj = load(dp.v[e]);
        contrib[e] = dyj * xj * rs;
        o.v[e] = store<T>(rs * load(wp.v[e]) * dyj - xj * coef);
      }
      stp<T, V>(dxr + c, o);
      if (pr) accumulate_partial<V>(pr + c, contrib, r == r0);
    }
  }
}

// The register path (norm_register_packs): one warp per chunk, K accesses of V elements per lane
// at columns lane*V + k*32*V. Same sums in the same order as rmsnorm_bwd_kernel: each lane's dot
// over its columns in column order then the warp sum, and each column's partial over the chunk's
// rows in row order (held in acc, stored once).
template <typename T, int V, int K>
__global__ void __launch_bounds__(128)
    rmsnorm_bwd_reg_kernel(std::int64_t rows, std::int64_t dim, std::int64_t nchunks,
                           std::int64_t per, const T* x, std::int64_t xs, const T* w,
                           const float* rstd, const T* dy, std::int64_t dys, T* dx, float* part) {
  const Group g = make_group<true>();
  if (g.index >= nchunks) return;
  const std::int64_t r0 = g.index * per;
  const std::int64_t r1 = r0 + per < rows ? r0 + per : rows;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  bool live[K];
  float wv[K][V], acc[K][V];
  Pack<T, V> xn[K], dn[K];  // the next row's x and dy, loaded a row ahead
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const std::int64_t c = static_cast<std::int64_t>(g.lane) * V + k * 32 * V;
    live[k] = c < dim;
    if (live[k]) {
      const Pack<T, V> wp = ldp<T, V>(w + c);
#pragma unroll
      for (int e = 0; e < V; ++e) wv[k][e] = load(wp.v[e]);
      xn[k] = ldp<T, V>(x + r0 * xs + c);
      dn[k] = ldp<T, V>(dy + r0 * dys + c);
    }
  }
  float rs_next = rstd[r0];
  for (std::int64_t r = r0; r < r1; ++r) {
    Pack<T, V> xc[K], dc[K];
    const float rs = rs_next;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      xc[k] = xn[k];
      dc[k] = dn[k];
    }
    if (r + 1 < r1) {
      rs_next = rstd[r + 1];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const std::int64_t c = static_cast<std::int64_t>(g.lane) * V + k * 32 * V;
        if (live[k]) {
          xn[k] = ldp<T, V>(x + (r + 1) * xs + c);
          dn[k] = ldp<T, V>(dy + (r + 1) * dys + c);
        }
      }
    }
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (live[k])
#pragma unroll
        for (int e = 0; e < V; ++e) dot += wv[k][e] * load(dc[k].v[e]) * load(xc[k].v[e]);
    dot = warp_sum(dot);
    const float coef = rs * rs * rs * dot * inv_dim;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live[k]) continue;
      const std::int64_t c = static_cast<std::int64_t>(g.lane) * V + k * 32 * V;
      Pack<T, V> o;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xj = load(xc[k].v[e]), dyj = load(dc[k].v[e]);
        const float contrib = dyj * xj * rs;
        acc[k][e] = r == r0 ? contrib : acc[k][e] + contrib;
        o.v[e] = store<T>(rs * wv[k][e] * dyj - xj * coef);
      }
      stp<T, V>(dx + r * dim + c, o);
    }
  }
  if (!part) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!live[k]) continue;
    const std::int64_t c = static_cast<std::int64_t>(g.lane) * V + k * 32 * V;
    accumulate_partial<V>(part + g.index * dim + c, acc[k], true);
  }
}

// ---- LayerNorm --------------------------------------------------------------------------------

template <typename T, bool kWarp, int V>
__global__ void __launch_bounds__(1024)
    layernorm_fwd_kernel(std::int64_t rows, std::int64_t dim, float eps, const T* x,
                         std::int64_t xs, const T* w, const T* b, T* y, float* mean, float* rstd) {
  const Group g = make_group<kWarp>();
  if (g.index >= rows) return;
  const T* xr = x + g.index * xs;
  T* yr = y + g.index * dim;
  const std::int64_t step = static_cast<std::int64_t>(g.size) * V;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  float s = 0.f;
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
    const Pack<T, V> xp = ldp<T, V>(xr + c);
#pragma unroll
    for (int e = 0; e < V; ++e) s += load(xp.v[e]);
  }
  const float mu = group_sum<kWarp>(s) * inv_dim;
  float ss = 0.f;
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
    const Pack<T, V> xp = ldp<T, V>(xr + c);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = load(xp.v[e]) - mu;
      ss += d * d;
    }
  }
  ss = group_sum<kWarp>(ss);
  const float r = 1.0f / sqrtf(ss * inv_dim + eps);
  if (g.lane == 0) {
    mean[g.index] = mu;
    rstd[g.index] = r;
  }
  for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
    const Pack<T, V> xp = ldp<T, V>(xr + c), wp = ldp<T, V>(w + c);
    Pack<T, V> bp;
    if (b) bp = ldp<T, V>(b + c);
    Pack<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float v = (load(xp.v[e]) - mu) * r * load(wp.v[e]);
      if (b) v += load(bp.v[e]);
      o.v[e] = store<T>(v);
    }
    stp<T, V>(yr + c, o);
  }
}

template <typename T, bool kWarp, int V>
__global__ void __launch_bounds__(1024)
    layernorm_bwd_kernel(std::int64_t rows, std::int64_t dim, std::int64_t nchunks,
                         std::int64_t per, const T* x, std::int64_t xs, const T* w,
                         const float* mean, const float* rstd, const T* dy, std::int64_t dys, T* dx,
                         float* part_w, float* part_b) {
  const Group g = make_group<kWarp>();
  if (g.index >= nchunks) return;
  const std::int64_t r0 = g.index * per;
  const std::int64_t r1 = r0 + per < rows ? r0 + per : rows;
  float* pw = part_w ? part_w + g.index * dim : nullptr;
  float* pb = part_b ? part_b + g.index * dim : nullptr;
  const std::int64_t step = static_cast<std::int64_t>(g.size) * V;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  for (std::int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * xs;
    const T* dyr = dy + r * dys;
    T* dxr = dx + r * dim;
    const float m = mean[r], rs = rstd[r];
    float sg = 0.f, sgx = 0.f;  // sum_j g_j, sum_j g_j xhat_j with g = w dy
    for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
      const Pack<T, V> xp = ldp<T, V>(xr + c), dp = ldp<T, V>(dyr + c), wp = ldp<T, V>(w + c);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float gj = load(wp.v[e]) * load(dp.v[e]);
        sg += gj;
        sgx += gj * (load(xp.v[e]) - m) * rs;
      }
    }
    const float mg = group_sum<kWarp>(sg) * inv_dim;
    const float mgx = group_sum<kWarp>(sgx) * inv_dim;
    for (std::int64_t c = static_cast<std::int64_t>(g.lane) * V; c < dim; c += step) {
      const Pack<T, V> xp = ldp<T, V>(xr + c), dp = ldp<T, V>(dyr + c), wp = ldp<T, V>(w + c);
      Pack<T, V> o;
      float cw[V], cb[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xhat = (load(xp.v[e]) - m) * rs, dyj = load(dp.v[e]);
        cw[e] = dyj * xhat;
        cb[e] = dyj;
        o.v[e] = store<T>(rs * (load(wp.v[e]) * dyj - mg - xhat * mgx));
      }
      stp<T, V>(dxr + c, o);
      if (pw) accumulate_partial<V>(pw + c, cw, r == r0);
      if (pb) accumulate_partial<V>(pb + c, cb, r == r0);
    }
  }
}

// ---- fixed-order column reduction -------------------------------------------------------------

// Block (32, 32): column blockIdx.x * 32 + tx; thread row ty sums chunks ty, ty + 32, ... in
// order, then row 0 adds the 32 sums in order. The result depends only on (chunks, dim).
template <typename U>
__global__ void reduce_partials_kernel(std::int64_t chunks, std::int64_t dim, const float* part,
                                       U* dst) {
  __shared__ float sums[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + tx;
  float acc = 0.f;
  if (col < dim)
    for (std::int64_t c = ty; c < chunks; c += 32) acc += part[c * dim + col];
  sums[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && col < dim) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < 32; ++k) t += sums[k][tx];
    dst[col] = store<U>(load(dst[col]) + t);
  }
}

// ---- launch helpers ---------------------------------------------------------------------------

void check_rows(const char* op, std::int64_t rows, std::int64_t dim, std::int64_t x_stride,
                std::int64_t dy_stride) {
  KILN_CHECK(rows >= 0 && dim > 0, "[{}] bad sizes rows={} dim={}", op, rows, dim);
  KILN_CHECK(x_stride >= dim && dy_stride >= dim, "[{}] row strides {} / {} below dim {}", op,
             x_stride, dy_stride, dim);
}

// Calls f(std::bool_constant<warp>, std::integral_constant<int, V>) for the launch shape.
template <typename T, typename F>
void with_shape(const RowLaunch& l, int vec, F&& f) {
  constexpr int P = 16 / sizeof(T);
  KILN_CHECK(l.blocks <= 0x7fffffffLL, "[norm] {} blocks exceed the grid limit", l.blocks);
  if (l.warp_per_row) {
    if (vec == P)
      f(std::true_type{}, std::integral_constant<int, P>{});
    else
      f(std::true_type{}, std::integral_constant<int, 1>{});
  } else {
    if (vec == P)
      f(std::false_type{}, std::integral_constant<int, P>{});
    else
      f(std::false_type{}, std::integral_constant<int, 1>{});
  }
}

}  // namespace

template <typename T>
void rmsnorm_forward(std::int64_t rows, std::int64_t dim, float eps, const T* x,
                     std::int64_t x_stride, const T* w, T* y, float* rstd, StreamHandle stream) {
  check_rows("rmsnorm", rows, dim, x_stride, dim);
  if (rows == 0) return;
  const int vec = row_vec_width(sizeof(T), dim, {x, w, y}, {x_stride});
  const RowLaunch l = row_launch(rows, dim, vec);
  with_shape<T>(l, vec, [&](auto warp, auto v) {
    rmsnorm_fwd_kernel<T, decltype(warp)::value, decltype(v)::value, false>
        <<<static_cast<unsigned>(l.blocks), l.threads, 0, stream>>>(
            rows, dim, eps, x, x_stride, nullptr, 0, nullptr, w, y, rstd);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

template <typename T>
void add_rmsnorm_forward(std::int64_t rows, std::int64_t dim, float eps, const T* x,
                         std::int64_t x_stride, const T* r, std::int64_t r_stride, const T* w, T* s,
                         T* y, float* rstd, StreamHandle stream) {
  check_rows("add_rmsnorm", rows, dim, x_stride, r_stride);
  if (rows == 0) return;
  const int vec = row_vec_width(sizeof(T), dim, {x, r, w, s, y}, {x_stride, r_stride});
  const RowLaunch l = row_launch(rows, dim, vec);
  with_shape<T>(l, vec, [&](auto warp, auto v) {
    rmsnorm_fwd_kernel<T, decltype(warp)::value, decltype(v)::value, true>
        <<<static_cast<unsigned>(l.blocks), l.threads, 0, stream>>>(rows, dim, eps, x, x_stride, r,
                                                                    r_stride, s, w, y, rstd);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

template <typename T>
void rmsnorm_backward(std::int64_t rows, std::int64_t dim, const T* x, std::int64_t x_stride,
                      const T* w, const float* rstd, const T* dy, std::int64_t dy_stride, T* dx,
                      float* dw_partial, StreamHandle stream) {
  check_rows("rmsnorm_backward", rows, dim, x_stride, dy_stride);
  if (rows == 0) return;
  const NormChunks ch = norm_chunks(rows);
  const int vec = row_vec_width(sizeof(T), dim, {x, w, dy, dx, dw_partial}, {x_stride, dy_stride});
  const RowLaunch l = row_launch(ch.count, dim, vec);
  if (const int packs = norm_register_packs(dim, vec); packs > 0 && l.warp_per_row) {
    with_shape<T>(l, vec, [&](auto, auto v) {
      constexpr int V = decltype(v)::value;
      auto launch = [&](auto kc) {
        rmsnorm_bwd_reg_kernel<T, V, decltype(kc)::value>
            <<<static_cast<unsigned>(l.blocks), l.threads, 0, stream>>>(
                rows, dim, ch.count, ch.rows_per, x, x_stride, w, rstd, dy, dy_stride, dx,
                dw_partial);
        KILN_CUDA_CHECK_LAUNCH();
      };
      if (packs == 1)
        launch(std::integral_constant<int, 1>{});
      else if (packs == 2)
        launch(std::integral_constant<int, 2>{});
      else
        launch(std::integral_constant<int, 4>{});
    });
    return;
  }
  with_shape<T>(l, vec, [&](auto warp, auto v) {
    rmsnorm_bwd_kernel<T, decltype(warp)::value, decltype(v)::value>
        <<<static_cast<unsigned>(l.blocks), l.threads, 0, stream>>>(
            rows, dim, ch.count, ch.rows_per, x, x_stride, w, rstd, dy, dy_stride, dx, dw_partial);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

template <typename T>
void layernorm_forward(std::int64_t rows, std::int64_t dim, float eps, const T* x,
                       std::int64_t x_stride, const T* w, const T* b, T* y, float* mean,
                       float* rstd, StreamHandle stream) {
  check_rows("layernorm", rows, dim, x_stride, dim);
  if (rows == 0) return;
  const int vec = row_vec_width(sizeof(T), dim, {x, w, b, y}, {x_stride});
  const RowLaunch l = row_launch(rows, dim, vec);
  with_shape<T>(l, vec, [&](auto warp, auto v) {
    layernorm_fwd_kernel<T, decltype(warp)::value, decltype(v)::value>
        <<<static_cast<unsigned>(l.blocks), l.threads, 0, stream>>>(rows, dim, eps, x, x_stride, w,
                                                                    b, y, mean, rstd);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

template <typename T>
void layernorm_backward(std::int64_t rows, std::int64_t dim, const T* x, std::int64_t x_stride,
                        const T* w, const float* mean, const float* rstd, const T* dy,
                        std::int64_t dy_stride, T* dx, float* dw_partial, float* db_partial,
                        StreamHandle stream) {
  check_rows("layernorm_backward", rows, dim, x_stride, dy_stride);
  if (rows == 0) return;
  const NormChunks ch = norm_chunks(rows);
  const int vec =
      row_vec_width(sizeof(T), dim, {x, w, dy, dx, dw_partial, db_partial}, {x_stride, dy_stride});
  const RowLaunch l = row_launch(ch.count, dim, vec);
  with_shape<T>(l, vec, [&](auto warp, auto v) {
    layernorm_bwd_kernel<T, decltype(warp)::value, decltype(v)::value>
        <<<static_cast<unsigned>(l.blocks), l.threads, 0, stream>>>(
            rows, dim, ch.count, ch.rows_per, x, x_stride, w, mean, rstd, dy, dy_stride, dx,
            dw_partial, db_partial);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

template <typename U>
void reduce_partials(std::int64_t chunks, std::int64_t dim, const float* part, U* dst,
                     StreamHandle stream) {
  KILN_CHECK(chunks >= 0 && dim >= 0, "[norm] bad partial sizes chunks={} dim={}", chunks, dim);
  if (chunks == 0 || dim == 0) return;
  const std::int64_t blocks = ceil_div(dim, 32);
  KILN_CHECK(blocks <= 0x7fffffffLL, "[norm] dim {} too large", dim);
  reduce_partials_kernel<U>
      <<<static_cast<unsigned>(blocks), dim3(32, 32), 0, stream>>>(chunks, dim, part, dst);
  KILN_CUDA_CHECK_LAUNCH();
}

#define KILN_INSTANTIATE(T)                                                                       \
  template void add_rmsnorm_forward<T>(std::int64_t, std::int64_t, float, const T*, std::int64_t, \
                                       const T*, std::int64_t, const T*, T*, T*, float*,          \
                                       StreamHandle);                                             \
  template void rmsnorm_forward<T>(std::int64_t, std::int64_t, float, const T*, std::int64_t,     \
                                   const T*, T*, float*, StreamHandle);                           \
  template void rmsnorm_backward<T>(std::int64_t, std::int64_t, const T*, std::int64_t, const T*, \
                                    const float*, const T*, std::int64_t, T*, float*,             \
                                    StreamHandle);                                                \
  template void layernorm_forward<T>(std::int64_t, std::int64_t, float, const T*, std::int64_t,   \
                                     const T*, const T*, T*, float*, float*, StreamHandle);       \
  template void layernorm_backward<T>(std::int64_t, std::int64_t, const T*, std::int64_t,         \
                                      const T*, const float*, const float*, const T*,             \
                                      std::int64_t, T*, float*, float*, StreamHandle);            \
  template void reduce_partials<T>(std::int64_t, std::int64_t, const float*, T*, StreamHandle);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(f16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
