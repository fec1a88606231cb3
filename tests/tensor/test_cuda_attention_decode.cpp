// The CUDA decode attention kernel's work split, replayed on the CPU (no GPU needed): every
// (split, warp, round, key-in-flight) slot of decode_fwd_kernel, as planned by
// plan_attention_forward, covers each visible key exactly once, and the per-warp online softmax,
// the CTA's warp merge and combine_splits_kernel's split merge give the CPU reference. The GPU
// run of the kernel itself is CudaAttentionGpu.DecodeKernelMatchesTheCpuAndTheGenericKernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "tests/tensor/attention_shape.h"

namespace kiln {
namespace {

using cuda::AttentionPath;
using cuda::AttentionPlan;
using cuda::AttentionShape;
using test_attention::shape;

constexpr int kWarps = cuda::kDecodeThreads / 32;
constexpr int kInFlight = 4;  // decode_fwd_kernel's kDecodeKeysInFlight

struct Partial {  // a warp's, a CTA's or a split's (o, m, l)
  std::vector<double> o;
  double m = -INFINITY, l = 0;
};

// Merges partials as the kernels do: M = max m, L = sum l e^(m - M), O = sum o e^(m - M).
Partial merge(const std::vector<Partial>& parts, int64_t D) {
  Partial r;
  r.o.assign(static_cast<size_t>(D), 0.0);
  for (const Partial& p : parts) r.m = std::max(r.m, p.m);
  for (const Partial& p : parts) {
    const double f = std::exp(p.m - r.m);  // 0 for a warp that saw no key
    r.l += p.l * f;
    for (int64_t d = 0; d < D; ++d) r.o[d] += p.o[d] * f;
  }
  return r;
}

TEST(CudaAttentionDecodeReplay, SplitsWarpsAndRoundsCoverEveryKeyOnceAndMergeToTheCpu) {
  for (const AttentionShape s :
       {shape(1, 1, 1, 8, 2, 64), shape(2, 1, 5, 8, 2, 64, 4, 40 * 2 * 64),
        shape(1, 1, 70, 32, 8, 128, 69), shape(1, 1, 1000, 4, 4, 32, 999),
        shape(3, 1, 333, 4, 1, 128, 332, 400 * 128), shape(1, 1, 4096, 32, 8, 128, 4095)}) {
    const AttentionPlan p = cuda::plan_attention_forward(s, true, true, 132);
    ASSERT_EQ(p.path, AttentionPath::Decode);
    ASSERT_EQ(p.grid[0], p.splits);
    const int64_t keys = s.q_offset + 1, G = s.Hq / s.Hkv, D = s.D;
    std::mt19937_64 gen(77);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<float> q(static_cast<size_t>(s.B * s.Hq * D)),
        k(static_cast<size_t>(s.B * s.kv_batch_stride)), v(k.size());
    for (auto* x : {&q, &k, &v})
      for (float& e : *x) e = dist(gen);
    const float scale = 1.f / std::sqrt(float(D));
    std::vector<float> ref_out(q.size()), ref_lse(static_cast<size_t>(s.B * s.Hq));
    cpu::attention_forward<float>(s.B, 1, s.Tk, s.Hq, s.Hkv, D, s.q_offset, scale, q.data(),
                                  k.data(), v.data(), s.kv_batch_stride, ref_out.data(),
                                  ref_lse.data());
    double num = 0, den = 0, lnum = 0, lden = 0;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.Hq; ++h) {
        const int64_t hk = h / G;
        std::vector<int> seen(static_cast<size_t>(keys), 0);
        std::vector<Partial> splits;
        for (int64_t split = 0; split < p.splits; ++split) {
          const int64_t lo = split * p.keys_per_split;
          const int64_t hi = std::min(keys, lo + p.keys_per_split);
          ASSERT_LT(lo, hi) << "split " << split << " is empty";
          std::vector<Partial> warps;
          for (int w = 0; w < kWarps; ++w) {
            Partial pw;
            pw.o.assign(static_cast<size_t>(D), 0.0);
            for (int64_t j0 = lo + w; j0 < hi; j0 += kWarps * kInFlight) {
              double sc[kInFlight], mx = pw.m;
              for (int u = 0; u < kInFlight; ++u) {
                const int64_t j = j0 + u * kWarps;
                sc[u] = -INFINITY;
                if (j >= hi) continue;
                ++seen[static_cast<size_t>(j)];
                const float* kr =
                    &k[static_cast<size_t>(b * s.kv_batch_stride + (j * s.Hkv + hk) * D)];
                double a = 0;
                for (int64_t d = 0; d < D; ++d)
                  a += q[static_cast<size_t>((b * s.Hq + h) * D + d)] * scale * kr[d];
                sc[u] = a;
                mx = std::max(mx, a);
              }
              const double corr = std::exp(pw.m - mx);
              pw.l *= corr;
              for (double& o : pw.o) o *= corr;
              for (int u = 0; u < kInFlight; ++u) {
                const int64_t j = j0 + u * kWarps;
                if (j >= hi) continue;
                const double pr = std::exp(sc[u] - mx);
                pw.l += pr;
                const float* vr =
                    &v[static_cast<size_t>(b * s.kv_batch_stride + (j * s.Hkv + hk) * D)];
                for (int64_t d = 0; d < D; ++d) pw.o[d] += pr * vr[d];
              }
              pw.m = mx;
            }
            warps.push_back(pw);
          }
          splits.push_back(merge(warps, D));
        }
        for (int64_t j = 0; j < keys; ++j)
          ASSERT_EQ(seen[static_cast<size_t>(j)], 1) << "key " << j;
        const Partial all = merge(splits, D);
        for (int64_t d = 0; d < D; ++d) {
          const double want = ref_out[static_cast<size_t>((b * s.Hq + h) * D + d)];
          num += (all.o[d] / all.l - want) * (all.o[d] / all.l - want);
          den += want * want;
        }
        const double lse = all.m + std::log(all.l), lw = ref_lse[static_cast<size_t>(b * s.Hq + h)];
        lnum += (lse - lw) * (lse - lw);
        lden += lw * lw;
      }
    EXPECT_LT(num / den, 1e-10) << "keys " << keys;
    EXPECT_LT(lnum / std::max(lden, 1e-12), 1e-12) << "keys " << keys;
  }
}

}  // namespace
}  // namespace kiln
