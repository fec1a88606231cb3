// Causal GQA attention against a naive float64 softmax(QK^T)V with explicit head mapping and
// mask: training shapes, odd sizes, query blocks crossing the 64-row tiling, chunked prefill
// and decode against a KV cache whose unused tail is NaN. Backward: central differences in
// double, float against double, determinism across thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
KILN_OP_TESTED(Op::Attention);

namespace {
using namespace kiln::test;

struct Shape {
  int64_t B, Tq, Tk, Hq, Hkv, D, q_offset;
};

// out: (B, Tq, Hq, D), lse: (B, Hq, Tq); k, v batches kvs elements apart.
void ref_attention(const Shape& s, double scale, const std::vector<double>& q,
                   const std::vector<double>& k, const std::vector<double>& v, int64_t kvs,
                   std::vector<double>& out, std::vector<double>& lse) {
  out.assign(s.B * s.Tq * s.Hq * s.D, 0.0);
  lse.assign(s.B * s.Hq * s.Tq, 0.0);
  const int64_t group = s.Hq / s.Hkv;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < s.Tq; ++i) {
        const int64_t last = s.q_offset + i;  // keys 0..last are visible
        std::vector<double> sc(last + 1);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= last; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d)
            dot +=
                q[((b * s.Tq + i) * s.Hq + h) * s.D + d] * k[b * kvs + (j * s.Hkv + kvh) * s.D + d];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& x : sc) sum += (x = std::exp(x - mx));
        lse[(b * s.Hq + h) * s.Tq + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= last; ++j)
          for (int64_t d = 0; d < s.D; ++d)
            out[((b * s.Tq + i) * s.Hq + h) * s.D + d] +=
                sc[j] / sum * v[b * kvs + (j * s.Hkv + kvh) * s.D + d];
      }
    }
}

template <typename T>
void check_forward(const Shape& s, int64_t Tmax, double tol) {
  const int64_t kvs = Tmax * s.Hkv * s.D;
  const double scale = 1.0 / std::sqrt(double(s.D));
  auto q = random_normal_vec<T>(s.B * s.Tq * s.Hq * s.D, 1 + s.Tq * 31 + s.D);
  auto k = random_normal_vec<T>(s.B * kvs, 2 + s.Tk * 17 + s.Hq);
  auto v = random_normal_vec<T>(s.B * kvs, 3 + s.Hkv * 13 + s.B);
  // Cache slots the queries can never see hold NaN: any read of them shows in the output.
  const int64_t visible = s.q_offset + s.Tq;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = visible; t < Tmax; ++t)
      for (int64_t e = 0; e < s.Hkv * s.D; ++e)
        k[b * kvs + t * s.Hkv * s.D + e] = v[b * kvs + t * s.Hkv * s.D + e] =
            std::numeric_limits<T>::quiet_NaN();
  std::vector<T> out(q.size(), T(7)), lse(s.B * s.Hq * s.Tq, T(7));
  cpu::attention_forward<T>(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_offset, scale, q.data(),
                            k.data(), v.data(), kvs, out.data(), lse.data());
  std::vector<double> out_r, lse_r;
  ref_attention(s, scale, to_f64(q), to_f64(k), to_f64(v), kvs, out_r, lse_r);
  EXPECT_TRUE(all_close(out, out_r, tol, tol))
      << "B=" << s.B << " Tq=" << s.Tq << " Tk=" << s.Tk << " Hq=" << s.Hq << " Hkv=" << s.Hkv
      << " D=" << s.D << " q_offset=" << s.q_offset << " Tmax=" << Tmax;
  EXPECT_TRUE(all_close(lse, lse_r, tol, tol))
      << "B=" << s.B << " Tq=" << s.Tq << " Tk=" << s.Tk << " Hq=" << s.Hq << " Hkv=" << s.Hkv
      << " D=" << s.D << " q_offset=" << s.q_offset << " Tmax=" << Tmax;
}

const std::vector<Shape> kForwardShapes = {
    // training (Tq == Tk, q_offset 0)
    {1, 1, 1, 1, 1, 1, 0},
    {2, 7, 7, 4, 2, 5, 0},
    {2, 33, 33, 6, 6, 48, 0},
    {1, 130, 130, 4, 1, 32, 0},  // blocks of 64 + 64 + 2 rows, MQA
    {3, 64, 64, 2, 2, 7, 0},
    // chunked prefill against a cache: Tq < Tk
    {2, 5, 40, 4, 2, 8, 35},
    {1, 70, 100, 3, 1, 16, 30},
    // queries that stop short of the last keys (q_offset < Tk - Tq)
    {2, 5, 40, 4, 2, 8, 10},
    // decode: Tq == 1, grouped heads, MHA and MQA
    {3, 1, 70, 8, 2, 16, 69},
    {2, 1, 1, 4, 4, 8, 0},
    {1, 1, 129, 6, 1, 48, 128},
    {2, 1, 33, 6, 6, 32, 32},
};

// f32 blocks run on attn::block_sgemm at AVX2 and above and on BLAS below: both, at every level
// this machine has.
TEST(Attention, ForwardMatchesNaive) {
  for (const auto level : supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    SCOPED_TRACE(std::string(cpu::cpu_isa_name(level)));
    for (const auto& s : kForwardShapes) {
      check_forward<double>(s, s.Tk, 1e-12);
      check_forward<float>(s, s.Tk, 2e-5);
    }
  }
}

TEST(Attention, ForwardKvCacheStride) {
  // Capacity Tmax > Tk: batches are Tmax * Hkv * D apart and the tail is never read.
  for (const auto level : supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    SCOPED_TRACE(std::string(cpu::cpu_isa_name(level)));
    for (const auto& s : kForwardShapes) {
      check_forward<double>(s, s.Tk + 9, 1e-12);
      check_forward<float>(s, s.Tk + 9, 2e-5);
    }
  }
}

// Gradients of L = sum(dout * out) with respect to q, k, v.
struct Grads {
  std::vector<double> dq, dk, dv;
};

Grads fd_grads(const Shape& s, double scale, std::vector<double> q, std::vector<double> k,
               std::vector<double> v, const std::vector<double>& dout) {
  const int64_t kvs = s.Tk * s.Hkv * s.D;
  auto loss = [&] {
    std::vector<double> out(q.size()), lse(s.B * s.Hq * s.Tq);
    cpu::attention_forward<double>(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, 0, scale, q.data(), k.data(),
                                   v.data(), kvs, out.data(), lse.data());
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += dout[i] * out[i];
    return l;
  };
  auto grad = [&](std::vector<double>& x) {
    const double h = 1e-6;
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + h;
      const double lp = loss();
      x[i] = x0 - h;
      const double lm = loss();
      x[i] = x0;
      g[i] = (lp - lm) / (2 * h);
    }
    return g;
  };
  Grads g;
  g.dq = grad(q);
  g.dk = grad(k);
  g.dv = grad(v);
  return g;
}

template <typename T>
Grads run_backward(const Shape& s, double scale, const std::vector<T>& q, const std::vector<T>& k,
                   const std::vector<T>& v, const std::vector<T>& dout) {
  const int64_t kvs = s.Tk * s.Hkv * s.D;
  std::vector<T> out(q.size()), lse(s.B * s.Hq * s.Tq);
  cpu::attention_forward<T>(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, 0, scale, q.data(), k.data(),
                            v.data(), kvs, out.data(), lse.data());
  // Outputs start as garbage: backward writes (=) all of them.
  std::vector<T> dq(q.size(), T(5)), dk(k.size(), T(5)), dv(v.size(), T(5));
  cpu::attention_backward<T>(s.B, s.Tq, s.Hq, s.Hkv, s.D, scale, q.data(), k.data(), v.data(),
                             out.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data());
  return {to_f64(dq), to_f64(dk), to_f64(dv)};
}

const std::vector<Shape> kBackwardShapes = {
    {1, 1, 1, 1, 1, 1, 0}, {1, 5, 5, 2, 1, 3, 0},   {2, 9, 9, 4, 2, 4, 0},
    {2, 6, 6, 3, 3, 5, 0}, {1, 70, 70, 2, 1, 2, 0},  // crosses the 64-row block
};

TEST(Attention, BackwardFiniteDifferences) {
  for (const auto& s : kBackwardShapes) {
    const double scale = 1.0 / std::sqrt(double(s.D));
    const int64_t kv_n = s.B * s.Tk * s.Hkv * s.D;
    const auto q = random_normal_vec<double>(s.B * s.Tq * s.Hq * s.D, 10 + s.Tq);
    const auto k = random_normal_vec<double>(kv_n, 20 + s.Tq);
    const auto v = random_normal_vec<double>(kv_n, 30 + s.Tq);
    const auto dout = random_normal_vec<double>(q.size(), 40 + s.Tq);
    const Grads a = run_backward<double>(s, scale, q, k, v, dout);
    const Grads n = fd_grads(s, scale, q, k, v, dout);
    EXPECT_TRUE(all_close(a.dq, n.dq, 1e-8, 1e-6)) << "dq T=" << s.Tq << " Hq=" << s.Hq;
    EXPECT_TRUE(all_close(a.dk, n.dk, 1e-8, 1e-6)) << "dk T=" << s.Tq << " Hq=" << s.Hq;
    EXPECT_TRUE(all_close(a.dv, n.dv, 1e-8, 1e-6)) << "dv T=" << s.Tq << " Hq=" << s.Hq;
  }
}

// Float backward on training-like shapes against the (finite-difference-checked) double kernel
// on the same inputs, and bitwise equal across thread counts.
TEST(Attention, BackwardFloatMatchesDoubleAndIsDeterministic) {
  for (const auto level : supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    SCOPED_TRACE(std::string(cpu::cpu_isa_name(level)));
    for (const Shape& s : {Shape{2, 130, 130, 6, 2, 16, 0}, Shape{3, 64, 64, 6, 6, 48, 0},
                           Shape{2, 128, 128, 4, 4, 48, 0}}) {
      const double scale = 1.0 / std::sqrt(double(s.D));
      const int64_t kv_n = s.B * s.Tk * s.Hkv * s.D;
      const auto q = random_normal_vec<float>(s.B * s.Tq * s.Hq * s.D, 1);
      const auto k = random_normal_vec<float>(kv_n, 2);
      const auto v = random_normal_vec<float>(kv_n, 3);
      const auto dout = random_normal_vec<float>(q.size(), 4);
      const Grads f = run_backward<float>(s, scale, q, k, v, dout);
      const Grads d = run_backward<double>(s, scale, to_f64(q), to_f64(k), to_f64(v), to_f64(dout));
      EXPECT_TRUE(all_close(f.dq, d.dq, 1e-4, 1e-4));
      EXPECT_TRUE(all_close(f.dk, d.dk, 1e-4, 1e-4));
      EXPECT_TRUE(all_close(f.dv, d.dv, 1e-4, 1e-4));
      const int nt = omp_get_max_threads();
      omp_set_num_threads(nt == 1 ? 3 : 1);
      const Grads f1 = run_backward<float>(s, scale, q, k, v, dout);
      omp_set_num_threads(nt);
      EXPECT_EQ(f.dq, f1.dq);
      EXPECT_EQ(f.dk, f1.dk);
      EXPECT_EQ(f.dv, f1.dv);
    }
  }
}

TEST(Attention, BadArgumentsThrow) {
  std::vector<float> buf(4096);
  float* p = buf.data();
  // Hq not a multiple of Hkv
  EXPECT_THROW(cpu::attention_forward<float>(1, 2, 2, 3, 2, 4, 0, 0.5, p, p, p, 16, p, p), Error);
  // queries need keys past Tk
  EXPECT_THROW(cpu::attention_forward<float>(1, 4, 4, 2, 2, 4, 1, 0.5, p, p, p, 32, p, p), Error);
  EXPECT_THROW(cpu::attention_forward<float>(1, 5, 4, 2, 2, 4, 0, 0.5, p, p, p, 32, p, p), Error);
  // cache stride smaller than one batch of keys
  EXPECT_THROW(cpu::attention_forward<float>(2, 1, 4, 2, 2, 4, 3, 0.5, p, p, p, 16, p, p), Error);
  EXPECT_THROW(cpu::attention_backward<float>(1, 4, 4, 3, 4, 0.5, p, p, p, p, p, p, p, p, p),
               Error);
}

}  // namespace
}  // namespace kiln
