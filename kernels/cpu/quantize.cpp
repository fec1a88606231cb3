#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/error.h"
#include "kernels/common/half.h"

namespace kiln::cpu {
namespace {

using quant::QuantType;

// Stores f as f16 at p (little-endian) and returns the stored value.
float put_f16(std::uint8_t* p, float f) {
  const f16 h = float_to_f16(f);
  p[0] = static_cast<std::uint8_t>(h.bits & 0xff);
  p[1] = static_cast<std::uint8_t>(h.bits >> 8);
  return f16_to_float(h);
}

int nearest_int(float v) { return static_cast<int>(std::nearbyint(v)); }

void q8_0_block(const float* x, std::uint8_t* o) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(o, d);
  for (int j = 0; j < 32; ++j)
    o[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::roundf(x[j] * id)));
}

// One sub-block of n values on the grid lo + step q, q in 0..nmax, lo <= 0: the range's grid,
// then 20 stretched grids (nmax + t for t in -1 .. 1), each refit by least squares (step and lo
// for its codes, lo kept <= 0); the grid with the smallest squared error wins. The range's grid
// is exact for values on it, so those come back exactly.
void fit_grid(const float* x, int n, int nmax, float& step, float& lo) {
  float mn = 0.0f, mx = x[0];
  for (int l = 0; l < n; ++l) {
    mn = std::min(mn, x[l]);
    mx = std::max(mx, x[l]);
  }
  lo = mn;
  step = std::max(mx - mn, 0.0f) / static_cast<float>(nmax);
  if (step == 0.0f) return;
  auto error = [&](float st, float l0) {
    double e = 0;
    for (int l = 0; l < n; ++l) {
      const int q = std::clamp(nearest_int((x[l] - l0) / st), 0, nmax);
      const double r = st * q + l0 - x[l];
      e += r * r;
    }
    return e;
  };
  double best = error(step, lo);
  for (int t = 0; t <= 20; ++t) {
    const float iscale = (static_cast<float>(nmax) - 1.0f + 0.1f * t) / (mx - mn);
    double sl = 0, sl2 = 0, sx = 0, sxl = 0;
    for (int l = 0; l < n; ++l) {
      const int q = std::clamp(nearest_int(iscale * (x[l] - mn)), 0, nmax);
      sl += q, sl2 += double(q) * q, sx += x[l], sxl += double(x[l]) * q;
    }
    const double det = n * sl2 - sl * sl;
    if (det <= 0) continue;
    double st = (n * sxl - sl * sx) / det, l0 = (sl2 * sx - sl * sxl) / det;
    if (l0 > 0) l0 = 0, st = sl2 > 0 ? sxl / sl2 : 0;
    if (st <= 0) continue;
    const double e = error(static_cast<float>(st), static_cast<float>(l0));
    if (e < best) best = e, step = static_cast<float>(st), lo = static_cast<float>(l0);
  }
}

void q4_k_block(const float* x, std::uint8_t* o) {
  float step[8], lo[8], max_step = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    fit_grid(x + 32 * s, 32, 15, step[s], lo[s]);
    max_step = std::max(max_step, step[s]);
    max_min = std::max(max_min, -lo[s]);
  }
  const float d = put_f16(o, max_step / 63.0f);
  const float dmin = put_f16(o + 2, max_min / 63.0f);
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d > 0.0f ? std::clamp(nearest_int(step[s] / d), 0, 63) : 0;
    m[s] = dmin > 0.0f ? std::clamp(nearest_int(-lo[s] / dmin), 0, 63) : 0;
  }
  std::uint8_t* scales = o + 4;
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<std::uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  std::uint8_t* q = o + 16;
  std::fill(q, q + 128, 0);
  for (int i = 0; i < 256; ++i) {
    const int s = i / 32;
    const float sd = d * static_cast<float>(sc[s]), sm = dmin * static_cast<float>(m[s]);
    const int v = sd > 0.0f ? std::clamp(nearest_int((x[i] + sm) / sd), 0, 15) : 0;
    q[32 * (i / 64) + i % 32] |= static_cast<std::uint8_t>((s & 1) ? v << 4 : v);
  }
}

void q6_k_block(const float* x, std::uint8_t* o) {
  float scale[16], max_scale = 0.0f;
  for (int j = 0; j < 16; ++j) {
    float v = 0.0f;
    for (int l = 0; l < 16; ++l)
      if (std::fabs(x[16 * j + l]) > std::fabs(v)) v = x[16 * j + l];
    scale[j] = v / -32.0f;
    max_scale = std::max(max_scale, std::fabs(scale[j]));
  }
  const float d = put_f16(o + 208, max_scale / 127.0f);
  auto* sc = reinterpret_cast<std::int8_t*>(o + 192);
  for (int j = 0; j < 16; ++j)
    sc[j] =
        static_cast<std::int8_t>(d > 0.0f ? std::clamp(nearest_int(scale[j] / d), -127, 127) : 0);
  std::uint8_t* ql = o;
  std::uint8_t* qh = o + 128;
  std::fill(o, o + 192, 0);
  for (int i = 0; i < 256; ++i) {
    const float sd = d * static_cast<float>(sc[i / 16]);
    const int q = (sd != 0.0f ? std::clamp(nearest_int(x[i] / sd), -32, 31) : 0) + 32;
    const int h = i / 128, r = (i % 128) / 32, l = i % 32;
    ql[64 * h + l + 32 * (r & 1)] |= static_cast<std::uint8_t>(r >= 2 ? (q & 0xF) << 4 : q & 0xF);
    qh[32 * h + l] |= static_cast<std::uint8_t>((q >> 4) << (2 * r));
  }
}

}  // namespace

void quantize_blocks(QuantType t, const float* x, std::int64_t n, std::uint8_t* out) {
  const quant::QuantInfo& q = quant::quant_info(t);
  KILN_CHECK(n % q.block_size == 0, "[quantize] {} weights are not whole {} blocks of {}", n,
             q.name, q.block_size);
  for (std::int64_t i = 0; i < n; ++i)
    KILN_CHECK(std::isfinite(x[i]), "[quantize] weight {} is {}: {} holds finite values only", i,
               x[i], q.name);
  const std::int64_t nb = n / q.block_size;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * q.block_size;
    std::uint8_t* ob = out + b * q.block_bytes;
    if (t == QuantType::Q8_0)
      q8_0_block(xb, ob);
    else if (t == QuantType::Q4_K)
      q4_k_block(xb, ob);
    else
      q6_k_block(xb, ob);
  }
}

}  // namespace kiln::cpu
