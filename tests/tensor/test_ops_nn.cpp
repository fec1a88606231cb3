// The nn ops of the front end (tensor/ops.h: softmax, embedding, norms, RoPE, activations,
// attention, cross-entropy, dropout, random fills) against plain float64 references computed
// here, on odd sizes and non-contiguous inputs, in f64, f32, bf16 and f16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tests/error_of.h"
#include "tests/tensor/ops_reference.h"

namespace kiln {
namespace {

using V = ops_ref::V;
using ops_ref::close;
using ops_ref::randt;
using ops_ref::sigmoid;

TEST(Ops, SoftmaxLogSoftmax) {
  Tensor x = randt({9, 4}, 30, DType::F64, -5, 5).transpose(0, 1);  // rows of 9, strided
  auto xv = x.to_double_vector();
  V sm(36), lsm(36);
  for (int r = 0; r < 4; ++r) {
    double mx = -1e300, s = 0;
    for (int c = 0; c < 9; ++c) mx = std::max(mx, xv[r * 9 + c]);
    for (int c = 0; c < 9; ++c) s += std::exp(xv[r * 9 + c] - mx);
    for (int c = 0; c < 9; ++c) {
      sm[r * 9 + c] = std::exp(xv[r * 9 + c] - mx) / s;
      lsm[r * 9 + c] = xv[r * 9 + c] - mx - std::log(s);
    }
  }
  EXPECT_TRUE(close(ops::softmax(x), sm));
  EXPECT_TRUE(close(ops::log_softmax(x), lsm));
  EXPECT_TRUE(close(ops::softmax(x.to(DType::F32)), sm, 1e-5, 1e-7));
  EXPECT_TRUE(close(ops::log_softmax(x.to(DType::F32)), lsm, 1e-5, 1e-5));
  // Large logits stay finite.
  Tensor big = ops::affine(x, 1.0, 1000.0);
  EXPECT_TRUE(close(ops::softmax(big.to(DType::F32)), sm, 1e-4, 1e-6));
}

TEST(Ops, EmbeddingAndBadIds) {
  Tensor table = randt({11, 5}, 40);
  Tensor ids = ops::from_vector(std::vector<std::int32_t>{3, 0, 10, 3, 7, 1}, {2, 3});
  Tensor out = ops::embedding(ids, table);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 5}));
  auto tv = table.to_double_vector();
  std::vector<int> idv = {3, 0, 10, 3, 7, 1};
  V want;
  for (int id : idv)
    for (int c = 0; c < 5; ++c) want.push_back(tv[id * 5 + c]);
  EXPECT_TRUE(close(out, want));
  // Backward accumulates rows (+=).
  Tensor dt = ops::zeros({11, 5}, DType::F64);
  Tensor dout = randt({2, 3, 5}, 41);
  ops::embedding_backward_(dt, ids, dout);
  ops::embedding_backward_(dt, ids, dout);
  auto dv = dout.to_double_vector();
  V wd(55, 0.0);
  for (int t = 0; t < 6; ++t)
    for (int c = 0; c < 5; ++c) wd[idv[t] * 5 + c] += 2 * dv[t * 5 + c];
  EXPECT_TRUE(close(dt, wd));
  for (std::int32_t bad : {11, -1, 1 << 30}) {
    Tensor b = ops::from_vector(std::vector<std::int32_t>{1, bad}, {2});
    EXPECT_THROW(ops::embedding(b, table), Error) << bad;
  }
  EXPECT_THROW(ops::embedding(ids.to(DType::F32), table), Error);
}

TEST(Ops, RmsNormLayerNorm) {
  const int R = 6, C = 13;
  Tensor x = randt({C, R}, 50, DType::F64, -2, 2).transpose(0, 1);  // (R, C), strided
  Tensor w = randt({C}, 51), b = randt({C}, 52);
  auto xv = x.to_double_vector(), wv = w.to_double_vector(), bv = b.to_double_vector();
  const double eps = 1e-5;
  V y(R * C), rs(R), yl(R * C), mu(R), rl(R);
  for (int r = 0; r < R; ++r) {
    double ss = 0, m = 0;
    for (int c = 0; c < C; ++c) ss += xv[r * C + c] * xv[r * C + c], m += xv[r * C + c];
    m /= C;
    rs[r] = 1.0 / std::sqrt(ss / C + eps);
    double var = 0;
    for (int c = 0; c < C; ++c) var += (xv[r * C + c] - m) * (xv[r * C + c] - m);
    var /= C;
    mu[r] = m;
    rl[r] = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) {
      y[r * C + c] = xv[r * C + c] * rs[r] * wv[c];
      yl[r * C + c] = (xv[r * C + c] - m) * rl[r] * wv[c] + bv[c];
    }
  }
  auto [yr, rstd] = ops::rmsnorm(x, w, eps);
  EXPECT_TRUE(close(yr, y));
  EXPECT_TRUE(close(rstd, rs));
  auto [ylr, mean, rstd2] = ops::layernorm(x, w, b, eps);
  EXPECT_TRUE(close(ylr, yl, 1e-11, 1e-11));
  EXPECT_TRUE(close(mean, mu));
  EXPECT_TRUE(close(rstd2, rl, 1e-11, 1e-11));
  auto [y32, r32] = ops::rmsnorm(x.to(DType::F32), w.to(DType::F32), eps);
  EXPECT_EQ(r32.dtype(), DType::F32);
  EXPECT_TRUE(close(y32, y, 1e-5, 1e-5));
  EXPECT_THROW(ops::rmsnorm(x, randt({C + 1}, 1), eps), Error);
}

// add_rmsnorm is add() then rmsnorm(): against float64 sums here, and bit for bit against the two
// ops in every float dtype, on rows with vector tails and decode's one wide row.
TEST(Ops, AddRmsNormIsTheAddThenTheNorm) {
  const int R = 5, C = 19;
  const double eps = 1e-5;
  Tensor x = randt({C, R}, 60, DType::F64, -2, 2).transpose(0, 1);  // (R, C), strided
  Tensor r = randt({R, C}, 61, DType::F64, -2, 2), w = randt({C}, 62);
  auto xv = x.to_double_vector(), rv = r.to_double_vector(), wv = w.to_double_vector();
  V s(R * C), y(R * C), rs(R);
  for (int i = 0; i < R; ++i) {
    double ss = 0;
    for (int c = 0; c < C; ++c) {
      s[i * C + c] = xv[i * C + c] + rv[i * C + c];
      ss += s[i * C + c] * s[i * C + c];
    }
    rs[i] = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) y[i * C + c] = s[i * C + c] * rs[i] * wv[c];
  }
  auto [s64, y64, rstd64] = ops::add_rmsnorm(x, r, w, eps);
  EXPECT_TRUE(close(s64, s));
  EXPECT_TRUE(close(y64, y));
  EXPECT_TRUE(close(rstd64, rs));

  for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (const Shape& shape : {Shape{2, 3, 37}, Shape{1, 1, 4096}}) {
      const Tensor a = randt(shape, 63, dt, -3, 3), b = randt(shape, 64, dt, -3, 3);
      const Tensor g = randt({shape.back()}, 65, dt, 0.5, 1.5);
      auto [sf, yf, rf] = ops::add_rmsnorm(a, b, g, eps);
      const Tensor su = ops::add(a, b);
      auto [yu, ru] = ops::rmsnorm(su, g, eps);
      EXPECT_EQ(sf.dtype(), dt);
      EXPECT_EQ(yf.shape(), shape);
      EXPECT_EQ(rf.dtype(), ru.dtype());
      EXPECT_EQ(sf.to_double_vector(), su.to_double_vector()) << dtype_name(dt);
      EXPECT_EQ(yf.to_double_vector(), yu.to_double_vector()) << dtype_name(dt);
      EXPECT_EQ(rf.to_double_vector(), ru.to_double_vector()) << dtype_name(dt);
    }
  }

  // Both backends have a kernel: the meta device, simulating each, gives the shapes.
  for (DeviceType simulated : {DeviceType::CPU, DeviceType::CUDA}) {
    MetaSimulatesScope scope(simulated);
    const Tensor m = ops::zeros({2, 7, 64}, DType::BF16, Device::meta());
    auto [sm, ym, rm] = ops::add_rmsnorm(m, m, ops::zeros({64}, DType::BF16, Device::meta()), eps);
    EXPECT_EQ(sm.shape(), (Shape{2, 7, 64}));
    EXPECT_EQ(ym.dtype(), DType::BF16);
    EXPECT_EQ(rm.shape(), (Shape{14}));
    EXPECT_EQ(rm.dtype(), DType::F32);
  }

  test::expect_error(
      [&] {
        ops::add_rmsnorm(x, randt({R, C + 1}, 66), w, eps);
      },
      "residual (5, 20) f64 does not match input (5, 19) f64", "[add_rmsnorm]");
  test::expect_error([&] { ops::add_rmsnorm(x, r.to(DType::F32), w, eps); },
                     "residual (5, 19) f32 does not match input (5, 19) f64", "[add_rmsnorm]");
  test::expect_error([&] { ops::add_rmsnorm(x, r, randt({C + 1}, 67), eps); },
                     "input (5, 19) does not match weight (20,)", "[add_rmsnorm]");
}

// x: (B, T, H, D) logical values; reference rotation with angles in double.
V ref_rope(const V& x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, double theta,
           ops::RopeStyle style, std::int64_t off) {
  V y(x.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        std::int64_t base = ((b * T + t) * H + h) * D;
        for (std::int64_t i = 0; i < D / 2; ++i) {
          double ang = static_cast<double>(off + t) * std::pow(theta, -2.0 * i / D);
          std::int64_t i0 = style == ops::RopeStyle::Interleaved ? 2 * i : i;
          std::int64_t i1 = style == ops::RopeStyle::Interleaved ? 2 * i + 1 : i + D / 2;
          double a = x[base + i0], c = x[base + i1];
          y[base + i0] = a * std::cos(ang) - c * std::sin(ang);
          y[base + i1] = a * std::sin(ang) + c * std::cos(ang);
        }
      }
  return y;
}

TEST(Ops, RopeBothStyles) {
  const std::int64_t B = 2, T = 5, H = 3, D = 8;
  auto [cos, sin] = ops::rope_tables(16, D, 10000.0, DType::F64);
  EXPECT_EQ(cos.shape(), (Shape{16, D / 2}));
  auto [cos32, sin32] = ops::rope_tables(16, D, 10000.0, DType::BF16);
  EXPECT_EQ(cos32.dtype(), DType::F32);                // tables in the compute dtype
  Tensor x = randt({B, H, T, D}, 60).transpose(1, 2);  // (B, T, H, D), strided
  for (auto style : {ops::RopeStyle::Interleaved, ops::RopeStyle::RotateHalf})
    for (std::int64_t off : {0, 3}) {
      V want = ref_rope(x.to_double_vector(), B, T, H, D, 10000.0, style, off);
      Tensor y = ops::rope(x, cos, sin, style, off);
      EXPECT_TRUE(close(y, want, 1e-12, 1e-12)) << static_cast<int>(style) << off;
      // Backward is the inverse rotation.
      Tensor back = ops::rope(y, cos, sin, style, off, true);
      EXPECT_TRUE(close(back, x.to_double_vector(), 1e-12, 1e-12));
      Tensor yb = ops::rope(x.to(DType::BF16), cos32, sin32, style, off);
      EXPECT_EQ(yb.dtype(), DType::BF16);
      EXPECT_TRUE(close(yb, want, 1.6e-2, 1.6e-2));
    }
  EXPECT_THROW(ops::rope(x, cos, sin, ops::RopeStyle::Interleaved, 12), Error);
}

TEST(Ops, Activations) {
  Tensor x = randt({7, 5}, 70, DType::F64, -4, 4).transpose(0, 1);
  Tensor u = randt({5, 7}, 71);
  auto xv = x.to_double_vector(), uv = u.to_double_vector();
  V si, ge, sw;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    double v = xv[i];
    si.push_back(v * sigmoid(v));
    double c = std::sqrt(2.0 / M_PI);
    ge.push_back(0.5 * v * (1 + std::tanh(c * (v + 0.044715 * v * v * v))));
    sw.push_back(v * sigmoid(v) * uv[i]);
  }
  EXPECT_TRUE(close(ops::silu(x), si, 1e-12, 1e-12));
  EXPECT_TRUE(close(ops::gelu_tanh(x), ge, 1e-12, 1e-12));
  EXPECT_TRUE(close(ops::swiglu(x, u), sw, 1e-12, 1e-12));
  EXPECT_TRUE(close(ops::silu(x.to(DType::F32)), si, 1e-5, 1e-6));
  EXPECT_TRUE(close(ops::gelu_tanh(x.to(DType::F32)), ge, 1e-5, 1e-6));
  EXPECT_TRUE(close(ops::swiglu(x.to(DType::F32), u.to(DType::F32)), sw, 1e-5, 1e-6));
  EXPECT_THROW(ops::swiglu(x, randt({5, 6}, 1)), Error);
}

// Causal GQA attention reference. q: (B, Tq, Hq, D), k/v: (B, Tk, Hkv, D) logical values.
void ref_attention(const V& q, const V& k, const V& v, std::int64_t B, std::int64_t Tq,
                   std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D, double scale,
                   std::int64_t off, V& out, V& lse) {
  out.assign(B * Tq * Hq * D, 0.0);
  lse.assign(B * Hq * Tq, 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      std::int64_t hk = h / (Hq / Hkv);
      for (std::int64_t i = 0; i < Tq; ++i) {
        std::int64_t n = off + i + 1;
        V s(n);
        double mx = -1e300;
        for (std::int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (std::int64_t c = 0; c < D; ++c)
            d += q[((b * Tq + i) * Hq + h) * D + c] * k[((b * Tk + j) * Hkv + hk) * D + c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double x : s) z += std::exp(x - mx);
        lse[(b * Hq + h) * Tq + i] = mx + std::log(z);
        for (std::int64_t j = 0; j < n; ++j) {
          double p = std::exp(s[j] - mx) / z;
          for (std::int64_t c = 0; c < D; ++c)
            out[((b * Tq + i) * Hq + h) * D + c] += p * v[((b * Tk + j) * Hkv + hk) * D + c];
        }
      }
    }
}

TEST(Ops, AttentionGqaOffsetAndCacheView) {
  const std::int64_t B = 2, Hq = 4, Hkv = 2, D = 6;
  const double scale = 1.0 / std::sqrt(6.0);
  // Training shape: Tq == Tk, offset 0.
  {
    const std::int64_t T = 7;
    Tensor q = randt({B, T, Hq, D}, 80), k = randt({B, T, Hkv, D}, 81),
           v = randt({B, T, Hkv, D}, 82);
    V out, lse;
    ref_attention(q.to_double_vector(), k.to_double_vector(), v.to_double_vector(), B, T, T, Hq,
                  Hkv, D, scale, 0, out, lse);
    auto [o, l] = ops::attention(q, k, v, scale, 0);
    EXPECT_TRUE(close(o, out, 1e-11, 1e-11));
    EXPECT_TRUE(close(l, lse, 1e-11, 1e-11));
    auto [o32, l32] =
        ops::attention(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), scale, 0);
    EXPECT_TRUE(close(o32, out, 1e-5, 1e-5));
    auto [ob, lb] =
        ops::attention(q.to(DType::BF16), k.to(DType::BF16), v.to(DType::BF16), scale, 0);
    EXPECT_EQ(ob.dtype(), DType::BF16);
    EXPECT_EQ(lb.dtype(), DType::F32);
    EXPECT_TRUE(close(ob, out, 3e-2, 3e-2));
  }
  // Decode-like: 3 queries at positions 4..6 against a narrowed KV cache of capacity 10.
  {
    const std::int64_t Tq = 3, Tk = 7, Tmax = 10, off = 4;
    Tensor q = randt({B, Tq, Hq, D}, 83);
    Tensor kc = randt({B, Tmax, Hkv, D}, 84), vc = randt({B, Tmax, Hkv, D}, 85);
    Tensor k = kc.narrow(1, 0, Tk), v = vc.narrow(1, 0, Tk);
    EXPECT_FALSE(k.is_contiguous());
    V out, lse;
    ref_attention(q.to_double_vector(), k.to_double_vector(), v.to_double_vector(), B, Tq, Tk, Hq,
                  Hkv, D, scale, off, out, lse);
    auto [o, l] = ops::attention(q, k, v, scale, off);
    EXPECT_EQ(o.shape(), q.shape());
    EXPECT_TRUE(close(o, out, 1e-11, 1e-11));
    EXPECT_TRUE(close(l, lse, 1e-11, 1e-11));
    // A permuted (non-dense) k is copied, with the same result.
    Tensor kp = randt({B, Hkv, Tk, D}, 86).transpose(1, 2);
    ref_attention(q.to_double_vector(), kp.to_double_vector(), v.to_double_vector(), B, Tq, Tk, Hq,
                  Hkv, D, scale, off, out, lse);
    Tensor vp = v.contiguous();
    EXPECT_THROW(ops::attention(q, k, vp, scale, off), Error);  // batch strides differ
    auto [o2, l2] = ops::attention(q, kp, kp, scale, off);
    ref_attention(q.to_double_vector(), kp.to_double_vector(), kp.to_double_vector(), B, Tq, Tk, Hq,
                  Hkv, D, scale, off, out, lse);
    EXPECT_TRUE(close(o2, out, 1e-11, 1e-11));
    EXPECT_THROW(ops::attention(q, k, v, scale, 5), Error);  // needs keys up to 8
    EXPECT_THROW(ops::attention(q, randt({B, Tk, 3, D}, 1), randt({B, Tk, 3, D}, 2), scale, off),
                 Error);
  }
}

TEST(Ops, CrossEntropyIgnoreIndex) {
  const int N = 7, Vc = 11;
  Tensor logits = randt({Vc, N}, 90, DType::F64, -3, 3).transpose(0, 1);  // strided
  std::vector<std::int32_t> tg = {3, -100, 0, 10, -100, 5, 5};
  Tensor targets = ops::from_vector(tg, {N});
  auto lv = logits.to_double_vector();
  V loss(N), lse(N);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int c = 0; c < Vc; ++c) mx = std::max(mx, lv[n * Vc + c]);
    for (int c = 0; c < Vc; ++c) z += std::exp(lv[n * Vc + c] - mx);
    lse[n] = mx + std::log(z);
    loss[n] = tg[n] == -100 ? 0.0 : lse[n] - lv[n * Vc + tg[n]];
  }
  auto [l, s] = ops::cross_entropy(logits, targets, -100);
  EXPECT_TRUE(close(l, loss, 1e-12, 1e-12));
  EXPECT_TRUE(close(s, lse, 1e-12, 1e-12));
  Tensor dloss = randt({N}, 91);
  auto dl = dloss.to_double_vector();
  Tensor d = ops::cross_entropy_backward(logits, s, targets, dloss, -100);
  V wd(N * Vc, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < Vc; ++c)
      if (tg[n] != -100)
        wd[n * Vc + c] = dl[n] * (std::exp(lv[n * Vc + c] - lse[n]) - (c == tg[n]));
  EXPECT_TRUE(close(d, wd, 1e-12, 1e-12));
  auto [l32, s32] = ops::cross_entropy(logits.to(DType::BF16), targets, -100);
  EXPECT_EQ(l32.dtype(), DType::F32);
  Tensor bad = ops::from_vector(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 11}, {N});
  EXPECT_THROW(ops::cross_entropy(logits, bad, -100), Error);
  EXPECT_THROW(ops::cross_entropy(logits, targets.narrow(0, 0, 5), -100), Error);
}

TEST(Ops, DropoutMaskStatistics) {
  const std::int64_t n = 40000;
  const double p = 0.3;
  Tensor x = randt({n}, 100, DType::F32, 0.5, 1.5);
  Generator gen(123, 7);
  auto [y, mask] = ops::dropout(x, p, gen);
  EXPECT_EQ(mask.dtype(), DType::Bool);
  EXPECT_GT(gen.offset, 7u);
  auto xv = x.to_double_vector(), yv = y.to_double_vector(), mv = mask.to_double_vector();
  double kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    kept += mv[i];
    double want = mv[i] != 0 ? xv[i] / (1 - p) : 0.0;
    ASSERT_NEAR(yv[i], want, 1e-6 * std::abs(want)) << i;
  }
  // Binomial(n, 0.7): std of the fraction ~0.0023; allow 5 sigma.
  EXPECT_NEAR(kept / n, 1 - p, 0.012);
  // Same generator state, same mask; the next draw differs.
  Generator again(123, 7);
  auto [y2, m2] = ops::dropout(x, p, again);
  EXPECT_EQ(m2.to_double_vector(), mv);
  auto [y3, m3] = ops::dropout(x, p, gen);
  EXPECT_NE(m3.to_double_vector(), mv);
  // Backward: dy / (1 - p) where kept.
  Tensor dy = randt({n}, 101, DType::F32);
  auto dv = dy.to_double_vector();
  auto dx = ops::dropout_backward(dy, mask, p).to_double_vector();
  for (std::int64_t i = 0; i < n; i += 97)
    EXPECT_NEAR(dx[i], mv[i] != 0 ? dv[i] / (1 - p) : 0.0, 1e-6);
  EXPECT_THROW(ops::dropout(x, 1.0, gen), Error);
}

TEST(Ops, RandnStatisticsAndReproducibility) {
  const std::int64_t n = 50000;
  Generator g(42, 1000);
  Tensor a = ops::randn({n}, g);
  EXPECT_EQ(g.offset, 1000u + n);
  auto v = a.to_double_vector();
  double m = 0, s2 = 0;
  for (double x : v) m += x;
  m /= n;
  for (double x : v) s2 += (x - m) * (x - m);
  double sd = std::sqrt(s2 / (n - 1));
  EXPECT_NEAR(m, 0.0, 0.03);   // ~7 sigma of the mean
  EXPECT_NEAR(sd, 1.0, 0.03);  // ~9 sigma of the std
  // Same (seed, offset): same numbers, in every floating dtype (drawn in f32, then converted).
  Generator g2(42, 1000);
  EXPECT_EQ(ops::randn({n}, g2).to_double_vector(), v);
  Generator g3(42, 1000);
  Tensor b16 = ops::randn({n}, g3, 0.0, 1.0, DType::BF16);
  auto bv = b16.to_double_vector();
  for (std::int64_t i = 0; i < n; i += 101) EXPECT_NEAR(bv[i], v[i], 8e-3 * std::abs(v[i]));
  // Other seeds or offsets differ; mean/std parameters apply.
  Generator g4(43, 1000);
  EXPECT_NE(ops::randn({16}, g4).to_double_vector(), V(v.begin(), v.begin() + 16));
  Generator g5(42, 1000);
  auto sh = ops::randn({16}, g5, 3.0, 0.5, DType::F64).to_double_vector();
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(sh[i], 3.0 + 0.5 * v[i], 1e-6);
  Generator g6(9);
  auto u = ops::rand_uniform({n}, g6, -2.0, 5.0).to_double_vector();
  double um = 0;
  for (double x : u) {
    ASSERT_GE(x, -2.0);
    ASSERT_LT(x, 5.0);
    um += x;
  }
  EXPECT_NEAR(um / n, 1.5, 0.05);
  EXPECT_THROW(ops::randn({4}, g6, 0, 1, DType::I32), Error);
}

TEST(Ops, Bf16ComputesInF32) {
  // bf16 inputs with exactly representable values; outputs bf16, equal to the f32 result
  // rounded to bf16.
  Tensor a = randt({4, 6}, 110).to(DType::BF16), b = randt({6, 5}, 111).to(DType::BF16);
  Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::BF16);
  Tensor c32 = ops::matmul(a.to(DType::F32), b.to(DType::F32));
  EXPECT_EQ(c.to_double_vector(), c32.to(DType::BF16).to_double_vector());
  Tensor s = ops::add(a, a);
  EXPECT_EQ(s.dtype(), DType::BF16);
  EXPECT_EQ(s.to_double_vector(), ops::affine(a.to(DType::F32), 2.0).to_double_vector());
  Tensor sm = ops::softmax(a);
  EXPECT_EQ(sm.dtype(), DType::BF16);
  EXPECT_EQ(sm.to_double_vector(),
            ops::softmax(a.to(DType::F32)).to(DType::BF16).to_double_vector());
  Tensor w = ops::ones({6}, DType::BF16);
  auto [y, rstd] = ops::rmsnorm(a, w, 1e-5);
  EXPECT_EQ(y.dtype(), DType::BF16);
  EXPECT_EQ(rstd.dtype(), DType::F32);
  auto [y32, r32] = ops::rmsnorm(a.to(DType::F32), w.to(DType::F32), 1e-5);
  EXPECT_EQ(y.to_double_vector(), y32.to(DType::BF16).to_double_vector());
  EXPECT_EQ(ops::sum(a, 1).dtype(), DType::BF16);
  EXPECT_EQ(ops::silu(a.to(DType::F16)).dtype(), DType::F16);
  EXPECT_EQ(ops::linear(a, b.transpose(0, 1), Tensor()).dtype(), DType::BF16);
}

}  // namespace
}  // namespace kiln
