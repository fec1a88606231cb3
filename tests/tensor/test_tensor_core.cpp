// Tensor core: dtype/device names, views checked against index arithmetic, copies and dtype
// round trips, printing, the meta device, the memory tracker and the CPU allocator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"

namespace kiln {
namespace {

std::int64_t round64(std::int64_t n) { return (n + 63) / 64 * 64; }

// A contiguous f64 tensor holding 0, 1, 2, ... so a view's values are the storage indices
// it reads.
Tensor iota(const Shape& shape, DType dtype = DType::F64) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0);
  return ops::from_vector(v, shape, dtype);
}

std::int64_t cur(MemCategory c, DeviceType d = DeviceType::CPU) {
  return MemoryTracker::get(d).stats().current[static_cast<std::size_t>(c)];
}
std::int64_t total(DeviceType d) { return MemoryTracker::get(d).stats().total; }

// ---- names ----------------------------------------------------------------------------------

TEST(DType, ParseAndNames) {
  EXPECT_EQ(parse_dtype("f32"), DType::F32);
  EXPECT_EQ(parse_dtype("fp32"), DType::F32);
  EXPECT_EQ(parse_dtype("float32"), DType::F32);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("f16"), DType::F16);
  EXPECT_EQ(parse_dtype("fp16"), DType::F16);
  EXPECT_EQ(parse_dtype("float16"), DType::F16);
  EXPECT_EQ(parse_dtype("f64"), DType::F64);
  EXPECT_EQ(parse_dtype("i32"), DType::I32);
  EXPECT_EQ(parse_dtype("i64"), DType::I64);
  EXPECT_EQ(parse_dtype("bool"), DType::Bool);
  EXPECT_THROW(parse_dtype("f8"), Error);
  EXPECT_THROW(parse_dtype(""), Error);
  for (DType t :
       {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::Bool}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(dtype_from_safetensors(dtype_safetensors_name(t)), t);
  }
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::Bool), 1u);
  EXPECT_TRUE(is_floating(DType::BF16));
  EXPECT_FALSE(is_floating(DType::I32));
}

TEST(Device, Parse) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("meta"), Device::meta());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_EQ(Device::cuda(0).str(), "cuda");
  EXPECT_EQ(Device::meta().str(), "meta");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:99999", "CPU", ""})
    EXPECT_THROW(Device::parse(bad), Error) << bad;
}

// ---- views ----------------------------------------------------------------------------------

TEST(Views, ViewAndReshape) {
  Tensor a = iota({4, 6});
  Tensor v = a.view({2, -1, 3});
  EXPECT_EQ(v.shape(), (Shape{2, 4, 3}));
  EXPECT_TRUE(v.same_storage(a));
  auto vals = v.to_double_vector();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(vals[i], i);
  EXPECT_THROW(a.view({5, -1}), Error);
  EXPECT_THROW(a.view({-1, -1}), Error);
  EXPECT_THROW(a.view({7, 3}), Error);

  // A transpose cannot be viewed flat: view fails, reshape copies.
  Tensor t = a.transpose(0, 1);  // (6, 4)
  EXPECT_THROW(t.view({24}), Error);
  Tensor r = t.reshape({-1});
  EXPECT_FALSE(r.same_storage(a));
  EXPECT_TRUE(r.is_contiguous());
  auto rv = r.to_double_vector();
  for (int j = 0; j < 6; ++j)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(rv[j * 4 + i], i * 6 + j);
  // Splitting a dim of a transposed tensor is still a view.
  Tensor s = t.reshape({2, 3, 4});
  EXPECT_TRUE(s.same_storage(a));
  auto sv = s.to_double_vector();
  for (int j = 0; j < 6; ++j)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(sv[j * 4 + i], i * 6 + j);
  // A narrowed row block is viewable flat (contiguous rows).
  Tensor n = a.narrow(0, 1, 2).view({12});
  auto nv = n.to_double_vector();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(nv[i], 6 + i);
}

TEST(Views, TransposePermute) {
  Tensor a = iota({2, 3, 5});
  Tensor t = a.transpose(0, 2);  // (5, 3, 2)
  EXPECT_EQ(t.shape(), (Shape{5, 3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  auto tv = t.to_double_vector();
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) EXPECT_EQ(tv[(i * 3 + j) * 2 + k], k * 15 + j * 5 + i);
  Tensor p = a.permute({1, 2, 0});  // (3, 5, 2): p[i,j,k] = a[k,i,j]
  EXPECT_EQ(p.shape(), (Shape{3, 5, 2}));
  auto pv = p.to_double_vector();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 2; ++k) EXPECT_EQ(pv[(i * 5 + j) * 2 + k], k * 15 + i * 5 + j);
  EXPECT_THROW(a.permute({0, 0, 1}), Error);
  EXPECT_THROW(a.permute({0, 1}), Error);
  EXPECT_THROW(a.transpose(0, 3), Error);
  // Negative dims.
  EXPECT_EQ(a.transpose(-1, -3).shape(), (Shape{5, 3, 2}));
}

TEST(Views, NarrowSelect) {
  Tensor a = iota({4, 5, 3});
  Tensor n = a.narrow(1, 2, 3);  // (4, 3, 3)
  auto nv = n.to_double_vector();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) EXPECT_EQ(nv[(i * 3 + j) * 3 + k], i * 15 + (j + 2) * 3 + k);
  Tensor s = a.select(2, 1);  // (4, 5)
  EXPECT_EQ(s.shape(), (Shape{4, 5}));
  auto sv = s.to_double_vector();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) EXPECT_EQ(sv[i * 5 + j], i * 15 + j * 3 + 1);
  // Views of views: narrow then select then transpose.
  Tensor c = a.narrow(0, 1, 3).select(1, 4).transpose(0, 1);  // (3, 3): c[k,i] = a[i+1,4,k]
  auto cv = c.to_double_vector();
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(cv[k * 3 + i], (i + 1) * 15 + 4 * 3 + k);
  EXPECT_THROW(a.narrow(1, 3, 3), Error);
  EXPECT_THROW(a.narrow(1, -1, 2), Error);
  EXPECT_THROW(a.select(0, 4), Error);
}

TEST(Views, ExpandUnsqueezeSqueeze) {
  Tensor a = iota({3, 1});
  Tensor e = a.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.stride(0), 0);
  EXPECT_EQ(e.stride(2), 0);
  auto ev = e.to_double_vector();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) EXPECT_EQ(ev[(b * 3 + i) * 4 + j], i);
  EXPECT_EQ(a.expand({-1, 5}).shape(), (Shape{3, 5}));
  EXPECT_THROW(a.expand({4, 5}), Error);
  EXPECT_THROW(a.expand({5}), Error);

  Tensor b = iota({2, 3});
  Tensor u = b.unsqueeze(1);
  EXPECT_EQ(u.shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(b.unsqueeze(-1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(b.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(u.to_double_vector(), b.to_double_vector());
  EXPECT_EQ(u.squeeze(1).shape(), (Shape{2, 3}));
  EXPECT_EQ(b.squeeze(0).shape(), (Shape{2, 3}));  // size 2: unchanged
  // unsqueeze of a transposed tensor keeps the values.
  Tensor tu = b.transpose(0, 1).unsqueeze(1);  // (3, 1, 2)
  auto tv = tu.to_double_vector();
  for (int j = 0; j < 3; ++j)
    for (int i = 0; i < 2; ++i) EXPECT_EQ(tv[j * 2 + i], i * 3 + j);
}

// ---- copies ---------------------------------------------------------------------------------

TEST(Copies, ContiguousOfViews) {
  Tensor a = iota({3, 4, 5}, DType::F32);
  Tensor p = a.permute({2, 0, 1}).narrow(0, 1, 3);  // (3, 3, 4): p[i,j,k] = a[j,k,i+1]
  Tensor c = p.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.same_storage(a));
  EXPECT_EQ(c.strides(), contiguous_strides({3, 3, 4}));
  auto cv = c.to_double_vector();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(cv[(i * 3 + j) * 4 + k], j * 20 + k * 5 + i + 1);
  // Already contiguous: the same tensor.
  EXPECT_EQ(a.contiguous().impl(), a.impl());
  Tensor cl = a.clone();
  EXPECT_FALSE(cl.same_storage(a));
  EXPECT_EQ(cl.to_double_vector(), a.to_double_vector());
}

TEST(Copies, CopyIntoStridedDestination) {
  Tensor big = ops::full({5, 7}, -1.0, DType::F32);
  Tensor dst = big.narrow(1, 2, 3).narrow(0, 1, 3);  // rows 1..3, cols 2..4
  Tensor src = iota({3, 3}, DType::F64);             // converts f64 -> f32
  dst.copy_(src);
  auto bv = big.to_double_vector();
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j) {
      bool in = i >= 1 && i <= 3 && j >= 2 && j <= 4;
      EXPECT_EQ(bv[i * 7 + j], in ? (i - 1) * 3 + (j - 2) : -1.0) << i << "," << j;
    }
  // A transposed destination, with a broadcast source row.
  Tensor sq = ops::zeros({4, 4}, DType::F64);
  Tensor row = iota({4});
  sq.transpose(0, 1).copy_(row);  // sq^T[i,j] = j  =>  sq[j,i] = j
  auto sv = sq.to_double_vector();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(sv[i * 4 + j], i);
  // Expanded (stride 0) destinations are refused.
  Tensor e = ops::zeros({1, 3}).expand({2, 3});
  EXPECT_THROW(e.copy_(ops::ones({2, 3})), Error);
}

TEST(Copies, DTypeRoundTrips) {
  // Values exactly representable in bf16 (8 significant bits), f16 and i32.
  std::vector<double> v = {0, 1, -1, 2.5, -3.75, 96, -128, 0.125, 1024, -6, 7, 255};
  Tensor f32 = ops::from_vector(v, {3, 4}, DType::F32);
  for (DType t : {DType::BF16, DType::F16, DType::F64, DType::I32, DType::F32}) {
    Tensor x = f32.to(t);
    EXPECT_EQ(x.dtype(), t);
    EXPECT_EQ(x.shape(), (Shape{3, 4}));
    auto xv = x.to_double_vector();
    for (std::size_t i = 0; i < v.size(); ++i) {
      double want = t == DType::I32 ? std::trunc(v[i]) : v[i];
      EXPECT_EQ(xv[i], want) << dtype_name(t) << " " << i;
    }
    Tensor back = x.to(DType::F32);
    if (t != DType::I32) EXPECT_EQ(back.to_double_vector(), v) << dtype_name(t);
  }
  // Chains: f32 -> bf16 -> f16 -> f64 -> i32 -> f32 on integers.
  Tensor ints = ops::from_vector(std::vector<double>{3, -7, 100, 0, 64, -2}, {6}, DType::F32);
  Tensor chain = ints.to(DType::BF16).to(DType::F16).to(DType::F64).to(DType::I32).to(DType::F32);
  EXPECT_EQ(chain.to_double_vector(), ints.to_double_vector());
  // Same dtype: the same tensor.
  EXPECT_EQ(f32.to(DType::F32).impl(), f32.impl());
  // A non-contiguous source converts by its logical order.
  Tensor tb = f32.transpose(0, 1).to(DType::BF16);
  auto tv = tb.to_double_vector();
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(tv[j * 3 + i], v[i * 4 + j]);
}

// An empty tensor is contiguous whatever its strides: zeros({5, 0}) has strides (1, 1) and must
// still take its own fill (on CUDA the fill kernel refuses non-contiguous tensors; the first GPU
// run failed CudaMatmul.EmptyInnerDimension there), and the products with an empty inner
// dimension are zeros (or the bias, or beta * c).
TEST(Copies, EmptyTensorsAreContiguous) {
  for (const Shape& s : {Shape{5, 0}, Shape{0, 7}, Shape{0}, Shape{2, 0, 3}}) {
    const Tensor t = ops::zeros(s);
    EXPECT_TRUE(t.is_contiguous()) << shape_str(s);
    EXPECT_TRUE(t.transpose(0, -1).is_contiguous()) << shape_str(s);
    EXPECT_EQ(t.numel(), 0);
  }
  const Tensor a = ops::zeros({5, 0}), b = ops::zeros({0, 7});
  EXPECT_EQ(ops::matmul(a, b).to_double_vector(), std::vector<double>(35, 0.0));
  const Tensor bias = ops::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7}, {7}, DType::F32);
  const std::vector<double> y = ops::linear(a, ops::zeros({7, 0}), bias).to_double_vector();
  ASSERT_EQ(y.size(), 35u);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], static_cast<double>(i % 7 + 1));
  Tensor c = ops::full({5, 7}, 1.5);
  ops::gemm_(c, a, b, false, false, 1.0, 2.0);
  EXPECT_EQ(c.to_double_vector(), std::vector<double>(35, 3.0));
  // The 16-bit Linear kernels count rows by the output too (bf16 and f16 take the native path).
  for (DType dt : {DType::BF16, DType::F16}) {
    const std::vector<double> y16 =
        ops::linear(a.to(dt), ops::zeros({7, 0}, dt), bias.to(dt)).to_double_vector();
    ASSERT_EQ(y16.size(), 35u) << dtype_name(dt);
    for (std::size_t i = 0; i < y16.size(); ++i)
      EXPECT_EQ(y16[i], static_cast<double>(i % 7 + 1)) << dtype_name(dt) << " at " << i;
  }
}

TEST(Printing, StrShowsValuesAndShape) {
  Tensor a = ops::from_vector(std::vector<float>{1.5f, -2.f, 3.25f, 4.f, 5.f, 6.f}, {2, 3});
  std::string s = a.str();
  EXPECT_NE(s.find("1.5"), std::string::npos) << s;
  EXPECT_NE(s.find("-2"), std::string::npos) << s;
  EXPECT_NE(s.find("3.25"), std::string::npos) << s;
  EXPECT_NE(s.find("shape=(2, 3)"), std::string::npos) << s;
  EXPECT_NE(s.find("f32"), std::string::npos) << s;
  std::string is = ops::from_vector(std::vector<std::int32_t>{7, 8, 9}, {3}).str();
  EXPECT_NE(is.find("[7, 8, 9]"), std::string::npos) << is;
  EXPECT_NE(is.find("(3,)"), std::string::npos) << is;
  // Long dims are elided.
  std::string ls = iota({100}).str(6);
  EXPECT_NE(ls.find("..."), std::string::npos) << ls;
  EXPECT_NE(ls.find("99"), std::string::npos) << ls;
  EXPECT_EQ(ls.find("50"), std::string::npos) << ls;
  Tensor m = Tensor::empty({2, 2}, DType::BF16, Device::meta());
  std::string ms = m.str();
  EXPECT_NE(ms.find("meta"), std::string::npos) << ms;
  EXPECT_NE(ms.find("bf16"), std::string::npos) << ms;
  EXPECT_EQ(Tensor().str(), "Tensor(undefined)");
}

// ---- meta device ----------------------------------------------------------------------------

TEST(Meta, OpsAllocateAndTrackWithoutData) {
  const auto M = DeviceType::Meta;
  std::int64_t base = total(M);
  {
    Tensor x = Tensor::empty({3, 5, 16}, DType::F32, Device::meta());
    EXPECT_EQ(x.raw_data(), nullptr);
    EXPECT_EQ(total(M) - base, round64(3 * 5 * 16 * 4));
    // No values: it reads as zeros (a dry run follows the real control flow), one per element.
    EXPECT_EQ(x.to_double_vector(), std::vector<double>(3 * 5 * 16, 0.0));
    EXPECT_EQ(x.to_float_vector(), std::vector<float>(3 * 5 * 16, 0.0f));
    Tensor w = Tensor::empty({24, 16}, DType::F32, Device::meta());
    Tensor b = Tensor::empty({24}, DType::F32, Device::meta());
    std::int64_t before = total(M);
    Tensor y = ops::linear(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{3, 5, 24}));
    EXPECT_EQ(y.device(), Device::meta());
    EXPECT_EQ(total(M) - before, round64(3 * 5 * 24 * 4));  // only the output stays

    before = total(M);
    Tensor a3 = Tensor::empty({4, 7, 9}, DType::BF16, Device::meta());
    Tensor b3 = Tensor::empty({4, 9, 11}, DType::BF16, Device::meta());
    Tensor c3 = ops::matmul(a3, b3);
    EXPECT_EQ(c3.shape(), (Shape{4, 7, 11}));
    EXPECT_EQ(c3.dtype(), DType::BF16);
    EXPECT_EQ(total(M) - before,
              round64(4 * 7 * 9 * 2) + round64(4 * 9 * 11 * 2) + round64(4 * 7 * 11 * 2));

    before = total(M);
    Tensor g = Tensor::empty({16}, DType::F32, Device::meta());
    auto [yn, rstd] = ops::rmsnorm(x, g, 1e-5);
    EXPECT_EQ(yn.shape(), x.shape());
    EXPECT_EQ(rstd.shape(), (Shape{15}));
    EXPECT_EQ(total(M) - before, round64(16 * 4) + round64(240 * 4) + round64(15 * 4));

    Tensor q = Tensor::empty({2, 5, 4, 8}, DType::BF16, Device::meta());
    Tensor kc = Tensor::empty({2, 12, 2, 8}, DType::BF16, Device::meta());
    Tensor k = kc.narrow(1, 0, 9);
    before = total(M);
    auto [o, lse] = ops::attention(q, k, k, 0.3, 4);
    EXPECT_EQ(o.shape(), q.shape());
    EXPECT_EQ(o.dtype(), DType::BF16);
    EXPECT_EQ(lse.shape(), (Shape{2, 4, 5}));
    EXPECT_EQ(lse.dtype(), DType::F32);
    EXPECT_EQ(total(M) - before, round64(2 * 5 * 4 * 8 * 2) + round64(2 * 4 * 5 * 4));
  }
  EXPECT_EQ(total(M), base);
}

TEST(Meta, CategoriesAndCudaRounding) {
  const auto M = DeviceType::Meta;
  std::int64_t w0 = cur(MemCategory::Weights, M), kv0 = cur(MemCategory::KVCache, M);
  {
    MemoryScope s(MemCategory::Weights);
    Tensor a = Tensor::empty({100}, DType::BF16, Device::meta());  // 200 B -> 256
    EXPECT_EQ(cur(MemCategory::Weights, M) - w0, 256);
    set_meta_simulates(DeviceType::CUDA);
    Tensor b;
    {
      MemoryScope kv(MemCategory::KVCache);
      b = Tensor::empty({100}, DType::BF16, Device::meta());  // 200 B -> 512
    }
    EXPECT_EQ(cur(MemCategory::KVCache, M) - kv0, 512);
    b = Tensor();
    set_meta_simulates(DeviceType::CPU);
    EXPECT_EQ(cur(MemCategory::KVCache, M), kv0);
  }
  EXPECT_EQ(cur(MemCategory::Weights, M), w0);
}

// ---- memory tracker -------------------------------------------------------------------------

TEST(MemoryTracker, ScopesChargeAndRestore) {
  const auto M = DeviceType::Meta;
  EXPECT_EQ(current_mem_category(), MemCategory::Temporaries);  // the default
  auto before = MemoryTracker::get(M).stats();
  Tensor w, g, o, t;
  {
    MemoryScope s1(MemCategory::Weights);
    w = Tensor::empty({10}, DType::F32, Device::meta());  // 64
    {
      MemoryScope s2(MemCategory::Gradients);
      EXPECT_EQ(current_mem_category(), MemCategory::Gradients);
      g = Tensor::empty({100}, DType::F32, Device::meta());  // 448
      {
        MemoryScope s3(MemCategory::OptimizerState);
        o = Tensor::empty({3, 7}, DType::F64, Device::meta());  // 168 -> 192
      }
    }
    EXPECT_EQ(current_mem_category(), MemCategory::Weights);
  }
  EXPECT_EQ(current_mem_category(), MemCategory::Temporaries);
  t = Tensor::empty({1}, DType::Bool, Device::meta());  // 1 -> 64
  auto after = MemoryTracker::get(M).stats();
  auto d = [&](MemCategory c) {
    auto i = static_cast<std::size_t>(c);
    return after.current[i] - before.current[i];
  };
  EXPECT_EQ(d(MemCategory::Weights), 64);
  EXPECT_EQ(d(MemCategory::Gradients), 448);
  EXPECT_EQ(d(MemCategory::OptimizerState), 192);
  EXPECT_EQ(d(MemCategory::Temporaries), 64);
  EXPECT_EQ(after.total - before.total, 64 + 448 + 192 + 64);
  EXPECT_EQ(after.num_allocs - before.num_allocs, 4);
  EXPECT_EQ(w.storage()->category(), MemCategory::Weights);
  EXPECT_EQ(o.storage()->category(), MemCategory::OptimizerState);
  // Frees go back to the category of the allocation, whatever scope is current.
  {
    MemoryScope s(MemCategory::Activations);
    g = Tensor();
  }
  EXPECT_EQ(MemoryTracker::get(M).stats().current[static_cast<std::size_t>(MemCategory::Gradients)],
            before.current[static_cast<std::size_t>(MemCategory::Gradients)]);
}

TEST(MemoryTracker, PeakBreakdownPhaseAndLabel) {
  auto& tr = MemoryTracker::get(DeviceType::Meta);
  tr.reset_peaks();
  auto base = tr.stats();
  Tensor keep;
  {
    MemoryScope s(MemCategory::Weights);
    keep = Tensor::empty({1000}, DType::F32, Device::meta());  // 4000 -> 4032
  }
  {
    PhaseScope ph(Phase::Backward);
    MemLabelScope label("my_layer");
    EXPECT_EQ(current_phase(), Phase::Backward);
    EXPECT_STREQ(current_mem_label(), "my_layer");
    MemoryScope s(MemCategory::Activations);
    Tensor big = Tensor::empty({5000}, DType::F32, Device::meta());  // 20000 -> 20032
    {
      MemoryScope tmp(MemCategory::Temporaries);
      Tensor t = Tensor::empty({16}, DType::F32, Device::meta());  // 64: the peak
    }
  }
  EXPECT_EQ(current_phase(), Phase::Idle);
  // A later, smaller allocation in another phase does not move the peak.
  {
    PhaseScope ph(Phase::Optimizer);
    Tensor small = Tensor::empty({8}, DType::F32, Device::meta());
  }
  auto s = tr.stats();
  auto at = [&](MemCategory c) {
    auto i = static_cast<std::size_t>(c);
    return s.at_peak[i] - base.current[i];
  };
  EXPECT_EQ(s.total_peak - base.total, 4032 + 20032 + 64);
  EXPECT_EQ(at(MemCategory::Weights), 4032);
  EXPECT_EQ(at(MemCategory::Activations), 20032);
  EXPECT_EQ(at(MemCategory::Temporaries), 64);
  EXPECT_EQ(s.peak_phase, Phase::Backward);
  EXPECT_EQ(s.peak_label, "my_layer");
  EXPECT_EQ(s.peak[static_cast<std::size_t>(MemCategory::Activations)] -
                base.current[static_cast<std::size_t>(MemCategory::Activations)],
            20032);
  EXPECT_EQ(s.total - base.total, 4032);
  std::string summary = format_memory_summary(s, "meta");
  EXPECT_NE(summary.find("activations"), std::string::npos) << summary;
  EXPECT_NE(summary.find("backward"), std::string::npos) << summary;
  EXPECT_NE(summary.find("my_layer"), std::string::npos) << summary;
  // reset_peaks: peaks come down to what is alive now.
  keep = Tensor();
  tr.reset_peaks();
  auto r = tr.stats();
  EXPECT_EQ(r.total_peak, r.total);
  EXPECT_EQ(r.at_peak, r.current);
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(2048), "2.00 KiB");
}

TEST(MemoryTracker, TimelineOnOffAndDump) {
  auto& tr = MemoryTracker::get(DeviceType::Meta);
  tr.set_timeline(true);
  std::int64_t base = tr.stats().total;
  {
    PhaseScope ph(Phase::Forward);
    MemLabelScope label("mlp");
    MemoryScope s(MemCategory::Activations);
    Tensor a = Tensor::empty({32}, DType::F32, Device::meta());  // 128
    Tensor b = Tensor::empty({10}, DType::F64, Device::meta());  // 80 -> 128
  }
  auto ev = tr.timeline();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].delta, 128);
  EXPECT_EQ(ev[0].total, base + 128);
  EXPECT_EQ(ev[0].category, MemCategory::Activations);
  EXPECT_EQ(ev[0].phase, Phase::Forward);
  EXPECT_EQ(ev[0].label, "mlp");
  EXPECT_EQ(ev[1].total, base + 256);
  EXPECT_EQ(ev[2].delta + ev[3].delta, -256);
  EXPECT_EQ(ev[3].total, base);
  for (std::size_t i = 1; i < ev.size(); ++i) EXPECT_EQ(ev[i].seq, ev[i - 1].seq + 1);

  std::string path = std::string(KILN_BINARY_DIR) + "/test_tensor_timeline.jsonl";
  tr.dump_timeline(path);
  std::ifstream f(path);
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(f, line))
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  std::remove(path.c_str());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["category"], "activations");
  EXPECT_EQ(lines[0]["phase"], "forward");
  EXPECT_EQ(lines[0]["label"], "mlp");
  EXPECT_EQ(lines[0]["delta"], 128);
  EXPECT_EQ(lines[3]["total"], base);

  tr.set_timeline(false);
  EXPECT_TRUE(tr.timeline().empty());
  { Tensor c = Tensor::empty({4}, DType::F32, Device::meta()); }
  EXPECT_TRUE(tr.timeline().empty());
  EXPECT_THROW(tr.dump_timeline("/nonexistent_dir_kiln/x.jsonl"), Error);
}

TEST(CpuAllocator, BytesReturnToBaseline) {
  empty_cpu_cache();
  auto& tr = MemoryTracker::get(DeviceType::CPU);
  auto base = tr.stats();
  {
    std::vector<Tensor> ts;
    MemoryScope s(MemCategory::Activations);
    for (std::int64_t n : {1, 17, 1000, 70000, 300000, 70000})
      ts.push_back(ops::ones({n}, DType::F32));
    Tensor v = ts[3].narrow(0, 5, 10);  // a view adds nothing
    auto mid = tr.stats();
    std::int64_t want = 0;
    for (std::int64_t n : {1, 17, 1000, 70000, 300000, 70000}) want += round64(n * 4);
    EXPECT_EQ(mid.total - base.total, want);
    EXPECT_EQ(mid.current[static_cast<std::size_t>(MemCategory::Activations)] -
                  base.current[static_cast<std::size_t>(MemCategory::Activations)],
              want);
    EXPECT_GE(mid.reserved, mid.total);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ts[1].raw_data()) % 64, 0u);
  }
  auto after = tr.stats();
  EXPECT_EQ(after.total, base.total);
  EXPECT_EQ(after.current, base.current);
  // Large blocks stay cached (reserved, not allocated) until the cache is emptied.
  EXPECT_GE(after.reserved, after.total);
  empty_cpu_cache();
  EXPECT_EQ(tr.stats().reserved, base.reserved);
  // A cached block is reused for the same rounded size.
  {
    Tensor a = ops::zeros({70000});
    void* p = a.raw_data();
    a = Tensor();
    Tensor b = ops::zeros({70000});
    EXPECT_EQ(b.raw_data(), p);
  }
  empty_cpu_cache();
}

TEST(Tensor, ShapeChecks) {
  EXPECT_THROW(Tensor::empty({-1, 3}), Error);
  EXPECT_THROW(Tensor::empty({std::int64_t{1} << 40, std::int64_t{1} << 40}), Error);
  EXPECT_THROW(ops::from_vector(std::vector<float>{1, 2, 3}, {2, 2}), Error);
  Tensor a = ops::zeros({2, 3});
  EXPECT_EQ(a.size(-1), 3);
  EXPECT_THROW(a.size(2), Error);
  EXPECT_THROW(a.item(), Error);
  EXPECT_EQ(ops::full({}, 2.5).item(), 2.5);
  EXPECT_THROW(a.data<double>(), Error);
  EXPECT_EQ(shape_str({3}), "(3,)");
  EXPECT_EQ(shape_str({2, 3}), "(2, 3)");
  EXPECT_THROW(ops::zeros({2}, DType::I32).set_requires_grad(true), Error);
}

}  // namespace
}  // namespace kiln
