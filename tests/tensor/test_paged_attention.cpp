// ops::paged_attention (serving): each query row attends over its own sequence's keys through a
// block table; checked against a float64 reference written from the definition, against
// ops::attention on the same keys laid out contiguously, for batch invariance (a row's output is
// bit-identical alone or among other rows), and for its refusals; plus the meta shapes and a
// backend-ops case.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/isa.h"
#include "tensor/ops.h"
#include "tests/tensor/backend_ops.h"

namespace kiln {
namespace {

struct PagedCase {
  std::int64_t Hq = 4, Hkv = 2, D = 16, block_size = 4, num_blocks = 12, max_blocks = 5;
  // Each sequence's blocks, a shuffled subset of the pool (so adjacent positions are not
  // adjacent in memory), and the rows: (sequence, position).
  std::vector<std::vector<std::int32_t>> tables = {{7, 2, 9, 0, 11}, {3, 10, 5, 1, 4}};
  std::vector<std::int32_t> seq = {0, 0, 1, 0, 1, 1}, pos = {0, 5, 19, 13, 3, 4};

  Tensor table_tensor() const {
    std::vector<std::int32_t> flat;
    for (const auto& t : tables) flat.insert(flat.end(), t.begin(), t.end());
    return ops::from_vector(flat, {static_cast<std::int64_t>(tables.size()), max_blocks});
  }
  std::int64_t n() const { return static_cast<std::int64_t>(seq.size()); }
};

// out[i, h, :] from the definition, in float64, on f64 copies of the inputs.
std::vector<double> reference(const PagedCase& c, const std::vector<double>& q,
                              const std::vector<double>& k, const std::vector<double>& v,
                              double scale) {
  std::vector<double> out(static_cast<std::size_t>(c.n() * c.Hq * c.D));
  for (std::int64_t i = 0; i < c.n(); ++i)
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      const std::int64_t kvh = h / (c.Hq / c.Hkv), P = c.pos[i] + 1;
      std::vector<double> s(static_cast<std::size_t>(P));
      auto at = [&](std::int64_t j, std::int64_t d) {
        const std::int64_t b = c.tables[c.seq[i]][j / c.block_size];
        return ((b * c.block_size + j % c.block_size) * c.Hkv + kvh) * c.D + d;
      };
      double m = -INFINITY;
      for (std::int64_t j = 0; j < P; ++j) {
        double dot = 0;
        for (std::int64_t d = 0; d < c.D; ++d) dot += q[(i * c.Hq + h) * c.D + d] * k[at(j, d)];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - m));
      for (std::int64_t d = 0; d < c.D; ++d) {
        double acc = 0;
        for (std::int64_t j = 0; j < P; ++j) acc += s[j] * v[at(j, d)];
        out[(i * c.Hq + h) * c.D + d] = acc / z;
      }
    }
  return out;
}

std::vector<double> as_f64(const Tensor& t) {
  const Tensor d = t.to(DType::F64).contiguous();
  return {d.data<double>(), d.data<double>() + d.numel()};
}

Tensor uniform(const Shape& s, std::uint64_t seed, DType dt) {
  Generator g(seed);
  return ops::rand_uniform(s, g, -1.0, 1.0, DType::F32).to(dt);
}

TEST(PagedAttention, MatchesTheFloat64Definition) {
  const PagedCase c;
  const double scale = 1.0 / std::sqrt(16.0);
  // Bounds (relative RMS error): f32 sums of at most 20 products of terms <= 1 in magnitude
  // carry about 20 * 2^-24 relative error each, so 1e-5 holds with a wide margin; bf16 inputs are
  // exact in the reference (it reads the same rounded values), and the output's single rounding
  // to bf16 adds at most 2^-8 relative: 1e-2.
  for (const auto& [dt, bound] :
       {std::pair{DType::F32, 1e-5}, std::pair{DType::BF16, 1e-2}, std::pair{DType::F64, 1e-12}}) {
    const Tensor q = uniform({c.n(), c.Hq, c.D}, 1, dt);
    const Tensor k = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 2, dt);
    const Tensor v = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 3, dt);
    const Tensor out =
        ops::paged_attention(q, k, v, c.table_tensor(), ops::from_vector(c.seq, {c.n()}),
                             ops::from_vector(c.pos, {c.n()}), scale);
    ASSERT_EQ(out.shape(), Shape({c.n(), c.Hq, c.D}));
    ASSERT_EQ(out.dtype(), dt);
    const std::vector<double> ref = reference(c, as_f64(q), as_f64(k), as_f64(v), scale);
    const std::vector<double> got = as_f64(out);
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      err += (got[i] - ref[i]) * (got[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(err / norm), bound) << dtype_name(dt);
  }
}

// Sequence 0 of the case laid out contiguously is ops::attention's (1, T, Hkv, D) cache.
TEST(PagedAttention, AgreesWithContiguousAttention) {
  PagedCase c;
  const std::int64_t T = 20;
  c.seq.assign(T, 0);
  c.pos.resize(T);
  std::iota(c.pos.begin(), c.pos.end(), 0);
  const double scale = 0.3;
  const Tensor q = uniform({T, c.Hq, c.D}, 4, DType::F32);
  const Tensor k = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 5, DType::F32);
  const Tensor v = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 6, DType::F32);
  const Tensor paged = ops::paged_attention(q, k, v, c.table_tensor(), ops::from_vector(c.seq, {T}),
                                            ops::from_vector(c.pos, {T}), scale);
  Tensor kc = Tensor::empty({1, T, c.Hkv, c.D}), vc = Tensor::empty({1, T, c.Hkv, c.D});
  for (std::int64_t i = 0; i < T / c.block_size; ++i) {
    const std::int64_t b = c.tables[0][i];
    kc.narrow(1, i * c.block_size, c.block_size)
        .copy_(k.narrow(0, b, 1).reshape({1, c.block_size, c.Hkv, c.D}));
    vc.narrow(1, i * c.block_size, c.block_size)
        .copy_(v.narrow(0, b, 1).reshape({1, c.block_size, c.Hkv, c.D}));
  }
  const auto [ref, lse] = ops::attention(q.reshape({1, T, c.Hq, c.D}), kc, vc, scale, 0);
  const std::vector<float> a = paged.to_float_vector(), b = ref.to_float_vector();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
}

// The serving promise: a row's output does not depend on the rows beside it.
TEST(PagedAttention, EachRowIsBitIdenticalAloneOrInABatch) {
  const PagedCase c;
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor q = uniform({c.n(), c.Hq, c.D}, 7, dt);
    const Tensor k = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 8, dt);
    const Tensor v = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 9, dt);
    const Tensor all =
        ops::paged_attention(q, k, v, c.table_tensor(), ops::from_vector(c.seq, {c.n()}),
                             ops::from_vector(c.pos, {c.n()}), 0.25);
    for (std::int64_t i = 0; i < c.n(); ++i) {
      const Tensor one = ops::paged_attention(q.narrow(0, i, 1), k, v, c.table_tensor(),
                                              ops::from_vector(std::vector{c.seq[i]}, {1}),
                                              ops::from_vector(std::vector{c.pos[i]}, {1}), 0.25);
      EXPECT_EQ(one.to(DType::F32).to_float_vector(),
                all.narrow(0, i, 1).to(DType::F32).to_float_vector())
          << dtype_name(dt) << " row " << i;
    }
  }
}

// The CPU kernel's sums are defined lane by lane (kernels/cpu/paged_attention.cpp), so every ISA
// level gives the scalar level's bits: with D a multiple of 16 and with a tail of 4 dims.
TEST(PagedAttention, EveryCpuIsaLevelGivesTheScalarBits) {
  for (std::int64_t D : {32, 20}) {
    PagedCase c;
    c.D = D;
    for (DType dt : {DType::F32, DType::BF16}) {
      const Tensor q = uniform({c.n(), c.Hq, c.D}, 17, dt);
      const Tensor k = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 18, dt);
      const Tensor v = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 19, dt);
      auto run = [&] {
        return ops::paged_attention(q, k, v, c.table_tensor(), ops::from_vector(c.seq, {c.n()}),
                                    ops::from_vector(c.pos, {c.n()}), 0.25)
            .to(DType::F32)
            .to_float_vector();
      };
      std::vector<float> scalar;
      {
        cpu::ScopedCpuIsa cap(cpu::CpuIsa::Scalar);
        scalar = run();
      }
      for (int l = 1; l <= static_cast<int>(cpu::cpu_isa_detected()); ++l) {
        cpu::ScopedCpuIsa cap(static_cast<cpu::CpuIsa>(l));
        EXPECT_EQ(run(), scalar) << dtype_name(dt) << " D " << D << " level "
                                 << cpu::cpu_isa_name(static_cast<cpu::CpuIsa>(l));
      }
    }
  }
}

TEST(PagedAttention, RefusesEntriesOutsideThePoolAndBadShapes) {
  PagedCase c;
  const Tensor q = uniform({c.n(), c.Hq, c.D}, 1, DType::F32);
  const Tensor k = uniform({c.num_blocks, c.block_size, c.Hkv, c.D}, 2, DType::F32);
  const Tensor seq = ops::from_vector(c.seq, {c.n()}), pos = ops::from_vector(c.pos, {c.n()});
  auto message = [&](const Tensor& qq, const Tensor& kk, const Tensor& tables, const Tensor& s,
                     const Tensor& p) {
    try {
      ops::paged_attention(qq, kk, kk, tables, s, p, 1.0);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  c.tables[1][4] = 12;  // row 2 (position 19) reads block index 4 of sequence 1
  EXPECT_EQ(message(q, k, c.table_tensor(), seq, pos),
            "[paged_attention] sequence 1 block 4 is 12, outside the pool's [0, 12)");
  c.tables[1][4] = 4;
  std::vector<std::int32_t> far = c.pos;
  far[0] = 20;
  EXPECT_EQ(message(q, k, c.table_tensor(), seq, ops::from_vector(far, {c.n()})),
            "[paged_attention] row 0: position 20 outside [0, 20)");
  std::vector<std::int32_t> bad_seq = c.seq;
  bad_seq[3] = 2;
  EXPECT_EQ(message(q, k, c.table_tensor(), ops::from_vector(bad_seq, {c.n()}), pos),
            "[paged_attention] row 3: sequence 2 outside [0, 2)");
  EXPECT_EQ(message(q.to(DType::BF16), k, c.table_tensor(), seq, pos),
            "[paged_attention] q is bf16, the pool f32");
  EXPECT_NE(message(uniform({c.n(), 3, c.D}, 1, DType::F32), k, c.table_tensor(), seq, pos)
                .find("3 query heads not divisible by 2 kv heads"),
            std::string::npos);
}

TEST(PagedAttention, MetaGivesTheShape) {
  const PagedCase c;
  const Tensor q = Tensor::empty({c.n(), c.Hq, c.D}, DType::BF16, Device::meta());
  const Tensor k =
      Tensor::empty({c.num_blocks, c.block_size, c.Hkv, c.D}, DType::BF16, Device::meta());
  const Tensor out =
      ops::paged_attention(q, k, k, c.table_tensor(), ops::from_vector(c.seq, {c.n()}),
                           ops::from_vector(c.pos, {c.n()}), 1.0);
  EXPECT_EQ(out.shape(), Shape({c.n(), c.Hq, c.D}));
  EXPECT_TRUE(out.device().is_meta());
}

[[maybe_unused]] const bool kBackendCasePaged = backend_ops::register_case(
    {Op::Attention, "paged_attention", backend_ops::Tol::Attention, [](const backend_ops::Env& e) {
       const PagedCase c;
       const Tensor q = e.in({c.n(), c.Hq, c.D}, 11);
       const Tensor k = e.in({c.num_blocks, c.block_size, c.Hkv, c.D}, 12);
       const Tensor v = e.in({c.num_blocks, c.block_size, c.Hkv, c.D}, 13);
       return std::vector{ops::paged_attention(q, k, v, c.table_tensor(),
                                               ops::from_vector(c.seq, {c.n()}),
                                               ops::from_vector(c.pos, {c.n()}), 0.25)};
     }});

}  // namespace
}  // namespace kiln
