// The native bf16 CPU kernels of attention (forward, KV-cache decode, backward), cross-entropy and
// the mixed-precision AdamW, at every ISA level this machine supports (ScopedCpuIsa), against
// float64 references computed on the same bf16 inputs.
//
// Written-down bf16 tolerances (|got - ref| <= atol + rtol |ref|):
//   bf16 outputs (attention out, dq/dk/dv, dlogits): the final rounding alone is 2^-9 relative;
//     allowed atol = rtol = 2^-7 (attention out), and 2^-7 of the largest gradient entry plus
//     2^-7 relative for the gradients (their f32 sums over T keys cancel).
//   f32 statistics (attention lse, cross-entropy loss and lse), computed in f32 from exact bf16
//     inputs: 1e-4 (exp_fast and f32 sums over up to 32000 entries).
//   AdamW: bit-exact against the scalar adamw_update (kernels/common/adamw_scalars.h) on the f32
//     master, and the parameter equal to the master rounded to bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/common/adamw_scalars.h"
#include "kernels/common/half.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/optimizer.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
KILN_OP_TESTED(Op::Attention);
KILN_OP_TESTED(Op::CrossEntropy);
KILN_OP_TESTED(Op::AdamW);

namespace {
using namespace kiln::test;

constexpr double kBf16Out = 1.0 / 128;  // 2^-7
constexpr double kStat = 1e-4;

std::vector<bf16> to_bf16(const std::vector<double>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16(float(x[i]));
  return out;
}
std::vector<double> bf16_f64(const std::vector<bf16>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_float(x[i]);
  return out;
}
double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

// Runs body once per ISA level from scalar up to what this machine has.
template <class F>
void at_every_isa(F&& body) {
  for (cpu::CpuIsa level : test::supported_levels()) {
    cpu::ScopedCpuIsa cap(level);
    SCOPED_TRACE(std::string("isa ") + std::string(cpu::cpu_isa_name(level)));
    body();
  }
}

struct AttnCase {
  int64_t B, Tq, Tk, Hq, Hkv, D, q_offset;
};
std::string str(const AttnCase& s) {
  return "B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq) +
         " Tk=" + std::to_string(s.Tk) + " Hq=" + std::to_string(s.Hq) +
         " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D) +
         " q_offset=" + std::to_string(s.q_offset);
}

// ---- attention forward ------------------------------------------------------------------------

const std::vector<AttnCase> kForward = {
    {2, 7, 7, 4, 2, 5, 0},       // odd D: the widening path at every level
    {2, 33, 33, 6, 6, 48, 0},    // training, MHA
    {1, 130, 130, 4, 1, 32, 0},  // 64 + 64 + 2 rows, MQA
    {1, 70, 100, 3, 1, 16, 30},  // chunked prefill
    // D % 32 == 0 and Tq > 1: the AMX tile blocks at the amx level (attention_amx.cpp)
    {2, 150, 150, 4, 2, 64, 0},     // training, GQA, blocks of 64 + 64 + 22 rows
    {1, 200, 237, 16, 8, 128, 37},  // chunked prefill, Qwen3's heads, kend not a multiple of 32
    {1, 3, 45, 4, 2, 32, 42},       // three queries after a cache (one row pair, 13 pad keys)
    {2, 5, 40, 4, 2, 8, 10},        // queries short of the last keys
    {3, 1, 70, 8, 2, 16, 69},       // decode, grouped heads
    {2, 1, 33, 6, 6, 32, 32},       // decode, MHA (one row)
    {1, 1, 129, 6, 1, 128, 128},    // decode, MQA, large D (rows 4 + 2)
    {1, 1, 50, 3, 1, 80, 49},       // decode, 3 rows, D = 64 + 16
    {2, 1, 20, 4, 4, 48, 19},       // decode, MHA, D = 48 (stories15M's)
    {1, 1, 30, 4, 2, 24, 29},       // decode, D = 24: 8-lane tails only at AVX2, widened at AVX-512
    {1, 1, 9, 2, 1, 12, 8},         // decode, D = 12 (not a multiple of 8): widened tiles
};

// The forward on storage T (bf16, or f16 for an f16 model's prefill and decode: the same kernel
// with f16 rows widened by F16C) against f64 on the same rounded inputs, at every level; out_tol:
// the output's bound (its own rounding dominates: half an ulp is 2^-9 for bf16, 2^-11 for f16,
// doubled). seed: the inputs' seed offset.
template <class T>
void check_forward_at_every_isa(double out_tol, uint64_t seed) {
  const auto to_t = [](const std::vector<double>& x) {
    std::vector<T> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = cpu::from_compute<T>(float(x[i]));
    return out;
  };
  const auto t_f64 = [](const std::vector<T>& x) {
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = cpu::to_compute(x[i]);
    return out;
  };
  for (const AttnCase& s : kForward) {
    const int64_t Tmax = s.Tk + 5;  // a KV cache with capacity past Tk; its tail holds NaN
    const int64_t kvs = Tmax * s.Hkv * s.D;
    const double scale = 1.0 / std::sqrt(double(s.D));
    auto q = to_t(random_normal_vec<double>(s.B * s.Tq * s.Hq * s.D, seed + 1 + s.Tq + s.D));
    auto k = to_t(random_normal_vec<double>(s.B * kvs, seed + 2 + s.Tk));
    auto v = to_t(random_normal_vec<double>(s.B * kvs, seed + 3 + s.Hq));
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t e = (s.q_offset + s.Tq) * s.Hkv * s.D; e < kvs; ++e)
        k[b * kvs + e] = v[b * kvs + e] =
            cpu::from_compute<T>(std::numeric_limits<float>::quiet_NaN());
    std::vector<double> out_r(q.size()), lse_r(s.B * s.Hq * s.Tq);
    const auto qd = t_f64(q), kd = t_f64(k), vd = t_f64(v);
    cpu::attention_forward<double>(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_offset, scale, qd.data(),
                                   kd.data(), vd.data(), kvs, out_r.data(), lse_r.data());
    at_every_isa([&] {
      std::vector<T> out(q.size(), cpu::from_compute<T>(7.0f));
      std::vector<float> lse(lse_r.size(), 7.0f);
      cpu::attention_forward<T>(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.q_offset, scale, q.data(),
                                k.data(), v.data(), kvs, out.data(), lse.data());
      EXPECT_TRUE(all_close(t_f64(out), out_r, out_tol, out_tol)) << str(s);
      EXPECT_TRUE(all_close(lse, lse_r, kStat, kStat)) << str(s);
    });
  }
}

TEST(AttentionBf16, ForwardMatchesFloat64AtEveryIsa) {
  check_forward_at_every_isa<bf16>(kBf16Out, 0);
}

// f16's output rounding is 2^-11, so its bound is 2^-10: the f32 arithmetic inside stays far
// below it at these D.
TEST(AttentionF16, ForwardMatchesFloat64AtEveryIsa) {
  check_forward_at_every_isa<f16>(1.0 / 1024, 10);
}

// The shapes above that the AMX blocks take at the amx level do take them (so the test keeps
// covering that path).
TEST(AttentionBf16, AmxBlocksTakeTrainingAndPrefillShapes) {
  if (cpu::cpu_isa_detected() < cpu::CpuIsa::Amx) GTEST_SKIP() << "no AMX on this machine";
  EXPECT_TRUE(cpu::attn::amx_forward_supported(200, 128));
  EXPECT_TRUE(cpu::attn::amx_forward_supported(3, 32));
  EXPECT_FALSE(cpu::attn::amx_forward_supported(1, 128));  // decode reads the cache directly
  EXPECT_FALSE(cpu::attn::amx_forward_supported(150, 48));
  cpu::ScopedCpuIsa cap(cpu::CpuIsa::Avx512Bf16);
  EXPECT_FALSE(cpu::attn::amx_forward_supported(200, 128));
}

// ---- attention backward -----------------------------------------------------------------------

TEST(AttentionBf16, BackwardMatchesFloat64AtEveryIsa) {
  for (const AttnCase& s : {AttnCase{2, 70, 70, 4, 2, 16, 0}, AttnCase{1, 33, 33, 3, 3, 48, 0},
                            AttnCase{2, 9, 9, 2, 1, 5, 0}}) {
    const double scale = 1.0 / std::sqrt(double(s.D));
    const int64_t qn = s.B * s.Tq * s.Hq * s.D, kvn = s.B * s.Tk * s.Hkv * s.D;
    const auto q = to_bf16(random_normal_vec<double>(qn, 11));
    const auto k = to_bf16(random_normal_vec<double>(kvn, 12));
    const auto v = to_bf16(random_normal_vec<double>(kvn, 13));
    const auto dout = to_bf16(random_normal_vec<double>(qn, 14));
    // Reference: the (finite-difference-checked) f64 kernel on the same bf16 values.
    const auto qd = bf16_f64(q), kd = bf16_f64(k), vd = bf16_f64(v), dod = bf16_f64(dout);
    std::vector<double> out_r(qn), lse_r(s.B * s.Hq * s.Tq), dq_r(qn), dk_r(kvn), dv_r(kvn);
    cpu::attention_forward<double>(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, 0, scale, qd.data(),
                                   kd.data(), vd.data(), s.Tk * s.Hkv * s.D, out_r.data(),
                                   lse_r.data());
    cpu::attention_backward<double>(s.B, s.Tq, s.Hq, s.Hkv, s.D, scale, qd.data(), kd.data(),
                                    vd.data(), out_r.data(), lse_r.data(), dod.data(), dq_r.data(),
                                    dk_r.data(), dv_r.data());
    at_every_isa([&] {
      // As in training: the bf16 forward's out and f32 lse feed the backward.
      std::vector<bf16> out(qn);
      std::vector<float> lse(lse_r.size());
      cpu::attention_forward<bf16>(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, 0, scale, q.data(), k.data(),
                                   v.data(), s.Tk * s.Hkv * s.D, out.data(), lse.data());
      const bf16 junk = float_to_bf16(5.0f);
      std::vector<bf16> dq(qn, junk), dk(kvn, junk), dv(kvn, junk);
      cpu::attention_backward<bf16>(s.B, s.Tq, s.Hq, s.Hkv, s.D, scale, q.data(), k.data(),
                                    v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                                    dk.data(), dv.data());
      EXPECT_TRUE(all_close(bf16_f64(dq), dq_r, kBf16Out * max_abs(dq_r), kBf16Out)) << str(s);
      EXPECT_TRUE(all_close(bf16_f64(dk), dk_r, kBf16Out * max_abs(dk_r), kBf16Out)) << str(s);
      EXPECT_TRUE(all_close(bf16_f64(dv), dv_r, kBf16Out * max_abs(dv_r), kBf16Out)) << str(s);
    });
  }
}

// ---- cross-entropy ----------------------------------------------------------------------------

TEST(CrossEntropyBf16, MatchesFloat64AtEveryIsaAndInPlace) {
  constexpr int32_t kIgnore = -100;
  // V past one stack chunk (4096) and not a multiple of it.
  for (const auto& shape : {std::pair<int64_t, int64_t>{7, 33}, {5, 9000}, {3, 32000}}) {
    // Named copies, not a structured binding: clang 14 cannot capture one in a lambda.
    const int64_t N = shape.first, V = shape.second;
    const auto logits = to_bf16(random_normal_vec<double>(N * V, N + V, 0.0, 4.0));
    auto targets = random_int_vec<int32_t>(N, 2 * N + V, 0, V);
    targets[1] = kIgnore;
    const auto dloss = random_uniform_vec<float>(N, 3 * N, 0.1, 1.0);
    const auto ld = bf16_f64(logits);
    const auto ls = ref_log_softmax(N, V, ld);
    std::vector<double> loss_r(N), lse_r(N), dl_r(N * V);
    for (int64_t n = 0; n < N; ++n) {
      lse_r[n] = ld[n * V] - ls[n * V];
      const bool ign = targets[n] == kIgnore;
      loss_r[n] = ign ? 0.0 : -ls[n * V + targets[n]];
      for (int64_t v = 0; v < V; ++v)
        dl_r[n * V + v] = ign ? 0.0 : dloss[n] * (std::exp(ls[n * V + v]) - (v == targets[n]));
    }
    at_every_isa([&] {
      std::vector<float> loss(N, -7.0f), lse(N);
      cpu::cross_entropy_forward<bf16>(N, V, logits.data(), targets.data(), kIgnore, loss.data(),
                                       lse.data());
      EXPECT_TRUE(all_close(loss, loss_r, kStat, kStat)) << N << "x" << V;
      EXPECT_TRUE(all_close(lse, lse_r, kStat, kStat)) << N << "x" << V;
      std::vector<bf16> dlogits(N * V, float_to_bf16(99.0f));
      cpu::cross_entropy_backward<bf16>(N, V, logits.data(), lse.data(), targets.data(), kIgnore,
                                        dloss.data(), dlogits.data());
      // Per row the largest gradient entry is at most dloss; atol is 2^-7 of that scale.
      EXPECT_TRUE(all_close(bf16_f64(dlogits), dl_r, kBf16Out * 1e-2, kBf16Out)) << N << "x" << V;
      std::vector<bf16> inplace = logits;
      cpu::cross_entropy_backward<bf16>(N, V, inplace.data(), lse.data(), targets.data(), kIgnore,
                                        dloss.data(), inplace.data());
      EXPECT_EQ(0, std::memcmp(inplace.data(), dlogits.data(), inplace.size() * sizeof(bf16)));
    });
  }
}

// ---- AdamW with f32 masters -------------------------------------------------------------------

// bf16 parameters with f32 masters, gradients in bf16 or f32, over several steps: the master,
// m and v equal, bit for bit, the scalar adamw_update applied to the same widened gradients,
// and the parameter is the master rounded to bf16.
template <typename G>
void check_adamw_master() {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099), int64_t(40001)}) {
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    std::vector<float> master = random_uniform_vec<float>(n, 5 + n), m(n, 0.f), v(n, 0.f);
    std::vector<bf16> param(n);
    for (int64_t i = 0; i < n; ++i) param[i] = float_to_bf16(master[i]);
    std::vector<float> master_r = master, m_r = m, v_r = v;
    for (int64_t step = 1; step <= 4; ++step) {
      const auto g64 = random_normal_vec<double>(n, 50 * step + n, 0, step == 2 ? 1e-3 : 1);
      std::vector<G> grad(n);
      std::vector<float> g32(n);
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<G, bf16>) {
          grad[i] = float_to_bf16(float(g64[i]));
          g32[i] = bf16_to_float(grad[i]);
        } else {
          grad[i] = g32[i] = float(g64[i]);
        }
      }
      cpu::adamw_step_master<bf16, G>(n, param.data(), master.data(), grad.data(), m.data(),
                                      v.data(), lr, b1, b2, eps, wd, step);
      const AdamWConsts c = adamw_consts(lr, b1, b2, eps, step);
      const float decay = adamw_decay(lr, wd);
      for (int64_t i = 0; i < n; ++i)
        master_r[i] = adamw_update(master_r[i], g32[i], m_r[i], v_r[i], decay, c);
    }
    EXPECT_EQ(0, std::memcmp(master.data(), master_r.data(), n * sizeof(float))) << "n " << n;
    EXPECT_EQ(0, std::memcmp(m.data(), m_r.data(), n * sizeof(float))) << "n " << n;
    EXPECT_EQ(0, std::memcmp(v.data(), v_r.data(), n * sizeof(float))) << "n " << n;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(param[i].bits, float_to_bf16(master[i]).bits) << "n " << n << " at " << i;
  }
}

TEST(AdamWBf16, MasterUpdateIsBitExactAtEveryIsa) {
  at_every_isa([] {
    check_adamw_master<bf16>();
    check_adamw_master<float>();
  });
}

}  // namespace
}  // namespace kiln
