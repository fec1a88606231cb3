// bf16 GEMM (kernels/cpu/matmul_dnnl.h) against a float64 reference, at every ISA level this
// machine supports: ScopedCpuIsa picks kiln's path (oneDNN at Amx, widened blocks through sgemm
// below); oneDNN's own kernel is capped per process by KILN_CPU_ISA, so tests/CMakeLists.txt
// also runs this file under KILN_CPU_ISA=avx512bf16, where the oneDNN-path test checks oneDNN's
// vdpbf16ps brgemm instead of AMX.
//
// Tolerance. Inputs are exact bf16 values, so every product a*b (8-bit mantissas) is exact in
// f32; the error is the f32 accumulation of K terms, the alpha/beta/bias arithmetic, and one
// rounding of C:
//   |C - C_ref| <= (K + 3) * 2^-24 * S  +  r * |C_ref|,
//   S = |alpha| * sum_k |a_ik b_kj| + |beta * C0_ij| + |bias_j|,
//   r = 2^-8 for a bf16 C (round to nearest: 2^-9 of |C|, doubled for |C| vs |C_ref|), 0 for f32.
// The first term is the standard worst-case bound for recursive f32 summation (gamma_{K+3});
// blocked or pairwise orders (oneDNN's, OpenBLAS's) stay below it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/half.h"
#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul_dnnl.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using cpu::Bf16Gemm;
using cpu::CpuIsa;
using cpu::GemmElt;

// Levels from Scalar up to the detected one. A KILN_CPU_ISA above the detected level would make
// every cpu_isa() call throw: such a run has nothing to test and skips.
std::vector<CpuIsa> levels_or_skip(bool* skip) {
  *skip = false;
  if (const char* v = std::getenv("KILN_CPU_ISA"); v != nullptr && *v != '\0') {
    const CpuIsa want = cpu::parse_cpu_isa(v);
    if (static_cast<int>(want) > static_cast<int>(cpu::cpu_isa_detected())) {
      *skip = true;
      return {};
    }
  }
  std::vector<CpuIsa> out;
  for (int l = 0; l <= static_cast<int>(cpu::cpu_isa()); ++l) out.push_back(static_cast<CpuIsa>(l));
  return out;
}

#define KILN_FOR_EACH_LEVEL(level)                                                \
  bool skip_ = false;                                                             \
  const std::vector<CpuIsa> levels_ = levels_or_skip(&skip_);                     \
  if (skip_) GTEST_SKIP() << "KILN_CPU_ISA asks for more than this CPU supports"; \
  for (CpuIsa level : levels_)

// The 16-bit input type of a GEMM: its C rounding and the kernel that runs it (conversions are
// bf16_util.h's to_compute / from_compute).
template <typename H>
struct HalfGemm;
template <>
struct HalfGemm<bf16> {
  static constexpr const char* kName = "bf16";
  // Rounding of a 16-bit C: half an ulp (2^-9 of |C|), doubled for |C| vs |C_ref|; bf16 has f32's
  // exponent range, so no absolute term.
  static constexpr double kRel = 0x1p-8, kAbs = 0.0;
  static int64_t scratch_bytes(const Bf16Gemm& g) { return cpu::bf16_gemm_scratch_bytes(g); }
  static std::string impl(const Bf16Gemm& g) { return cpu::bf16_gemm_impl(g); }
  static void run(const Bf16Gemm& g, const bf16* a, const bf16* b, void* c, const void* bias,
                  void* scratch, int64_t bytes) {
    cpu::bf16_gemm(g, a, b, c, bias, scratch, bytes);
  }
};
template <>
struct HalfGemm<f16> {
  static constexpr const char* kName = "f16";
  // Half an ulp is 2^-11 of |C|, doubled; f16 subnormals are 2^-24 apart.
  static constexpr double kRel = 0x1p-10, kAbs = 0x1p-24;
  static int64_t scratch_bytes(const Bf16Gemm& g) { return cpu::f16_gemm_scratch_bytes(g); }
  static std::string impl(const Bf16Gemm&) { return "widen+sgemm"; }
  static void run(const Bf16Gemm& g, const f16* a, const f16* b, void* c, const void* bias,
                  void* scratch, int64_t bytes) {
    cpu::f16_gemm(g, a, b, c, bias, scratch, bytes);
  }
};

// n uniform values rounded to H (exact inputs for the f64 reference).
template <typename H>
std::vector<H> random_half(int64_t n, uint64_t seed) {
  const auto f = test::random_uniform_vec<float>(n, seed);
  std::vector<H> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = cpu::from_compute<H>(f[i]);
  return out;
}

// C or bias (the whole buffer, batch entries at stride_c) in f32 or H, read back in f64.
template <typename H>
struct HalfOrF32 {
  GemmElt type;
  std::vector<H> h;
  std::vector<float> f;
  HalfOrF32(GemmElt t, int64_t n, uint64_t seed) : type(t), h(random_half<H>(n, seed)) {
    if (type == GemmElt::F32) {  // the same exact values in f32
      for (H x : h) f.push_back(cpu::to_compute(x));
      h.clear();
    }
  }
  void* data() { return type == GemmElt::F32 ? static_cast<void*>(f.data()) : h.data(); }
  double at(int64_t i) const {
    return type == GemmElt::F32 ? double(f[i]) : double(cpu::to_compute(h[i]));
  }
  void poison(int64_t i) {
    if (type == GemmElt::F32)
      f[i] = NAN;
    else
      h[i] = cpu::from_compute<H>(NAN);
  }
};

std::string describe(const Bf16Gemm& g, CpuIsa level, const std::string& impl);

// Runs one case of H's GEMM at the current level and checks every element of every batch entry
// against the bound above (r = HalfGemm<H>::kRel, plus kAbs, for a 16-bit C). Elements between
// rows (padding) must be left alone.
template <typename H = bf16>
void check_case(Bf16Gemm g, int pad, uint64_t seed, CpuIsa level) {
  using T = HalfGemm<H>;
  const int64_t a_rows = g.trans_a ? g.K : g.M, a_cols = g.trans_a ? g.M : g.K;
  const int64_t b_rows = g.trans_b ? g.N : g.K, b_cols = g.trans_b ? g.K : g.N;
  g.lda = std::max<int64_t>(a_cols, 1) + pad;
  g.ldb = std::max<int64_t>(b_cols, 1) + pad;
  g.ldc = std::max<int64_t>(g.N, 1) + pad;
  const int64_t a_mat = a_rows * g.lda, b_mat = b_rows * g.ldb, c_mat = g.M * g.ldc;
  const int64_t a_count = g.stride_a == 0 ? 1 : g.batch, b_count = g.stride_b == 0 ? 1 : g.batch;
  if (g.stride_a != 0) g.stride_a = a_mat;
  if (g.stride_b != 0) g.stride_b = b_mat;
  g.stride_c = g.batch > 1 ? c_mat : 0;
  const std::string what = std::string(T::kName) + " " + describe(g, level, T::impl(g));
  const auto A = random_half<H>(std::max<int64_t>(a_count * a_mat, 1), seed);
  const auto B = random_half<H>(std::max<int64_t>(b_count * b_mat, 1), seed + 1);
  HalfOrF32<H> C(g.c_type, std::max<int64_t>(g.batch * c_mat, 1), seed + 2);
  if (g.beta == 0.0f)  // beta == 0 must not read C: poison it
    for (int64_t i = 0; i < g.batch * c_mat; ++i) C.poison(i);
  const HalfOrF32<H> C0 = C;
  HalfOrF32<H> bias(g.bias_type, std::max<int64_t>(g.N, 1), seed + 3);

  const int64_t scratch_bytes = T::scratch_bytes(g);
  std::vector<std::byte> scratch(static_cast<size_t>(scratch_bytes) + 64);
  void* sp = scratch.data() + (64 - reinterpret_cast<std::uintptr_t>(scratch.data()) % 64) % 64;
  T::run(g, A.data(), B.data(), C.data(), g.has_bias ? bias.data() : nullptr, sp, scratch_bytes);

  const bool half_c = g.c_type != GemmElt::F32;
  const double u32 = std::ldexp(1.0, -24);
  const auto val = [](const std::vector<H>& v, int64_t i) { return double(cpu::to_compute(v[i])); };
  int bad = 0;
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.ldc; ++j) {
        const int64_t at = b * g.stride_c + i * g.ldc + j;
        if (j >= g.N) {  // padding: untouched (C0's value; NaN-poisoned when beta == 0)
          const bool same = std::isnan(C0.at(at)) ? std::isnan(C.at(at)) : C.at(at) == C0.at(at);
          if (!same && bad++ < 5) ADD_FAILURE() << what << " padding changed";
          continue;
        }
        double s = 0, sa = 0;
        for (int64_t k = 0; k < g.K; ++k) {
          const double a = g.trans_a ? val(A, b * g.stride_a + k * g.lda + i)
                                     : val(A, b * g.stride_a + i * g.lda + k);
          const double bb = g.trans_b ? val(B, b * g.stride_b + j * g.ldb + k)
                                      : val(B, b * g.stride_b + k * g.ldb + j);
          s += a * bb;
          sa += std::abs(a * bb);
        }
        const double c0 = g.beta == 0.0f ? 0.0 : double(g.beta) * C0.at(at);
        const double bj = g.has_bias ? bias.at(j) : 0.0;
        const double ref = double(g.alpha) * s + c0 + bj;
        const double bound =
            double(g.K + 3) * u32 * (std::abs(double(g.alpha)) * sa + std::abs(c0) + std::abs(bj)) +
            (half_c ? T::kRel * std::abs(ref) + T::kAbs : 0.0);
        const double got = C.at(at);
        if (!(std::abs(got - ref) <= bound) && bad++ < 5)
          ADD_FAILURE() << what << " batch " << b << " C[" << i << "," << j << "] = " << got
                        << ", reference " << ref << ", bound " << bound;
      }
}

const char* elt_name(GemmElt t) {
  return t == GemmElt::F32 ? "f32" : t == GemmElt::F16 ? "f16" : "bf16";
}

std::string describe(const Bf16Gemm& g, CpuIsa level, const std::string& impl) {
  return fmt::format(
      "[{} {}] {}{} M={} N={} K={} batch={} sa={} sb={} alpha={} beta={} c={} bias={}",
      cpu::cpu_isa_name(level), impl, g.trans_a ? "T" : "N", g.trans_b ? "T" : "N", g.M, g.N, g.K,
      g.batch, g.stride_a, g.stride_b, g.alpha, g.beta, elt_name(g.c_type),
      g.has_bias ? elt_name(g.bias_type) : "none");
}

TEST(Bf16Gemm, TransposesOddSizesAtEveryLevel) {
  uint64_t seed = 1;
  KILN_FOR_EACH_LEVEL(level) {
    cpu::ScopedCpuIsa cap(level);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int64_t M : {1, 7, 33, 257})
          for (int64_t N : {1, 7, 257})
            for (int64_t K : {1, 33, 257}) {
              Bf16Gemm g;
              g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K;
              check_case(g, 0, seed += 5, level);
            }
  }
}

TEST(Bf16Gemm, AlphaBetaPaddingOutputsAndBiasAtEveryLevel) {
  uint64_t seed = 1000;
  KILN_FOR_EACH_LEVEL(level) {
    cpu::ScopedCpuIsa cap(level);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (GemmElt c_type : {GemmElt::BF16, GemmElt::F32}) {
          Bf16Gemm g;
          g.trans_a = ta, g.trans_b = tb, g.M = 33, g.N = 17, g.K = 300, g.c_type = c_type;
          g.alpha = 0.5f, g.beta = 1.0f;  // accumulate (linear's dW += g^T x)
          check_case(g, 3, seed += 5, level);
          g.alpha = -2.0f, g.beta = 0.25f;
          check_case(g, 5, seed += 5, level);
          g.alpha = 1.0f, g.beta = 0.0f, g.has_bias = true;
          for (GemmElt bias_type : {GemmElt::BF16, GemmElt::F32}) {
            g.bias_type = bias_type;
            check_case(g, 1, seed += 5, level);
          }
          g.beta = 1.0f;  // bias and accumulation together
          check_case(g, 0, seed += 5, level);
        }
  }
}

TEST(Bf16Gemm, BatchesWithStridesAndBroadcastAtEveryLevel) {
  uint64_t seed = 2000;
  KILN_FOR_EACH_LEVEL(level) {
    cpu::ScopedCpuIsa cap(level);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int broadcast = 0; broadcast < 4; ++broadcast)  // none, A, B, both shared
          for (int pad : {0, 2}) {
            Bf16Gemm g;
            g.trans_a = ta, g.trans_b = tb, g.M = 7, g.N = 33, g.K = 65, g.batch = 5;
            g.stride_a = broadcast == 1 || broadcast == 3 ? 0 : 1;  // 1: check_case sets it
            g.stride_b = broadcast == 2 || broadcast == 3 ? 0 : 1;
            check_case(g, pad, seed += 5, level);
            g.c_type = GemmElt::F32, g.beta = 0.5f;
            check_case(g, pad, seed += 5, level);
          }
  }
}

TEST(Bf16Gemm, ZeroSizesAndKZero) {
  KILN_FOR_EACH_LEVEL(level) {
    cpu::ScopedCpuIsa cap(level);
    // K == 0: C = beta * C + bias; beta == 0 overwrites NaN.
    Bf16Gemm g;
    g.M = 2, g.N = 3, g.K = 0, g.lda = 1, g.ldb = 3, g.ldc = 3, g.beta = 0.0f;
    std::vector<bf16> A(1), B(3), C(6, float_to_bf16(NAN));
    EXPECT_EQ(cpu::bf16_gemm_scratch_bytes(g), 0);
    cpu::bf16_gemm(g, A.data(), B.data(), C.data(), nullptr, nullptr, 0);
    for (bf16 c : C) EXPECT_EQ(bf16_to_float(c), 0.0f);
    g.beta = 0.5f, g.has_bias = true;
    std::vector<bf16> bias = {float_to_bf16(1.f), float_to_bf16(2.f), float_to_bf16(3.f)};
    std::vector<bf16> C2(6, float_to_bf16(4.f));
    cpu::bf16_gemm(g, A.data(), B.data(), C2.data(), bias.data(), nullptr, 0);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(bf16_to_float(C2[i]), 2.0f + float(i % 3 + 1));
    // M == 0 / batch == 0: nothing to do, nothing touched.
    g.M = 0;
    cpu::bf16_gemm(g, A.data(), B.data(), nullptr, nullptr, nullptr, 0);
  }
}

TEST(Bf16Gemm, RefusesBadArgumentsAndShortScratch) {
  Bf16Gemm g;
  g.M = 64, g.N = 64, g.K = 64, g.lda = 63, g.ldb = 64, g.ldc = 64;
  try {
    cpu::bf16_gemm_scratch_bytes(g);
    ADD_FAILURE() << "lda < K accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[bf16_gemm] lda 63 < 64"), std::string::npos) << e.what();
  }
  g.lda = 64, g.alpha = 2.0f, g.has_bias = true;
  EXPECT_THROW(cpu::bf16_gemm_scratch_bytes(g), Error);  // bias needs alpha 1
  g.alpha = 1.0f, g.has_bias = false;
  const int64_t need = cpu::bf16_gemm_scratch_bytes(g);
  if (need == 0)
    GTEST_SKIP() << "this path needs no scratch for 64^3 (" << cpu::bf16_gemm_impl(g) << ")";
  std::vector<bf16> A(64 * 64), B(64 * 64), C(64 * 64);
  std::vector<std::byte> scratch(static_cast<size_t>(need));
  EXPECT_THROW(cpu::bf16_gemm(g, A.data(), B.data(), C.data(), nullptr, scratch.data(), need - 1),
               Error);
}

// f16_gemm (the f16 model's prefill and Linear backward): f16 A and B widened by F16C, sgemm, C f16
// or f32, f16 bias; the same check with HalfGemm<f16>'s rounding of C.
TEST(F16Gemm, TransposesAlphaBetaBiasAtEveryLevel) {
  uint64_t seed = 5000;
  KILN_FOR_EACH_LEVEL(level) {
    cpu::ScopedCpuIsa cap(level);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (GemmElt c_type : {GemmElt::F16, GemmElt::F32})
          for (int64_t M : {1, 9, 260})
            for (int64_t K : {1, 37, 300}) {
              Bf16Gemm g;
              g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = 19, g.K = K, g.c_type = c_type;
              g.bias_type = GemmElt::F16;
              check_case<f16>(g, 1, seed += 5, level);
              g.alpha = 0.5f, g.beta = 1.0f;
              check_case<f16>(g, 2, seed += 5, level);
              g.alpha = 1.0f, g.beta = 0.0f, g.has_bias = true;
              check_case<f16>(g, 3, seed += 5, level);
            }
  }
  Bf16Gemm g;
  g.M = g.N = g.K = 4, g.lda = g.ldb = g.ldc = 4, g.c_type = GemmElt::BF16;
  EXPECT_THROW(cpu::f16_gemm(g, nullptr, nullptr, nullptr, nullptr, nullptr, 0), Error);
}

// The primitive cache: the second call with the same problem creates nothing.
TEST(Bf16Gemm, PrimitivesAreCachedByProblem) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::Onednn)
    GTEST_SKIP() << "no oneDNN bf16 path at " << cpu::cpu_isa_name(cpu::cpu_isa());
  cpu::onednn_cache_clear();
  Bf16Gemm g;
  g.M = 40, g.N = 24, g.K = 16, g.lda = 16, g.ldb = 24, g.ldc = 24;
  const auto before = cpu::onednn_cache_stats();
  cpu::bf16_gemm_scratch_bytes(g);
  cpu::bf16_gemm_scratch_bytes(g);
  const auto after = cpu::onednn_cache_stats();
  EXPECT_EQ(after.created - before.created, 1);
  EXPECT_EQ(after.hits - before.hits, 1);
  g.ldb = 32;  // another stride is another primitive
  cpu::bf16_gemm_scratch_bytes(g);
  EXPECT_EQ(cpu::onednn_cache_stats().created - before.created, 2);
}

// oneDNN's kernels below AMX are not kiln's path (docs/cpu_gemm.md), but stay correct: forced
// onto the oneDNN path, the run under KILN_CPU_ISA=avx512bf16 (tests/CMakeLists.txt) checks
// brg:avx512_core_bf16, and one under KILN_CPU_ISA=avx512 would check oneDNN's emulation.
TEST(Bf16Gemm, OnednnPathMatchesTheReferenceWhereverItRuns) {
  bool skip = false;
  levels_or_skip(&skip);
  if (skip) GTEST_SKIP() << "KILN_CPU_ISA asks for more than this CPU supports";
  if (!cpu::cpu_has(CpuIsa::Avx512))
    GTEST_SKIP() << "oneDNN 2.6 has no bf16 matmul at " << cpu::cpu_isa_name(cpu::cpu_isa());
  const cpu::Bf16GemmPath onednn = cpu::Bf16GemmPath::Onednn;
  cpu::set_bf16_gemm_path_override(&onednn);
  struct Restore {
    ~Restore() { cpu::set_bf16_gemm_path_override(nullptr); }
  } restore;
  uint64_t seed = 3000;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (GemmElt c_type : {GemmElt::BF16, GemmElt::F32}) {
        Bf16Gemm g;
        g.trans_a = ta, g.trans_b = tb, g.M = 33, g.N = 257, g.K = 65, g.c_type = c_type;
        check_case(g, 1, seed += 5, cpu::cpu_isa());
        g.alpha = 0.5f, g.beta = 1.0f, g.batch = 3, g.stride_a = 1, g.stride_b = 0;
        check_case(g, 0, seed += 5, cpu::cpu_isa());
        g.alpha = 1.0f, g.beta = 0.0f, g.batch = 1, g.stride_b = 0, g.has_bias = true;
        check_case(g, 0, seed += 5, cpu::cpu_isa());
      }
}

// oneDNN runs at the level kiln runs at: capped by KILN_CPU_ISA, else the detected one.
TEST(Bf16Gemm, OnednnRunsAtKilnsLevel) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::Onednn)
    GTEST_SKIP() << "no oneDNN bf16 path at " << cpu::cpu_isa_name(cpu::cpu_isa());
  Bf16Gemm g;
  g.M = 64, g.N = 64, g.K = 64, g.lda = 64, g.ldb = 64, g.ldc = 64;
  const std::string impl = cpu::bf16_gemm_impl(g);
  if (cpu::cpu_isa() == CpuIsa::Amx)
    EXPECT_NE(impl.find("amx"), std::string::npos) << impl;
  else
    EXPECT_EQ(impl.find("amx"), std::string::npos) << impl;
}

}  // namespace
}  // namespace kiln
