// The CUDA basic family (copy, fill, random, elementwise, reductions; tensor/kernels_cuda_basic.cpp
// and kernels/cuda/{copy,elementwise,random,reduce}).
//
//  - Host tests (run everywhere the CUDA backend is compiled, GPU or not): the iteration plans
//    the kernels walk (dim collapsing, covering ranges, 32-bit index eligibility, the reduce
//    split), and plan_offsets()/group_offset(), the very functions the kernels call to turn a
//    logical index into element offsets, against naive multi-index arithmetic.
//  - Device tests: each op on CUDA against the same op on the CPU from identical inputs, with odd
//    shapes and transposed / narrowed / expanded views, in f32 and bf16. They skip, with a
//    message, when there is no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/runtime.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"

#if defined(KILN_CUDA)
#include "kernels/cuda/copy.h"
#include "kernels/cuda/reduce.h"
#endif

namespace kiln {
namespace {

using I64 = std::int64_t;

#if defined(KILN_CUDA)

// ---- host: plans ------------------------------------------------------------------------------

// Offset of logical index i (row-major over shape) with the given strides, one dim at a time.
I64 naive_offset(const std::vector<I64>& shape, const std::vector<I64>& strides, I64 i) {
  I64 off = 0;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

TEST(CudaBasicPlan, ContiguousCollapsesToOneDim) {
  const std::vector<I64> shape{2, 3, 4}, st{12, 4, 1};
  const cuda::StridedPlan p = cuda::plan_strided("t", 3, shape.data(), st.data());
  EXPECT_EQ(p.nops, 1);
  EXPECT_EQ(p.numel, 24);
  ASSERT_EQ(p.ndim, 1);
  EXPECT_EQ(p.shape[0], 24);
  EXPECT_EQ(p.stride[0][0], 1);
  EXPECT_TRUE(cuda::plan_is_dense(p, 0));
  EXPECT_EQ(cuda::plan_max_offset(p, 0), 23);
}

TEST(CudaBasicPlan, TransposeKeepsTwoDims) {
  // (3, 4) transposed: shape (4, 3), strides (1, 4).
  const std::vector<I64> shape{4, 3}, st{1, 4}, out{3, 1};
  const cuda::StridedPlan p = cuda::plan_strided("t", 2, shape.data(), st.data(), out.data());
  EXPECT_EQ(p.nops, 2);
  ASSERT_EQ(p.ndim, 2);
  EXPECT_EQ(p.shape[0], 4);
  EXPECT_EQ(p.shape[1], 3);
  EXPECT_EQ(p.stride[0][0], 1);
  EXPECT_EQ(p.stride[0][1], 4);
  EXPECT_EQ(p.stride[1][0], 3);
  EXPECT_EQ(p.stride[1][1], 1);
  EXPECT_FALSE(cuda::plan_is_dense(p, 0));
  EXPECT_FALSE(cuda::plan_is_dense(p, 1));
  EXPECT_EQ(cuda::plan_max_offset(p, 0), 3 * 1 + 2 * 4);
}

TEST(CudaBasicPlan, BiasBroadcastAndSizeOneDims) {
  // (5, 7) + (7): a dense, b broadcast over rows. a alone would collapse; together they cannot.
  const std::vector<I64> shape{5, 7}, sa{7, 1}, sb{0, 1};
  cuda::StridedPlan p = cuda::plan_strided("t", 2, shape.data(), sa.data(), sb.data());
  ASSERT_EQ(p.ndim, 2);
  EXPECT_EQ(p.stride[1][0], 0);
  EXPECT_EQ(p.stride[1][1], 1);
  p = cuda::plan_strided("t", 2, shape.data(), sa.data());
  EXPECT_EQ(p.ndim, 1);
  // A scalar broadcast to (5, 7) collapses to one dim of stride 0.
  const std::vector<I64> s0{0, 0};
  p = cuda::plan_strided("t", 2, shape.data(), sa.data(), s0.data());
  ASSERT_EQ(p.ndim, 1);
  EXPECT_EQ(p.shape[0], 35);
  EXPECT_EQ(p.stride[1][0], 0);
  // Size-1 dims are dropped whatever their strides.
  const std::vector<I64> shape1{1, 5, 1, 3}, st1{99, 3, 77, 1};
  p = cuda::plan_strided("t", 4, shape1.data(), st1.data());
  ASSERT_EQ(p.ndim, 1);
  EXPECT_EQ(p.shape[0], 15);
}

TEST(CudaBasicPlan, EmptyScalarAndErrors) {
  const std::vector<I64> shape{3, 0, 2}, st{2, 2, 1};
  cuda::StridedPlan p = cuda::plan_strided("t", 3, shape.data(), st.data());
  EXPECT_EQ(p.numel, 0);
  EXPECT_EQ(p.ndim, 0);
  p = cuda::plan_strided("t", 0, nullptr, nullptr);  // 0-d
  EXPECT_EQ(p.numel, 1);
  EXPECT_EQ(p.ndim, 0);
  EXPECT_TRUE(cuda::plan_is_dense(p, 0));
  I64 off[1];
  cuda::plan_offsets<1>(cuda::to_index_plan<I64>(p), I64{0}, off);
  EXPECT_EQ(off[0], 0);

  // 9 dims in reversed order cannot merge: more than the kernels handle.
  std::vector<I64> s9(9, 2), st9(9);
  for (int d = 0; d < 9; ++d) st9[d] = I64{1} << d;
  try {
    cuda::plan_strided("copy", 9, s9.data(), st9.data());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[copy]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at most 8"), std::string::npos) << e.what();
  }
  // The same 9 dims in row-major order collapse to one.
  for (int d = 0; d < 9; ++d) st9[d] = I64{1} << (8 - d);
  EXPECT_EQ(cuda::plan_strided("copy", 9, s9.data(), st9.data()).ndim, 1);
  const std::vector<I64> neg{-1, 1};
  const std::vector<I64> s2{2, 2};
  EXPECT_THROW(cuda::plan_strided("t", 2, s2.data(), neg.data()), Error);
}

// The plans of real tensors, built exactly as the glue builds them (shape().data(),
// strides().data()). A 0-d tensor's strides are an empty vector, whose data() is null: the
// two-operand plan must still have two operands, or every 0-d copy to or from the device (the
// loss scalar) is refused by copy_strided ("the plan needs a source and a destination operand").
// This failed on the first GPU run (2026-11-26) with a 1-operand plan.
TEST(CudaBasicPlan, ZeroDimEmptyAndOneDimTensorsKeepTheirOperands) {
  const Tensor scalar = ops::full({}, 2.5, DType::F32);
  ASSERT_EQ(scalar.dim(), 0);
  const Tensor empty = ops::zeros({3, 0}, DType::F32), vec = ops::zeros({5}, DType::F32);
  const Tensor every_other = ops::zeros({5, 2}, DType::F32).narrow(1, 0, 1);  // (5, 1), stride 2
  const Tensor cases[] = {scalar, empty, vec, ops::zeros({1}, DType::F32)};
  for (const Tensor& t : cases) {
    SCOPED_TRACE("shape " + std::to_string(t.dim()) + "-d, numel " + std::to_string(t.numel()));
    const cuda::StridedPlan one =
        cuda::plan_strided("copy", t.dim(), t.shape().data(), t.strides().data());
    const cuda::StridedPlan two = cuda::plan_strided("copy", t.dim(), t.shape().data(),
                                                     t.strides().data(), t.strides().data());
    EXPECT_EQ(one.nops, 1);
    EXPECT_EQ(two.nops, 2);
    EXPECT_EQ(one.numel, t.numel());
    EXPECT_EQ(two.numel, t.numel());
    EXPECT_LE(two.ndim, 1);
    if (t.numel() > 0) {
      EXPECT_TRUE(cuda::plan_is_dense(two, 0));
      EXPECT_TRUE(cuda::plan_is_dense(two, 1));
      I64 off[2] = {-1, -1};
      const I64 last = t.numel() - 1;
      cuda::plan_offsets<2>(cuda::to_index_plan<I64>(two), last, off);
      EXPECT_EQ(off[0], last);
      EXPECT_EQ(off[1], last);
    }
  }
  // Null stride pointers with ndim 0 are two operands too (what an empty strides vector gives).
  EXPECT_EQ(cuda::plan_strided("copy", 0, nullptr, nullptr, nullptr).nops, 2);
  EXPECT_EQ(cuda::plan_strided("copy", 0, nullptr, nullptr).nops, 1);
  // A column view (5, 1) with row stride 2 into a dense (5, 1): two operands, one dim after
  // the size-1 dim is dropped, strides 2 and 1.
  const Tensor col = ops::zeros({5, 1}, DType::F32);
  const cuda::StridedPlan p = cuda::plan_strided(
      "copy", 2, every_other.shape().data(), every_other.strides().data(), col.strides().data());
  EXPECT_EQ(p.nops, 2);
  ASSERT_EQ(p.ndim, 1);
  EXPECT_EQ(p.stride[0][0], 2);
  EXPECT_EQ(p.stride[1][0], 1);
}

TEST(CudaBasicPlan, Fits32Bits) {
  const I64 big = I64{1} << 30;
  std::vector<I64> shape{big}, st{2};
  EXPECT_TRUE(cuda::plan_fits_u32(cuda::plan_strided("t", 1, shape.data(), st.data())));
  shape[0] = big + 1;  // last offset 2^31
  EXPECT_FALSE(cuda::plan_fits_u32(cuda::plan_strided("t", 1, shape.data(), st.data())));
  shape[0] = I64{1} << 31;
  st[0] = 1;  // numel 2^31
  EXPECT_FALSE(cuda::plan_fits_u32(cuda::plan_strided("t", 1, shape.data(), st.data())));
  shape[0] = (I64{1} << 31) - 1;
  EXPECT_TRUE(cuda::plan_fits_u32(cuda::plan_strided("t", 1, shape.data(), st.data())));
  // Small numel, huge second-operand offset.
  std::vector<I64> s2{4, 4}, a{4, 1}, b{big, 1};
  EXPECT_FALSE(cuda::plan_fits_u32(cuda::plan_strided("t", 2, s2.data(), a.data(), b.data())));
}

TEST(CudaBasicPlan, CoveringSpan) {
  const std::vector<I64> col{100, 1}, col_st{50, 1};  // one column of a (100, 50) matrix
  EXPECT_EQ(cuda::covering_span(2, col.data(), col_st.data()), 1 + 99 * 50);
  const std::vector<I64> ex{4, 5}, ex_st{0, 1};  // (5) expanded to (4, 5)
  EXPECT_EQ(cuda::covering_span(2, ex.data(), ex_st.data()), 5);
  const std::vector<I64> em{4, 0}, em_st{1, 1};
  EXPECT_EQ(cuda::covering_span(2, em.data(), em_st.data()), 0);
  EXPECT_EQ(cuda::covering_span(0, nullptr, nullptr), 1);
  const std::vector<I64> tr{4, 3}, tr_st{1, 4};
  EXPECT_EQ(cuda::covering_span(2, tr.data(), tr_st.data()), 12);
}

// Every logical index of several views, two operands, through both index types.
TEST(CudaBasicPlan, OffsetsMatchNaiveIndexing) {
  struct View {
    std::vector<I64> shape, a, b;
  };
  const std::vector<View> views = {
      // (6,5,4,3) permuted to (3,6,4,5) vs a dense output
      {{3, 6, 4, 5}, {1, 60, 3, 12}, {120, 20, 5, 1}},
      // narrowed middle dim of (7, 9, 5) -> (7, 4, 5), with a broadcast second operand
      {{7, 4, 5}, {45, 5, 1}, {0, 5, 1}},
      // expanded size-1 dims mixed with real ones
      {{2, 1, 3, 1, 4}, {0, 7, 4, 9, 1}, {12, 12, 4, 4, 1}},
      // 8 dims of size 2, reversed strides in a, dense b
      {{2, 2, 2, 2, 2, 2, 2, 2}, {1, 2, 4, 8, 16, 32, 64, 128}, {128, 64, 32, 16, 8, 4, 2, 1}},
      // scalar broadcast
      {{5, 3}, {0, 0}, {3, 1}},
  };
  for (std::size_t v = 0; v < views.size(); ++v) {
    const View& w = views[v];
    const int nd = static_cast<int>(w.shape.size());
    const cuda::StridedPlan p = cuda::plan_strided("t", nd, w.shape.data(), w.a.data(), w.b.data());
    ASSERT_TRUE(cuda::plan_fits_u32(p));
    const auto p64 = cuda::to_index_plan<I64>(p);
    const auto p32 = cuda::to_index_plan<std::uint32_t>(p);
    for (I64 i = 0; i < p.numel; ++i) {
      I64 o64[2];
      std::uint32_t o32[2];
      cuda::plan_offsets<2>(p64, i, o64);
      cuda::plan_offsets<2>(p32, static_cast<std::uint32_t>(i), o32);
      const I64 wa = naive_offset(w.shape, w.a, i), wb = naive_offset(w.shape, w.b, i);
      ASSERT_EQ(o64[0], wa) << "view " << v << " index " << i;
      ASSERT_EQ(o64[1], wb) << "view " << v << " index " << i;
      ASSERT_EQ(I64{o32[0]}, wa) << "view " << v << " index " << i;
      ASSERT_EQ(I64{o32[1]}, wb) << "view " << v << " index " << i;
    }
    I64 max_a = 0, max_b = 0;
    for (I64 i = 0; i < p.numel; ++i) {
      max_a = std::max(max_a, naive_offset(w.shape, w.a, i));
      max_b = std::max(max_b, naive_offset(w.shape, w.b, i));
    }
    EXPECT_EQ(cuda::plan_max_offset(p, 0), max_a) << "view " << v;
    EXPECT_EQ(cuda::plan_max_offset(p, 1), max_b) << "view " << v;
  }
}

// The reduce split of x (shape, strides) over dim k: element (o, d, j) must land where the naive
// multi-index says.
void check_reduce_plan(const std::vector<I64>& shape, const std::vector<I64>& strides, int k) {
  const int nd = static_cast<int>(shape.size());
  I64 outer = 1, inner = 1;
  for (int d = 0; d < k; ++d) outer *= shape[d];
  for (int d = k + 1; d < nd; ++d) inner *= shape[d];
  const I64 n = shape[k];
  const cuda::ReducePlan p =
      cuda::plan_reduce("t", nd, shape.data(), strides.data(), outer, n, inner);
  EXPECT_EQ(p.outer, outer);
  EXPECT_EQ(p.n, n);
  EXPECT_EQ(p.inner, inner);
  for (I64 o = 0; o < outer; ++o)
    for (I64 d = 0; d < n; ++d)
      for (I64 j = 0; j < inner; ++j) {
        const I64 got = cuda::group_offset(p.outer_dims, o) + d * p.n_stride +
                        cuda::group_offset(p.inner_dims, j);
        ASSERT_EQ(got, naive_offset(shape, strides, (o * n + d) * inner + j))
            << "dim " << k << " (o, d, j) = (" << o << ", " << d << ", " << j << ")";
      }
}

TEST(CudaBasicPlan, ReduceSplit) {
  // Contiguous (3, 4, 5): the outer and inner groups collapse to one dim each.
  const std::vector<I64> s{3, 4, 5}, c{20, 5, 1};
  const cuda::ReducePlan p = cuda::plan_reduce("t", 3, s.data(), c.data(), 3, 4, 5);
  EXPECT_EQ(p.n_stride, 5);
  ASSERT_EQ(p.outer_dims.ndim, 1);
  EXPECT_EQ(p.outer_dims.stride[0], 20);
  ASSERT_EQ(p.inner_dims.ndim, 1);
  EXPECT_EQ(p.inner_dims.stride[0], 1);
  for (int k = 0; k < 3; ++k) check_reduce_plan(s, c, k);
  // (5, 4, 3) permuted from a contiguous (3, 4, 5): strides (1, 5, 20).
  const std::vector<I64> t{5, 4, 3}, ts{1, 5, 20};
  for (int k = 0; k < 3; ++k) check_reduce_plan(t, ts, k);
  // Four dims with a narrowed one and a broadcast one.
  const std::vector<I64> u{2, 3, 4, 5}, us{80, 0, 10, 2};
  for (int k = 0; k < 4; ++k) check_reduce_plan(u, us, k);
  // Size-1 dims, including the reduced one.
  const std::vector<I64> v{1, 6, 1, 2}, vs{7, 2, 9, 1};
  for (int k = 0; k < 4; ++k) check_reduce_plan(v, vs, k);
  // n == 1 between outer and inner without a size-1 dim there: a virtual dim of stride 0.
  const std::vector<I64> w{5, 12}, ws{1, 5};
  const cuda::ReducePlan q = cuda::plan_reduce("t", 2, w.data(), ws.data(), 5, 1, 12);
  EXPECT_EQ(q.n_stride, 0);
  for (I64 o = 0; o < 5; ++o)
    for (I64 j = 0; j < 12; ++j)
      ASSERT_EQ(cuda::group_offset(q.outer_dims, o) + cuda::group_offset(q.inner_dims, j),
                naive_offset(w, ws, o * 12 + j));
  // A split that does not match the shape fails clearly.
  try {
    cuda::plan_reduce("reduce", 3, s.data(), c.data(), 4, 3, 5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[reduce] cannot view shape (3, 4, 5)"), std::string::npos)
        << e.what();
  }
}

#else  // CPU-only build

TEST(CudaBasicPlan, NeedsTheCudaBackend) {
  GTEST_SKIP() << "built without CUDA (KILN_CUDA off): the plan helpers live in the CUDA kernels";
}

#endif  // KILN_CUDA

// ---- device: CUDA vs CPU ------------------------------------------------------------------------

#define NEED_GPU()                                                                         \
  do {                                                                                     \
    if (cuda::device_count() == 0)                                                         \
      GTEST_SKIP() << "no CUDA device: the CUDA basic ops are compared with the CPU only " \
                      "on a GPU machine";                                                  \
  } while (0)

const Device kGpu = Device::cuda(0);

// Uniform f32 values made on the CPU, then rounded to dtype there (both sides see the same bits).
Tensor rnd(const Shape& shape, std::uint64_t seed, DType dtype = DType::F32, double lo = -1.0,
           double hi = 1.0) {
  Generator g(seed);
  return ops::rand_uniform(shape, g, lo, hi, DType::F32).to(dtype);
}

// Small integers as f32 (lots of ties), in dtype.
Tensor ints(const Shape& shape, std::uint64_t seed, int levels, DType dtype = DType::F32) {
  Generator g(seed);
  Tensor u = ops::rand_uniform(shape, g, 0.0, 1.0, DType::F32);
  std::vector<float> v = u.to_float_vector();
  for (auto& x : v) x = std::floor(x * static_cast<float>(levels));
  return ops::from_vector(v, shape, DType::F32).to(dtype);
}

::testing::AssertionResult close(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  if (got.dtype() != want.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(got.dtype()) << " vs " << dtype_name(want.dtype());
  if (!got.device().is_cpu())
    return ::testing::AssertionFailure() << "got is on " << got.device().str();
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) && std::isnan(g[i])) continue;
    if (!(std::abs(g[i] - w[i]) <= atol + rtol * std::abs(w[i])))
      return ::testing::AssertionFailure() << "index " << i << ": got " << g[i] << " want " << w[i];
  }
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult exact(const Tensor& got, const Tensor& want) {
  return close(got, want, 0.0, 0.0);
}

// The device copy of a CPU tensor's storage, viewed the same way: `view` is applied to the
// contiguous base on both sides, so the CUDA kernels see the strides (to(kGpu) of a CPU view
// would give them a contiguous tensor).
template <typename F>
Tensor on_gpu(const Tensor& base, F view) {
  return view(base.to(kGpu));
}
Tensor gpu_t(const Tensor& base) {  // base.transpose(0, 1) on the device
  return on_gpu(base, [](const Tensor& t) { return t.transpose(0, 1); });
}

// One bf16 ulp relative: results that round once from slightly different f32 values.
constexpr double kBf16Rtol = 8e-3;
double rtol_for(DType dt) { return dt == DType::F32 ? 1e-6 : kBf16Rtol; }

const std::vector<DType> kAllDtypes = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                       DType::I32, DType::I64, DType::Bool};
const std::vector<DType> kMathDtypes = {DType::F32, DType::BF16};

// Values every dtype represents: small integers and halves, some zeros (bool), negatives.
Tensor mixed_values(const Shape& shape, std::uint64_t seed, DType dtype) {
  Tensor t = ints(shape, seed, 9);       // 0..8
  Tensor v = ops::affine(t, 0.5, -2.0);  // -2 .. 2 in halves
  return v.to(dtype);
}

TEST(CudaBasic, CopyEveryDtypePair) {
  NEED_GPU();
  const Shape shape{3, 5, 7};
  for (DType s : kAllDtypes) {
    const Tensor x = mixed_values(shape, 11, s);
    const Tensor xg = x.to(kGpu);
    EXPECT_TRUE(exact(xg.to(Device::cpu()), x)) << dtype_name(s) << " round trip";
    for (DType d : kAllDtypes) {
      const Tensor want = x.to(d);  // the CPU's conversion
      const std::string what = std::string(dtype_name(s)) + " -> " + std::string(dtype_name(d));
      EXPECT_TRUE(exact(x.to(kGpu, d).to(Device::cpu()), want)) << "h2d " << what;
      EXPECT_TRUE(exact(xg.to(Device::cpu(), d), want)) << "d2h " << what;
      EXPECT_TRUE(exact(xg.to(d).to(Device::cpu()), want)) << "d2d " << what;
    }
  }
}

TEST(CudaBasic, CopyFloatToIntTruncates) {
  NEED_GPU();
  const Tensor x =
      ops::from_vector(std::vector<float>{-2.75f, -0.5f, 0.f, 0.25f, 1.99f, 7.5f}, {6}, DType::F32);
  for (DType d : {DType::I32, DType::I64, DType::Bool})
    EXPECT_TRUE(exact(x.to(kGpu).to(d).to(Device::cpu()), x.to(d))) << dtype_name(d);
}

TEST(CudaBasic, CopyStridedViews) {
  NEED_GPU();
  for (DType dt : kMathDtypes) {
    const Tensor base = rnd({6, 9, 5}, 21);
    // Host -> device from transposed, narrowed and expanded CPU views, converting to dt.
    const std::vector<Tensor> views = {base.transpose(0, 2), base.narrow(1, 2, 4),
                                       base.select(1, 3).unsqueeze(1).expand({6, 4, 5}),
                                       base.narrow(2, 1, 1),  // sparse: one of five columns
                                       base.permute({1, 2, 0})};
    for (std::size_t v = 0; v < views.size(); ++v) {
      const Tensor want = views[v].to(dt);
      EXPECT_TRUE(exact(views[v].to(kGpu, dt).to(Device::cpu()), want)) << "h2d view " << v;
      // The same view taken on the device: d2d gather and d2h gather.
      const Tensor g = base.to(kGpu);
      Tensor gv;
      switch (v) {
        case 0:
          gv = g.transpose(0, 2);
          break;
        case 1:
          gv = g.narrow(1, 2, 4);
          break;
        case 2:
          gv = g.select(1, 3).unsqueeze(1).expand({6, 4, 5});
          break;
        case 3:
          gv = g.narrow(2, 1, 1);
          break;
        default:
          gv = g.permute({1, 2, 0});
          break;
      }
      EXPECT_TRUE(exact(gv.to(dt).to(Device::cpu()), want)) << "d2d view " << v;
      EXPECT_TRUE(exact(gv.to(Device::cpu(), dt), want)) << "d2h view " << v;
      EXPECT_TRUE(exact(gv.contiguous().to(Device::cpu()), views[v])) << "contiguous view " << v;
    }
  }
  // A very sparse view (one column of a wide matrix) both ways.
  const Tensor wide = rnd({300, 200}, 22);
  const Tensor col = wide.narrow(1, 7, 1);
  EXPECT_TRUE(exact(col.to(kGpu).to(Device::cpu()), col.contiguous()));
  EXPECT_TRUE(exact(wide.to(kGpu).narrow(1, 7, 1).to(Device::cpu()), col.contiguous()));
  EXPECT_TRUE(
      exact(wide.to(kGpu).narrow(1, 7, 1).to(Device::cpu(), DType::BF16), col.to(DType::BF16)));
}

TEST(CudaBasic, CopyIntoStridedDestination) {
  NEED_GPU();
  for (DType dt : kMathDtypes) {
    // dst: columns 2..5 of a zeroed (6, 8) device tensor; the other columns must stay zero.
    const Tensor src = rnd({6, 4}, 31);
    Tensor dst = ops::zeros({6, 8}, dt, kGpu);
    Tensor dv = dst.narrow(1, 2, 4);
    dv.copy_(src);  // h2d with conversion into a strided dst
    Tensor want = ops::zeros({6, 8}, dt);
    Tensor wv = want.narrow(1, 2, 4);
    wv.copy_(src);
    EXPECT_TRUE(exact(dst.to(Device::cpu()), want)) << "h2d " << dtype_name(dt);
    // d2d from a transposed device source into the same strided dst.
    const Tensor srcT = rnd({4, 6}, 32);
    dv.copy_(srcT.to(kGpu).transpose(0, 1));
    wv.copy_(srcT.transpose(0, 1));
    EXPECT_TRUE(exact(dst.to(Device::cpu()), want)) << "d2d " << dtype_name(dt);
    // d2h into a strided CPU destination.
    Tensor host = ops::zeros({6, 8}, DType::F32);
    Tensor hv = host.narrow(1, 1, 4);
    hv.copy_(dst.narrow(1, 2, 4));
    Tensor hwant = ops::zeros({6, 8}, DType::F32);
    Tensor hwv = hwant.narrow(1, 1, 4);
    hwv.copy_(want.narrow(1, 2, 4));
    EXPECT_TRUE(exact(host, hwant)) << "d2h " << dtype_name(dt);
  }
}

TEST(CudaBasic, FillEveryDtype) {
  NEED_GPU();
  for (DType dt : kAllDtypes)
    for (double v : {0.0, 1.5, -2.0, 3.0})
      for (I64 n : {I64{1}, I64{7}, I64{1001}}) {
        const Tensor g = ops::full({n}, v, dt, kGpu);
        EXPECT_TRUE(exact(g.to(Device::cpu()), ops::full({n}, v, dt)))
            << dtype_name(dt) << " " << v << " n " << n;
      }
  // A misaligned start (offset 1 element) takes the scalar path for the whole range.
  Tensor big = ops::zeros({1003}, DType::BF16, kGpu);
  Tensor tail = big.narrow(0, 1, 1002);
  ops::fill_(tail, 0.75);
  Tensor want = ops::zeros({1003}, DType::BF16);
  Tensor wt = want.narrow(0, 1, 1002);
  ops::fill_(wt, 0.75);
  EXPECT_TRUE(exact(big.to(Device::cpu()), want));
}

TEST(CudaBasic, RandomMatchesCpuStream) {
  NEED_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (I64 n : {I64{1}, I64{6}, I64{4099}}) {
      Generator gc(1234, 77), gg(1234, 77);
      const Tensor uc = ops::rand_uniform({n}, gc, -0.5, 2.0, dt);
      const Tensor ug = ops::rand_uniform({n}, gg, -0.5, 2.0, dt, kGpu);
      EXPECT_TRUE(exact(ug.to(Device::cpu()), uc)) << "uniform " << dtype_name(dt) << " n " << n;
      EXPECT_EQ(gc.offset, gg.offset);
      const Tensor nc = ops::randn({n}, gc, 0.25, 1.5, dt);
      const Tensor ng = ops::randn({n}, gg, 0.25, 1.5, dt, kGpu);
      // logf/sinf/cosf differ by a few ulps between CUDA and libm.
      const double rtol = dt == DType::F32 || dt == DType::F64 ? 2e-6 : kBf16Rtol;
      EXPECT_TRUE(close(ng.to(Device::cpu()), nc, rtol, 1e-5))
          << "normal " << dtype_name(dt) << " n " << n;
    }
}

TEST(CudaBasic, BinaryBroadcastAndViews) {
  NEED_GPU();
  for (DType dt : kMathDtypes) {
    const Tensor a = rnd({3, 1, 5}, 41, dt);
    const Tensor b0 = rnd({5, 4}, 42, dt, 0.5, 2.0);
    const Tensor b = b0.transpose(0, 1), bg = gpu_t(b0);  // (4, 5) strided
    const Tensor big_a = rnd({7, 33, 65}, 43, dt), big_b = rnd({7, 33, 65}, 44, dt, 0.5, 2.0);
    const Tensor bias = rnd({65}, 45, dt);
    for (auto op : {ops::Binary::Add, ops::Binary::Sub, ops::Binary::Mul, ops::Binary::Div,
                    ops::Binary::Max, ops::Binary::Min}) {
      const std::string what =
          std::string(dtype_name(dt)) + " op " + std::to_string(static_cast<int>(op));
      EXPECT_TRUE(close(ops::binary(op, a.to(kGpu), bg).to(Device::cpu()), ops::binary(op, a, b),
                        rtol_for(dt), 0))
          << "broadcast " << what;
      EXPECT_TRUE(close(ops::binary(op, big_a.to(kGpu), big_b.to(kGpu)).to(Device::cpu()),
                        ops::binary(op, big_a, big_b), rtol_for(dt), 0))
          << "same shape " << what;
      EXPECT_TRUE(close(ops::binary(op, big_a.to(kGpu), bias.to(kGpu)).to(Device::cpu()),
                        ops::binary(op, big_a, bias), rtol_for(dt), 0))
          << "bias " << what;
      // Misaligned dense operands (offset 1): the scalar flat path.
      const Tensor ga = big_a.to(kGpu).flatten().narrow(0, 1, 1000);
      const Tensor gb = big_b.to(kGpu).flatten().narrow(0, 3, 1000);
      EXPECT_TRUE(close(
          ops::binary(op, ga, gb).to(Device::cpu()),
          ops::binary(op, big_a.flatten().narrow(0, 1, 1000), big_b.flatten().narrow(0, 3, 1000)),
          rtol_for(dt), 0))
          << "misaligned " << what;
    }
  }
  // NaN propagates through max/min.
  const Tensor x = ops::from_vector(std::vector<float>{1.f, NAN, 3.f}, {3});
  const Tensor y = ops::from_vector(std::vector<float>{NAN, 2.f, 1.f}, {3});
  for (auto op : {ops::Binary::Max, ops::Binary::Min})
    EXPECT_TRUE(
        exact(ops::binary(op, x.to(kGpu), y.to(kGpu)).to(Device::cpu()), ops::binary(op, x, y)));
}

TEST(CudaBasic, UnaryEveryOp) {
  NEED_GPU();
  for (DType dt : kMathDtypes)
    for (int o = 0; o <= static_cast<int>(ops::Unary::Sigmoid); ++o) {
      const auto op = static_cast<ops::Unary>(o);
      const bool positive = op == ops::Unary::Log || op == ops::Unary::Sqrt ||
                            op == ops::Unary::Rsqrt || op == ops::Unary::Reciprocal;
      const Tensor x = rnd({13, 7}, 50 + o, dt, positive ? 0.25 : -2.0, 2.0);
      const Tensor xt = x.transpose(0, 1), xg = gpu_t(x);  // strided
      const double rtol = dt == DType::F32 ? 2e-6 : kBf16Rtol;
      EXPECT_TRUE(close(ops::unary(op, xg).to(Device::cpu()), ops::unary(op, xt), rtol, 1e-7))
          << dtype_name(dt) << " op " << o << " strided";
      const Tensor big = rnd({10007}, 60 + o, dt, positive ? 0.25 : -2.0, 2.0);
      EXPECT_TRUE(
          close(ops::unary(op, big.to(kGpu)).to(Device::cpu()), ops::unary(op, big), rtol, 1e-7))
          << dtype_name(dt) << " op " << o << " dense";
    }
}

TEST(CudaBasic, AffineAxpyScale) {
  NEED_GPU();
  for (DType dt : kMathDtypes) {
    const Tensor x0 = rnd({9, 11}, 71, dt);
    const Tensor x = x0.transpose(0, 1), xg = gpu_t(x0);
    for (double beta : {0.0, -0.25})
      EXPECT_TRUE(close(ops::affine(xg, 1.5, beta).to(Device::cpu()), ops::affine(x, 1.5, beta),
                        rtol_for(dt), 0))
          << dtype_name(dt) << " beta " << beta;
    // axpy with x strided, in y's dtype and in f32.
    for (DType xdt : {dt, DType::F32}) {
      Tensor yc = rnd({11, 9}, 72, dt);
      Tensor yg = yc.to(kGpu);
      const Tensor xs0 = rnd({9, 11}, 73, xdt);
      const Tensor xs = xs0.transpose(0, 1);
      ops::axpy_(yg, -0.75, gpu_t(xs0));
      ops::axpy_(yc, -0.75, xs);
      // bf16: the CPU rounds alpha * x to bf16 before the add (two roundings), CUDA once.
      EXPECT_TRUE(close(yg.to(Device::cpu()), yc, rtol_for(dt), dt == DType::F32 ? 1e-6 : 1e-2))
          << "axpy y " << dtype_name(dt) << " x " << dtype_name(xdt);
    }
    // Dense axpy and scale (vector paths plus a tail).
    Tensor yc = rnd({10003}, 74, dt);
    Tensor yg = yc.to(kGpu);
    const Tensor xd = rnd({10003}, 75, dt);
    ops::axpy_(yg, 0.3, xd.to(kGpu));
    ops::axpy_(yc, 0.3, xd);
    EXPECT_TRUE(close(yg.to(Device::cpu()), yc, rtol_for(dt), dt == DType::F32 ? 1e-6 : 1e-2))
        << "dense axpy";
    yg = yc.to(kGpu);  // scale from identical values
    ops::scale_(yg, -1.25);
    ops::scale_(yc, -1.25);
    EXPECT_TRUE(close(yg.to(Device::cpu()), yc, rtol_for(dt), 1e-6)) << "scale";
  }
}

// Tolerance for a sum of n values of size ~1 accumulated in f32 on the GPU, double on the CPU.
double sum_atol(I64 n) { return 1e-6 * std::sqrt(static_cast<double>(n)) + 1e-6; }

TEST(CudaBasic, ReduceEveryDimAndLayout) {
  NEED_GPU();
  for (DType dt : kMathDtypes) {
    const Tensor base = rnd({5, 37, 9}, 81, dt);
    const std::vector<Tensor> inputs = {base, base.transpose(0, 2), base.narrow(1, 3, 30)};
    const Tensor bg = base.to(kGpu);
    const std::vector<Tensor> ginputs = {bg, bg.transpose(0, 2), bg.narrow(1, 3, 30)};
    for (std::size_t v = 0; v < inputs.size(); ++v)
      for (int dim = 0; dim < 3; ++dim)
        for (int o = 0; o <= static_cast<int>(ops::Reduce::Min); ++o) {
          const auto op = static_cast<ops::Reduce>(o);
          const Tensor want = ops::reduce(op, inputs[v], dim);
          const Tensor got = ops::reduce(op, ginputs[v], dim).to(Device::cpu());
          EXPECT_TRUE(close(got, want, rtol_for(dt), sum_atol(inputs[v].size(dim))))
              << dtype_name(dt) << " view " << v << " dim " << dim << " op " << o;
        }
  }
}

TEST(CudaBasic, ReduceLongRowsAndWholeVectors) {
  NEED_GPU();
  struct Case {
    Shape shape;
    int dim;
  };
  // Rows of 5000 (256-thread blocks), 20000 (1024-thread blocks), a whole vector of 1e6 (two
  // passes), a column sum with few tiles and a long n, and a strided whole vector.
  const std::vector<Case> cases = {
      {{3, 5000}, 1}, {{2, 20000}, 1}, {{1000003}, 0}, {{4097, 40}, 0}, {{3, 70001}, 1}};
  for (DType dt : kMathDtypes)
    for (const Case& c : cases)
      for (int o = 0; o <= static_cast<int>(ops::Reduce::Min); ++o) {
        const auto op = static_cast<ops::Reduce>(o);
        const Tensor x = rnd(c.shape, 90 + o, dt);
        EXPECT_TRUE(close(ops::reduce(op, x.to(kGpu), c.dim).to(Device::cpu()),
                          ops::reduce(op, x, c.dim), rtol_for(dt), sum_atol(x.size(c.dim))))
            << dtype_name(dt) << " " << shape_str(c.shape) << " op " << o;
      }
  // One column of a (200000, 2) matrix: a strided vector, two passes through group offsets.
  const Tensor m = rnd({200000, 2}, 99);
  const Tensor col = m.select(1, 1);
  for (int o = 0; o <= static_cast<int>(ops::Reduce::Min); ++o) {
    const auto op = static_cast<ops::Reduce>(o);
    EXPECT_TRUE(close(ops::reduce(op, m.to(kGpu).select(1, 1), 0).to(Device::cpu()),
                      ops::reduce(op, col, 0), 1e-6, sum_atol(200000)))
        << "strided vector op " << o;
  }
}

TEST(CudaBasic, ReduceNanAndEmpty) {
  NEED_GPU();
  Tensor x = rnd({4, 6}, 101);
  std::vector<float> v = x.to_float_vector();
  v[1 * 6 + 2] = NAN;  // row 1
  x = ops::from_vector(v, {4, 6});
  for (auto op : {ops::Reduce::Max, ops::Reduce::Min, ops::Reduce::Sum})
    for (int dim : {0, 1})
      EXPECT_TRUE(close(ops::reduce(op, x.to(kGpu), dim).to(Device::cpu()), ops::reduce(op, x, dim),
                        1e-6, 1e-6))
          << "op " << static_cast<int>(op) << " dim " << dim;
  // Sum over an empty dim is zero.
  // (Tensor::empty: ops::zeros rejects a shape with a 0 between other dims as non-contiguous.)
  const Tensor e = Tensor::empty({3, 0, 4}, DType::F32, kGpu);
  EXPECT_TRUE(exact(ops::sum(e, 1).to(Device::cpu()), ops::zeros({3, 4})));
}

TEST(CudaBasic, ArgmaxFirstMaximum) {
  NEED_GPU();
  for (DType dt : kMathDtypes) {
    const Tensor x = ints({6, 50, 7}, 111, 5, dt);  // values 0..4: many ties
    const Tensor xg = x.to(kGpu);
    const std::vector<std::pair<Tensor, Tensor>> ins = {{x, xg},
                                                        {x.transpose(0, 2), xg.transpose(0, 2)}};
    for (std::size_t v = 0; v < ins.size(); ++v)
      for (int dim = 0; dim < 3; ++dim)
        EXPECT_TRUE(exact(ops::argmax(ins[v].second, dim).to(Device::cpu()),
                          ops::argmax(ins[v].first, dim)))
            << dtype_name(dt) << " view " << v << " dim " << dim;
    // A long row (one block) with its maximum repeated.
    const Tensor row = ints({2, 150001}, 112, 1000, dt);
    EXPECT_TRUE(exact(ops::argmax(row.to(kGpu), 1).to(Device::cpu()), ops::argmax(row, 1)));
  }
  // NaN: the first NaN wins.
  const Tensor n = ops::from_vector(std::vector<float>{1.f, 5.f, NAN, 2.f, NAN, 5.f}, {1, 6});
  const Tensor got = ops::argmax(n.to(kGpu), 1).to(Device::cpu());
  EXPECT_EQ(got.item(), 2.0);
  EXPECT_TRUE(exact(got, ops::argmax(n, 1)));
}

TEST(CudaBasic, SumAllAndSumSquares) {
  NEED_GPU();
  for (DType dt : kMathDtypes) {
    const Tensor big = rnd({1000003}, 121, dt);
    const Tensor m0 = rnd({700, 900}, 122, dt);
    const Tensor small = rnd({3, 5}, 123, dt);
    const std::vector<std::pair<Tensor, Tensor>> ins = {
        {big, big.to(kGpu)}, {m0.transpose(0, 1), gpu_t(m0)}, {small, small.to(kGpu)}};
    for (const auto& [x, xg] : ins) {
      const double want = ops::sum_all(x).item();
      const Tensor got = ops::sum_all(xg);
      EXPECT_EQ(got.dim(), 0);
      EXPECT_NEAR(got.item(), want,
                  (dt == DType::F32 ? 1e-5 : 1e-2) * (1 + std::abs(want)) + sum_atol(x.numel()))
          << dtype_name(dt) << " " << shape_str(x.shape());
      // Squares of f32 values are exact in f64 and both sides sum in f64.
      const double sq = ops::sum_squares(x);
      EXPECT_NEAR(ops::sum_squares(xg), sq, 1e-10 * sq) << dtype_name(dt);
    }
  }
  EXPECT_EQ(ops::sum_all(ops::zeros({0}, DType::F32, kGpu)).item(), 0.0);
  EXPECT_EQ(ops::sum_squares(ops::zeros({0}, DType::F32, kGpu)), 0.0);
}

TEST(CudaBasic, ReductionsAreDeterministic) {
  NEED_GPU();
  const Tensor x = rnd({1 << 20}, 131).to(kGpu);
  const double a = ops::sum_all(x).item(), b = ops::sum_all(x).item();
  EXPECT_EQ(a, b);
  EXPECT_EQ(ops::sum_squares(x), ops::sum_squares(x));
  const Tensor y = rnd({4096, 96}, 132).to(kGpu);
  EXPECT_TRUE(exact(ops::sum(y, 0).to(Device::cpu()), ops::sum(y, 0).to(Device::cpu())));
}

TEST(CudaBasic, UnsupportedDtypesFailClearly) {
  NEED_GPU();
  const Tensor a = ops::zeros({4}, DType::I32, kGpu);
  try {
    ops::add(a, a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              ops::detail::no_kernel_message("binary", DeviceType::CUDA, DType::I32));
  }
  EXPECT_THROW(ops::sum(ops::zeros({4}, DType::F64, kGpu), 0), Error);
}

}  // namespace
}  // namespace kiln
