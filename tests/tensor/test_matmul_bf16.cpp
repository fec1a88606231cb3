// The native bf16 CPU kernels of gemm, matmul and linear (tensor/kernels_cpu_matmul_bf16.cpp):
// values against a float64 reference on strided, transposed and broadcast views, at every ISA
// level this machine supports; no f32 conversion copies; and the meta dry run, simulating the
// CPU, charging exactly the scratch and copies a real run allocates.
//
// Tolerance (kernels/cpu/matmul_dnnl.h; derived in tests/kernels/test_matmul_bf16.cpp): the
// inputs are exact bf16 values, so |C - C_ref| <= (K + 3) 2^-24 S + 2^-8 |C_ref| with
// S = sum_k |a_ik b_kj| (+ |beta C0| + |bias|).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul_dnnl.h"
#include "tensor/op_args.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tests/tensor/mem_measure.h"

namespace kiln::ops {
namespace {

using test::kTemps;

using test::measure;

std::vector<cpu::CpuIsa> levels() {
  std::vector<cpu::CpuIsa> out;
  for (int l = 0; l <= static_cast<int>(cpu::cpu_isa()); ++l)
    out.push_back(static_cast<cpu::CpuIsa>(l));
  return out;
}

// Random bf16 values (exact in every dtype kiln has) of a shape.
Tensor rand_bf16(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  return rand_uniform(shape, gen, -1.0, 1.0, DType::F32).to(DType::BF16);
}

std::vector<double> values(const Tensor& t) {
  const auto f = t.to_float_vector();
  return {f.begin(), f.end()};
}

// Checks out (..., M, N) against sum_k op(a)[m, k] op(b)[k, n] (+ c0 * beta + bias), per batch.
// a3/b3 are the operands as (batch or 1, rows, cols) dense f64 values with their op applied.
struct Ref {
  std::int64_t batch, M, N, K;
  bool a_shared, b_shared;   // one matrix for every batch entry
  std::vector<double> a, b;  // op(a): (., M, K), op(b): (., K, N)
};

void expect_matches(const Ref& r, const Tensor& out, const std::vector<double>& add,
                    const std::string& what) {
  const auto got = values(out);
  ASSERT_EQ(static_cast<std::int64_t>(got.size()), r.batch * r.M * r.N) << what;
  int bad = 0;
  for (std::int64_t b = 0; b < r.batch; ++b)
    for (std::int64_t i = 0; i < r.M; ++i)
      for (std::int64_t j = 0; j < r.N; ++j) {
        double s = 0, sa = 0;
        const std::int64_t ab = r.a_shared ? 0 : b, bb = r.b_shared ? 0 : b;
        for (std::int64_t k = 0; k < r.K; ++k) {
          const double p = r.a[(ab * r.M + i) * r.K + k] * r.b[(bb * r.K + k) * r.N + j];
          s += p;
          sa += std::abs(p);
        }
        const std::int64_t at = (b * r.M + i) * r.N + j;
        const double extra = add.empty() ? 0.0 : add[static_cast<std::size_t>(at)];
        const double ref = s + extra;
        const double bound = double(r.K + 3) * std::ldexp(1.0, -24) * (sa + std::abs(extra)) +
                             std::ldexp(1.0, -8) * std::abs(ref);
        if (!(std::abs(got[at] - ref) <= bound) && bad++ < 5)
          ADD_FAILURE() << what << ": [" << b << "," << i << "," << j << "] = " << got[at]
                        << ", reference " << ref << ", bound " << bound;
      }
}

// op(x) of a 2-d tensor as dense (rows, cols) values.
std::vector<double> op_values(const Tensor& x, bool trans) {
  return values(trans ? x.transpose(0, 1) : x);
}

TEST(MatmulBf16, GemmMatmulLinearTakeBf16NativelyOnTheCpu) {
  EXPECT_TRUE(has_native_kernel<GemmArgs>(Device::cpu(), DType::BF16));
  EXPECT_TRUE(has_native_kernel<MatmulArgs>(Device::cpu(), DType::BF16));
  EXPECT_TRUE(has_native_kernel<LinearArgs>(Device::cpu(), DType::BF16));
}

TEST(MatmulBf16, StridedTransposedAndBroadcastViewsAtEveryLevel) {
  std::uint64_t seed = 10;
  for (cpu::CpuIsa level : levels()) {
    cpu::ScopedCpuIsa cap(level);
    const std::string at = std::string(cpu::cpu_isa_name(level));
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const std::int64_t M = 33, N = 7, K = 257;
        // a stored transposed where ta (a.transpose is then a view with unit row stride), and
        // b sliced out of a wider tensor (row stride > cols).
        Tensor a_store = rand_bf16(ta ? Shape{K, M} : Shape{M, K}, seed += 3);
        Tensor b_wide = rand_bf16(tb ? Shape{N, K + 5} : Shape{K, N + 5}, seed += 3);
        Tensor b = b_wide.narrow(1, 2, tb ? K : N);
        Tensor out = matmul(a_store, b, ta, tb);
        Ref r{1, M, N, K, true, true, op_values(a_store, ta), op_values(b, tb)};
        expect_matches(r, out, {},
                       at + " matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
        // the same through a transposed view instead of the flag
        Tensor a_view = ta ? a_store.transpose(0, 1) : a_store;
        expect_matches(r, matmul(a_view, b, false, tb), {}, at + " matmul of a transposed view");
        // gemm_ accumulating (linear's dW += g^T x): c = 1 * op(a) op(b) + 1 * c0
        Tensor c = rand_bf16({M, N}, seed += 3);
        const auto c0 = values(c);
        gemm_(c, a_store, b, ta, tb, 1.0, 1.0);
        expect_matches(r, c, c0, at + " gemm beta 1");
      }
    // Batched: (B, M, K) @ (B, K, N), (B, M, K) @ (K, N), and an expanded (stride 0) batch.
    const std::int64_t B = 3, M = 7, N = 33, K = 65;
    Tensor a3 = rand_bf16({B, M, K}, seed += 3), b3 = rand_bf16({B, K, N}, seed += 3);
    Tensor b2 = rand_bf16({K, N}, seed += 3);
    expect_matches({B, M, N, K, false, false, values(a3), values(b3)}, matmul(a3, b3), {},
                   at + " batched");
    expect_matches({B, M, N, K, false, true, values(a3), values(b2)}, matmul(a3, b2), {},
                   at + " batched @ 2-d");
    Tensor a_bc = rand_bf16({1, M, K}, seed += 3).expand({B, M, K});
    expect_matches({B, M, N, K, true, false, values(a_bc.narrow(0, 0, 1)), values(b3)},
                   matmul(a_bc, b3), {}, at + " broadcast a");
    expect_matches({B, M, N, K, true, true, values(a_bc.narrow(0, 0, 1)), values(b2)},
                   matmul(a_bc, b2), {}, at + " broadcast a @ 2-d (both shared)");
    // a batch of transposed matrices: (B, K, M) viewed as (B, M, K)
    Tensor at3 = rand_bf16({B, K, M}, seed += 3);
    expect_matches({B, M, N, K, false, false, values(at3.transpose(1, 2)), values(b3)},
                   matmul(at3.transpose(1, 2), b3), {}, at + " batched transposed view");
  }
}

TEST(MatmulBf16, LinearWithBiasAndLeadingDimsAtEveryLevel) {
  std::uint64_t seed = 500;
  for (cpu::CpuIsa level : levels()) {
    cpu::ScopedCpuIsa cap(level);
    const std::string at = std::string(cpu::cpu_isa_name(level));
    for (bool bias : {false, true}) {
      const std::int64_t N = 257, K = 33;
      Tensor x = rand_bf16({2, 5, K}, seed += 3), w = rand_bf16({N, K}, seed += 3);
      Tensor b = bias ? rand_bf16({N}, seed += 3) : Tensor();
      Tensor y = linear(x, w, b);
      ASSERT_EQ(y.shape(), (Shape{2, 5, N}));
      std::vector<double> add;
      if (bias) {
        const auto bv = values(b);
        for (int r = 0; r < 10; ++r) add.insert(add.end(), bv.begin(), bv.end());
      }
      expect_matches({1, 10, N, K, true, true, values(x), op_values(w, true)}, y, add,
                     at + (bias ? " linear + bias" : " linear"));
      // a row-sliced x (row stride K + 4) and a single row (decode)
      Tensor xw = rand_bf16({6, K + 4}, seed += 3).narrow(1, 1, K);
      expect_matches({1, 6, N, K, true, true, values(xw), op_values(w, true)},
                     linear(xw, w, Tensor()), {}, at + " linear on a row-strided view");
      Tensor x1 = rand_bf16({K}, seed += 3);
      expect_matches({1, 1, N, K, true, true, values(x1), op_values(w, true)},
                     linear(x1, w, Tensor()), {}, at + " linear of one row");
    }
  }
}

TEST(MatmulBf16, NoConversionCopiesAndTheDryRunChargesTheSameScratch) {
  MetaSimulatesScope cpu_sim(DeviceType::CPU);
  struct Case {
    const char* name;
    std::vector<Shape> shapes;                        // inputs, built before measuring
    std::function<Tensor(std::vector<Tensor>&)> run;  // returns the output
    bool copies;  // an input the kernel cannot read in place (a dense copy in Temporaries)
  };
  const std::vector<Case> cases = {
      {"linear + bias",
       {{256, 288}, {768, 288}, {768}},
       [](std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); },
       false},
      {"matmul tn",
       {{288, 256}, {288, 768}},
       [](std::vector<Tensor>& t) { return matmul(t[0], t[1], true, false); },
       false},
      {"matmul batched nt",
       {{4, 64, 32}, {4, 64, 32}},
       [](std::vector<Tensor>& t) { return matmul(t[0], t[1], false, true); },
       false},
      {"gemm beta 1",
       {{288, 768}, {256, 288}, {256, 768}},
       [](std::vector<Tensor>& t) {
         gemm_(t[0], t[1], t[2], true, false, 1.0, 1.0);
         return t[0];
       },
       false},
      {"matmul of a transposed, sliced view",
       {{64, 128}, {64, 16}},
       [](std::vector<Tensor>& t) {
         return matmul(t[0].narrow(1, 0, 64).transpose(0, 1).narrow(0, 0, 32), t[1]);
       },
       false},
      {"matmul of a column-stepped view",
       {{32, 64, 2}, {64, 16}},
       [](std::vector<Tensor>& t) { return matmul(t[0].select(2, 0), t[1]); },
       true},
  };
  for (cpu::CpuIsa level : levels()) {
    cpu::ScopedCpuIsa cap(level);
    for (const Case& c : cases) {
      const std::string what = std::string(cpu::cpu_isa_name(level)) + " " + c.name;
      MemStats st[2];
      std::int64_t f32_bytes = 0;  // what converting every operand to f32 would allocate
      for (int i = 0; i < 2; ++i) {
        const Device dev = i == 0 ? Device::cpu() : Device::meta();
        std::vector<Tensor> in;
        std::uint64_t seed = 70;
        for (const Shape& s : c.shapes)
          in.push_back(dev.is_cpu() ? rand_bf16(s, seed++) : Tensor::empty(s, DType::BF16, dev));
        Tensor out;
        st[i] = measure(dev, [&] { out = c.run(in); });
        f32_bytes = out.numel() * 4;
        for (const Tensor& t : in) f32_bytes += t.numel() * 4;
      }
      EXPECT_EQ(st[1].peak[kTemps], st[0].peak[kTemps]) << what << ": dry run vs measured";
      EXPECT_EQ(st[1].num_allocs, st[0].num_allocs) << what;
      if (!c.copies) EXPECT_LT(st[0].peak[kTemps], f32_bytes) << what << ": f32 copies made?";
      if (c.copies) EXPECT_GT(st[0].peak[kTemps], 0) << what;
    }
  }
}

}  // namespace
}  // namespace kiln::ops
