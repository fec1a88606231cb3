// Native bf16 (and f16) CPU kernels (issue 10, item 3): every op of the elementwise, reduction,
// softmax, norm, RoPE, activation, embedding, dropout and random families runs on bf16 storage
// with f32 math, through the op front end, and is compared with the f64 kernels run on the same
// bf16 values (inputs are drawn in f32, rounded to bf16, then widened to f64 for the reference).
// Each case runs at every CPU ISA level this machine supports; the bf16 outputs must be
// bit-identical across levels (only the bulk conversions differ per level, and they round the
// same). The tracker proves no f32 conversion copies: a bf16 case charges no more Temporaries
// than the same case in f32 (the f32-converting dispatcher charged an f32 copy of every input
// and an f32 buffer for every output on top).
//
// bf16 tolerances (written down here and in docs/adding_an_op.md): a kernel computes in f32
// and rounds each output once, so an output differs from the exact value by at most half a bf16
// ulp, 2^-8 relative (bf16 keeps 8 significant bits), plus the f32 error before rounding:
//   |out - ref| <= 2^-8 |ref| + atol,   atol = c * max|ref| of that output,
// c = 1e-5 for elementwise ops, softmax and norms' forward; c = 1e-4 where the f32 math
// cancels (norm and softmax backward, log-softmax, rope); 2^-8 * 2 for sums over bf16 values
// rounded to a bf16 output whose reference is near 0 (reductions). f16 uses 2^-11 for 2^-8.
// Integer outputs (argmax, dropout masks) must match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/cpu/isa.h"
#include "tensor/op_args.h"
#include "tensor/ops.h"
#include "tests/tensor/mem_measure.h"

namespace kiln::ops {
namespace {

using test::kTemps;

// Inputs for one run: drawn in f32 from a seed, rounded to bf16, then held in `dt` (bf16 for the
// native run, f64 for the reference, f16 or f32 for the others): every run sees the same values.
struct Env {
  DType dt;
  Tensor in(const Shape& s, std::uint64_t seed, double lo = -1.0, double hi = 1.0) const {
    Generator g(seed);
    return ops::rand_uniform(s, g, lo, hi, DType::F32).to(DType::BF16).to(dt);
  }
  Tensor ids(std::int64_t n, std::int32_t vocab, std::uint64_t seed) const {
    std::vector<std::int32_t> v(static_cast<std::size_t>(n));
    std::uint64_t x = seed;
    for (auto& t : v) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      t = static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(vocab));
    }
    return ops::from_vector(v, {n});
  }
  // A gradient accumulator: f32 for the 16-bit runs (the mixed-precision recipe), else dt.
  DType acc() const { return dt == DType::BF16 || dt == DType::F16 ? DType::F32 : dt; }
};

struct Case {
  std::string name;
  double atol_scale;  // c in the header's bound
  std::function<std::vector<Tensor>(const Env&)> run;
};

constexpr double kElem = 1e-5, kCancel = 1e-4, kSum = 2.0 / 256;

std::vector<Case> cases() {
  std::vector<Case> c;
  for (Binary b : {Binary::Add, Binary::Sub, Binary::Mul, Binary::Div, Binary::Max, Binary::Min})
    c.push_back({"binary_" + std::to_string(static_cast<int>(b)), kElem, [b](const Env& e) {
                   Tensor x = e.in({9, 33}, 1);
                   Tensor y = b == Binary::Div ? e.in({9, 33}, 2, 0.5, 2.0) : e.in({9, 33}, 2);
                   Tensor bias = b == Binary::Div ? e.in({33}, 3, 0.5, 2.0) : e.in({33}, 3);
                   return std::vector{ops::binary(b, x, y), ops::binary(b, x, bias),
                                      ops::binary(b, x.transpose(0, 1), y.transpose(0, 1))};
                 }});
  for (Unary u : {Unary::Neg, Unary::Exp, Unary::Log, Unary::Sqrt, Unary::Rsqrt, Unary::Abs,
                  Unary::Square, Unary::Reciprocal, Unary::Tanh, Unary::Sigmoid}) {
    const bool positive =
        u == Unary::Log || u == Unary::Sqrt || u == Unary::Rsqrt || u == Unary::Reciprocal;
    c.push_back(
        {"unary_" + std::to_string(static_cast<int>(u)), kElem, [u, positive](const Env& e) {
           Tensor x = positive ? e.in({3, 1000}, 4, 0.1, 3.0) : e.in({3, 1000}, 4, -3, 3);
           return std::vector{ops::unary(u, x)};
         }});
  }
  c.push_back({"affine_axpy_scale", kElem, [](const Env& e) {
                 Tensor x = e.in({4, 257}, 5);
                 Tensor y = ops::affine(x, 1.5, -0.25), z = ops::affine(x, -3.0);
                 Tensor acc = e.in({4, 257}, 6);
                 ops::axpy_(acc, 0.5, x);
                 Tensor acc2 = e.in({4, 257}, 7);
                 ops::scale_(acc2, -2.0);
                 return std::vector{y, z, acc, acc2};
               }});
  for (int dim = 0; dim < 3; ++dim)
    c.push_back({"reduce_dim" + std::to_string(dim), kSum, [dim](const Env& e) {
                   Tensor x = e.in({4, 37, 5}, 8);
                   return std::vector{ops::reduce(Reduce::Sum, x, dim),
                                      ops::reduce(Reduce::Mean, x, dim, true),
                                      ops::reduce(Reduce::Max, x, dim),
                                      ops::reduce(Reduce::Min, x, dim), ops::argmax(x, dim)};
                 }});
  c.push_back({"row_reductions", kSum, [](const Env& e) {
                 Tensor x = e.in({6, 700}, 9);
                 return std::vector{ops::sum(x, 1), ops::mean(x, 1), ops::reduce(Reduce::Max, x, 1),
                                    ops::argmax(x, 1)};
               }});
  c.push_back(
      {"sum_all_sum_squares", kSum, [](const Env& e) {
         Tensor x = e.in({3, 40000}, 10);
         return std::vector{ops::sum_all(x), ops::full({1}, ops::sum_squares(x), DType::F64)};
       }});
  for (bool log : {false, true})
    c.push_back({log ? "log_softmax" : "softmax", kCancel, [log](const Env& e) {
                   Tensor x = e.in({13, 257}, 11, -4.0, 4.0), dy = e.in({13, 257}, 12);
                   Tensor y = log ? ops::log_softmax(x) : ops::softmax(x);
                   // The backward gets its own y (probabilities or log-probabilities) with the
                   // same bf16 values in both runs, so the forward's rounding does not count
                   // against the backward kernel.
                   Tensor yb = log ? e.in({13, 257}, 13, -8.0, -2.0) : e.in({13, 257}, 13, 0, 0.05);
                   Tensor dx =
                       log ? ops::log_softmax_backward(yb, dy) : ops::softmax_backward(yb, dy);
                   return std::vector{y, dx};
                 }});
  c.push_back({"embedding", kElem, [](const Env& e) {
                 Tensor ids = e.ids(3 * 41, 50, 13).view({3, 41});
                 Tensor table = e.in({50, 24}, 14);
                 Tensor dtable = e.in({50, 24}, 15);  // += onto existing values, in storage dtype
                 ops::embedding_backward_(dtable, ids, e.in({3, 41, 24}, 16));
                 return std::vector{ops::embedding(ids, table), dtable};
               }});
  c.push_back(
      {"rmsnorm", kCancel, [](const Env& e) {
         Tensor x = e.in({3, 11, 129}, 17), w = e.in({129}, 18), dy = e.in({3, 11, 129}, 19);
         auto [y, rstd] = ops::rmsnorm(x, w, 1e-5);
         Tensor dw = ops::zeros({129}, e.acc());
         Tensor dx = ops::rmsnorm_backward(x, w, rstd, dy, &dw);
         return std::vector{y, rstd, dx, dw};
       }});
  c.push_back({"layernorm", kCancel, [](const Env& e) {
                 Tensor x = e.in({7, 200}, 20), w = e.in({200}, 21), b = e.in({200}, 22);
                 Tensor dy = e.in({7, 200}, 23);
                 auto [y, mean, rstd] = ops::layernorm(x, w, b, 1e-5);
                 Tensor dw = ops::zeros({200}, e.acc()), db = ops::zeros({200}, e.acc());
                 Tensor dx = ops::layernorm_backward(x, w, mean, rstd, dy, &dw, &db);
                 return std::vector{y, mean, rstd, dx, dw, db};
               }});
  for (auto style : {RopeStyle::Interleaved, RopeStyle::RotateHalf})
    c.push_back({style == RopeStyle::Interleaved ? "rope_interleaved" : "rope_rotate_half", kCancel,
                 [style](const Env& e) {
                   auto [cos, sin] = ops::rope_tables(32, 16, 10000.0, e.dt);
                   Tensor x = e.in({2, 9, 3, 16}, 24);
                   return std::vector{ops::rope(x, cos, sin, style, 5),
                                      ops::rope(x, cos, sin, style, 5, /*backward=*/true)};
                 }});
  std::uint64_t act_seed = 30;
  for_each_activation([&]<Op O>() {
    const std::uint64_t seed = act_seed;
    act_seed += 2;
    c.push_back({std::string(op_name(O)), kElem, [seed](const Env& e) {
                   Tensor x = e.in({5, 301}, seed, -6, 6), dy = e.in({5, 301}, seed + 1);
                   return std::vector{ops::activation(O, x), ops::activation_backward(O, x, dy)};
                 }});
  });
  c.push_back(
      {"swiglu", kElem, [](const Env& e) {
         Tensor g = e.in({5, 301}, 60, -6, 6), u = e.in({5, 301}, 61), d = e.in({5, 301}, 62);
         auto [dg, du] = ops::swiglu_backward(g, u, d);
         return std::vector{ops::swiglu(g, u), dg, du};
       }});
  c.push_back({"dropout", kElem, [](const Env& e) {
                 Tensor x = e.in({7, 129}, 63), dy = e.in({7, 129}, 64);
                 Generator gen(65);
                 auto [y, mask] = ops::dropout(x, 0.3, gen);
                 return std::vector{y, mask, ops::dropout_backward(dy, mask, 0.3)};
               }});
  return c;
}

// Runs f and returns the peak of Temporaries over it (what a kernel or the dispatcher took).
template <class F>
std::int64_t temporaries_peak(F&& f) {
  MemoryTracker& tr = MemoryTracker::get(DeviceType::CPU);
  tr.reset_peaks();
  const std::int64_t before = static_cast<std::int64_t>(tr.stats().current[kTemps]);
  MemoryScope outputs(MemCategory::Activations);
  f();
  return static_cast<std::int64_t>(tr.stats().peak[kTemps]) - before;
}

std::vector<cpu::CpuIsa> levels_here() {
  std::vector<cpu::CpuIsa> v;
  for (int l = 0; l <= static_cast<int>(cpu::cpu_isa_detected()); ++l)
    v.push_back(static_cast<cpu::CpuIsa>(l));
  return v;
}

// |out - ref| <= rtol |ref| + c max|ref| for every element; reports the worst one.
::testing::AssertionResult close(const std::vector<double>& out, const std::vector<double>& ref,
                                 double rtol, double c) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << out.size() << " vs " << ref.size();
  double peak = 0;
  for (double r : ref) peak = std::max(peak, std::abs(r));
  const double atol = c * peak;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double excess = std::abs(out[i] - ref[i]) - (rtol * std::abs(ref[i]) + atol);
    if (!(excess <= worst)) worst = std::isnan(excess) ? INFINITY : excess, at = i;
  }
  if (worst > 0)
    return ::testing::AssertionFailure()
           << "element " << at << ": " << out[at] << " vs reference " << ref[at] << " (rtol "
           << rtol << ", atol " << atol << ")";
  return ::testing::AssertionSuccess();
}

void check_dtype(DType dt, double rtol, const std::vector<cpu::CpuIsa>& levels) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name + " in " + std::string(dtype_name(dt)));
    std::vector<Tensor> ref = k.run(Env{DType::F64});
    const std::int64_t f32_temps = temporaries_peak([&] { (void)k.run(Env{DType::F32}); });
    std::vector<std::vector<float>> first_bits;
    for (cpu::CpuIsa level : levels) {
      SCOPED_TRACE(std::string(cpu::cpu_isa_name(level)));
      cpu::ScopedCpuIsa cap(level);
      std::vector<Tensor> out;
      const std::int64_t temps = temporaries_peak([&] { out = k.run(Env{dt}); });
      EXPECT_LE(temps, f32_temps) << "a native kernel charges no f32 conversion copies";
      ASSERT_EQ(out.size(), ref.size());
      std::vector<std::vector<float>> bits;
      for (std::size_t i = 0; i < out.size(); ++i) {
        const DType odt = out[i].dtype();
        const bool stored = odt == dt;                  // rstd/mean/dw are f32 by design
        if (odt == DType::I64 || odt == DType::Bool) {  // argmax, masks: exact
          EXPECT_TRUE(out[i].to_double_vector() == ref[i].to_double_vector()) << "output " << i;
          continue;
        }
        EXPECT_TRUE(stored || odt == DType::F32 || odt == DType::F64)
            << "output " << i << " is " << dtype_name(odt);
        EXPECT_TRUE(close(out[i].to_double_vector(), ref[i].to_double_vector(),
                          stored ? rtol : 1e-6, k.atol_scale))
            << "output " << i;
      }
      for (const Tensor& t : out) bits.push_back(t.to_float_vector());
      if (first_bits.empty())
        first_bits = bits;
      else
        for (std::size_t i = 0; i < bits.size(); ++i)
          EXPECT_TRUE(bits[i] == first_bits[i])
              << "output " << i << " differs from level " << cpu::cpu_isa_name(levels.front());
    }
  }
}

TEST(Bf16Cpu, EveryNativeKernelMatchesF64AtEveryIsaLevel) {
  check_dtype(DType::BF16, 1.0 / 256, levels_here());
}

TEST(Bf16Cpu, F16RunsNativelyToo) { check_dtype(DType::F16, 1.0 / 2048, {cpu::cpu_isa()}); }

TEST(Bf16Cpu, KernelsAreRegisteredForBf16AndF16) {
  for (DType dt : {DType::BF16, DType::F16}) {
    EXPECT_TRUE(has_native_kernel<BinaryArgs>(Device::cpu(), dt));
    EXPECT_TRUE(has_native_kernel<ReduceArgs>(Device::cpu(), dt));
    EXPECT_TRUE(has_native_kernel<SoftmaxBackwardArgs>(Device::cpu(), dt));
    EXPECT_TRUE(has_native_kernel<RmsNormBackwardArgs>(Device::cpu(), dt));
    EXPECT_TRUE(has_native_kernel<RopeArgs>(Device::cpu(), dt));
    EXPECT_TRUE(has_native_kernel<SwiGluBackwardArgs>(Device::cpu(), dt));
    EXPECT_TRUE(has_native_kernel<EmbeddingBackwardArgs>(Device::cpu(), dt));
    EXPECT_TRUE(has_native_kernel<DropoutArgs>(Device::cpu(), dt));
    EXPECT_TRUE(has_native_kernel<RandomArgs>(Device::cpu(), dt));
  }
}

// Casts, fills and random fills round exactly as kernels/common/half.h at every level.
TEST(Bf16Cpu, CastFillAndRandomRoundLikeHalfH) {
  Generator g(70);
  Tensor f = ops::randn({5, 999}, g, 0.0, 3.0, DType::F32);
  const std::vector<float> fv = f.to_float_vector(), ft = f.transpose(0, 1).to_float_vector();
  for (cpu::CpuIsa level : levels_here()) {
    SCOPED_TRACE(std::string(cpu::cpu_isa_name(level)));
    cpu::ScopedCpuIsa cap(level);
    Tensor h = f.to(DType::BF16), ht = f.transpose(0, 1).to(DType::BF16);
    const bf16* hp = h.data<bf16>();
    const bf16* htp = ht.data<bf16>();
    for (std::size_t i = 0; i < fv.size(); ++i) {
      ASSERT_EQ(hp[i].bits, float_to_bf16(fv[i]).bits) << i;
      ASSERT_EQ(htp[i].bits, float_to_bf16(ft[i]).bits) << i;
    }
    const std::vector<float> back = h.to(DType::F32).to_float_vector();
    for (std::size_t i = 0; i < fv.size(); ++i) ASSERT_EQ(back[i], bf16_to_float(hp[i])) << i;

    Tensor filled = ops::full({3, 17}, 0.3, DType::BF16);
    for (std::int64_t i = 0; i < filled.numel(); ++i)
      ASSERT_EQ(filled.data<bf16>()[i].bits, float_to_bf16(0.3f).bits);

    for (bool normal : {false, true}) {
      Generator g32(71), g16(71);
      Tensor r32 = normal ? ops::randn({1001}, g32, 0.5, 2.0, DType::F32)
                          : ops::rand_uniform({1001}, g32, -2.0, 3.0, DType::F32);
      Tensor r16 = normal ? ops::randn({1001}, g16, 0.5, 2.0, DType::BF16)
                          : ops::rand_uniform({1001}, g16, -2.0, 3.0, DType::BF16);
      const std::vector<float> v32 = r32.to_float_vector();
      for (std::size_t i = 0; i < v32.size(); ++i)
        ASSERT_EQ(r16.data<bf16>()[i].bits, float_to_bf16(v32[i]).bits) << i;
    }
  }
}

}  // namespace
}  // namespace kiln::ops
