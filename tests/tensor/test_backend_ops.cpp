// Backend-ops test, after ggml's test-backend-ops: every op of
// kernels/op_list.h, in f32 and bf16, on odd shapes and non-contiguous views,
// runs through the op front end on the CPU and on CUDA from the same inputs,
// and the outputs are compared.
//
//  - NaN or Inf in any output, on either side, fails (inputs are finite by
//  construction).
//  - Agreement is the normalized MSE, sum((cuda - cpu)^2) / sum(cpu^2), under a
//  per-op threshold
//    (the table below, with the reasoning for bf16).
//  - Guard bytes: the CUDA caching allocator is put in guard mode (64 bytes
//  after every block,
//    filled with a pattern); after each case no guard may have changed.
//
// Without a GPU the comparison tests skip with a message. One test runs
// everywhere: every op in kOpList has at least one case here, so a new op
// cannot go untested on CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/runtime.h"
#include "kernels/op_list.h"
#include "tensor/caching_allocator.h"
#include "tensor/ops.h"
#include "tests/tensor/backend_ops.h"

namespace kiln {
namespace backend_ops {
std::vector<Case> &registered_cases() {
  static std::vector<Case> cases;
  return cases;
}
}  // namespace backend_ops

namespace {

using backend_ops::Case;
using backend_ops::Env;
using backend_ops::Tol;

using ops::Binary;
using ops::Unary;

// ---- thresholds
// -----------------------------------------------------------------------------
// f32: the limits (1e-7 elementwise, 5e-4 matmul and attention);
// reductions, norms and softmax get 1e-6 (summation order differs between the
// backends). bf16: both backends compute in f32 and round the result once, so
// where the f32 results differ in the last bits an output may land one bf16 ulp
// apart: a relative error of at most 2^-8 = 3.9e-3, i.e. a squared error of at
// most 1.5e-5 even if every element flipped. So elementwise ops get 2e-5. Ops
// whose bf16 outputs feed further bf16 arithmetic inside the kernel (matmul
// accumulates in f32 either way; attention rounds P to bf16 for the tensor-core
// P.V product on CUDA while the CPU keeps f32) get 1e-3. These are derived
// bounds, to be replaced by the measured worst case of the first GPU run
// (bench/results/).
double nmse_limit(Tol t, DType dt) {
  const bool lowp = dt != DType::F32;
  switch (t) {
    case Tol::Elementwise:
      return lowp ? 2e-5 : 1e-7;
    case Tol::Reduction:
      return lowp ? 1e-4 : 1e-6;
    case Tol::Matmul:
      return lowp ? 1e-3 : 5e-4;
    case Tol::Attention:
      return lowp ? 1e-3 : 5e-4;
  }
  return 0;
}

std::vector<Case> all_cases() {
  std::vector<Case> c;
  auto add = [&](Op op, std::string name, Tol tol,
                 std::function<std::vector<Tensor>(const Env &)> f) {
    c.push_back({op, std::move(name), tol, std::move(f)});
  };
  // Copy: strided (transposed) -> dense, dtype conversions both ways, a strided
  // destination.
  add(Op::Copy, "transpose_contiguous", Tol::Elementwise, [](const Env &e) {
    return std::vector{e.in({7, 33}, 1).transpose(0, 1).contiguous()};
  });
  add(Op::Copy, "convert_f32_roundtrip", Tol::Elementwise, [](const Env &e) {
    Tensor x = e.in({5, 129}, 2);
    return std::vector{x.to(DType::F32), x.to(DType::F32).to(e.dt)};
  });
  add(Op::Copy, "strided_destination", Tol::Elementwise, [](const Env &e) {
    Tensor dst = ops::zeros({9, 12}, e.dt, e.dev);
    Tensor view = dst.narrow(1, 3, 5);
    view.copy_(e.in({9, 5}, 3));
    return std::vector{dst};
  });
  add(Op::Copy, "broadcast_source", Tol::Elementwise, [](const Env &e) {
    Tensor dst = ops::zeros({6, 7}, e.dt, e.dev);
    dst.copy_(e.in({1, 7}, 4));
    return std::vector{dst};
  });
  add(Op::Fill, "fill", Tol::Elementwise, [](const Env &e) {
    return std::vector{ops::full({3, 129}, 3.25, e.dt, e.dev)};
  });
  for (Binary b : {Binary::Add, Binary::Sub, Binary::Mul, Binary::Div, Binary::Max, Binary::Min}) {
    add(Op::Binary, "binary_broadcast_" + std::to_string(static_cast<int>(b)), Tol::Elementwise,
        [b](const Env &e) {
          Tensor x = e.in({5, 1, 7}, 5);
          Tensor y = b == Binary::Div ? e.in({1, 3, 7}, 6, 0.5, 2.0) : e.in({1, 3, 7}, 6);
          return std::vector{ops::binary(b, x, y)};
        });
    add(Op::Binary, "binary_strided_" + std::to_string(static_cast<int>(b)), Tol::Elementwise,
        [b](const Env &e) {
          Tensor x = e.in({33, 9}, 7).transpose(0, 1);
          Tensor y = b == Binary::Div ? e.in({9, 33}, 8, 0.5, 2.0) : e.in({9, 33}, 8);
          return std::vector{ops::binary(b, x, y)};
        });
  }
  for (Unary u : {Unary::Neg, Unary::Exp, Unary::Log, Unary::Sqrt, Unary::Rsqrt, Unary::Abs,
                  Unary::Square, Unary::Reciprocal, Unary::Tanh, Unary::Sigmoid}) {
    const bool positive =
        u == Unary::Log || u == Unary::Sqrt || u == Unary::Rsqrt || u == Unary::Reciprocal;
    add(Op::Unary, "unary_" + std::to_string(static_cast<int>(u)), Tol::Elementwise,
        [u, positive](const Env &e) {
          Tensor x = positive ? e.in({3, 1000}, 9, 0.1, 3.0) : e.in({3, 1000}, 9, -3.0, 3.0);
          return std::vector{ops::unary(u, x), ops::unary(u, x.transpose(0, 1))};
        });
  }
  add(Op::Unary, "affine_axpy_scale", Tol::Elementwise, [](const Env &e) {
    Tensor x = e.in({4, 257}, 10);
    Tensor y = ops::affine(x, 1.5, -0.25);
    Tensor acc = e.in({4, 257}, 11);
    ops::axpy_(acc, 0.5, x);
    ops::scale_(acc, -2.0);
    return std::vector{y, acc};
  });
  for (int dim = 0; dim < 3; ++dim) {
    add(Op::Reduce, "reduce_dim" + std::to_string(dim), Tol::Reduction, [dim](const Env &e) {
      Tensor x = e.in({4, 37, 5}, 12);
      return std::vector{ops::reduce(ops::Reduce::Sum, x, dim),
                         ops::reduce(ops::Reduce::Mean, x, dim, true),
                         ops::reduce(ops::Reduce::Max, x, dim),
                         ops::reduce(ops::Reduce::Min, x, dim), ops::argmax(x, dim).to(DType::F64)};
    });
  }
  add(Op::Reduce, "sum_all_sum_squares", Tol::Reduction, [](const Env &e) {
    Tensor x = e.in({3, 4099}, 13);
    double sq = ops::sum_squares(x);
    return std::vector{ops::sum_all(x), ops::full({1}, sq, DType::F64, e.dev)};
  });
  for (bool log : {false, true}) {
    add(Op::Softmax, log ? "log_softmax" : "softmax", Tol::Reduction, [log](const Env &e) {
      Tensor x = e.in({13, 257}, 14, -4.0, 4.0), dy = e.in({13, 257}, 15);
      Tensor y = log ? ops::log_softmax(x) : ops::softmax(x);
      Tensor dx = log ? ops::log_softmax_backward(y, dy) : ops::softmax_backward(y, dy);
      return std::vector{y, dx};
    });
  }
  add(Op::Embedding, "embedding", Tol::Reduction, [](const Env &e) {
    Tensor ids = e.ids(3 * 41, 50, 16).view({3, 41});
    Tensor table = e.in({50, 24}, 17);
    Tensor out = ops::embedding(ids, table);
    Tensor dtable = ops::zeros({50, 24}, DType::F32, e.dev);
    ops::embedding_backward_(dtable, ids, e.in({3, 41, 24}, 18));
    return std::vector{out, dtable};
  });
  add(Op::RmsNorm, "rmsnorm", Tol::Reduction, [](const Env &e) {
    Tensor x = e.in({3, 11, 129}, 19), w = e.in({129}, 20), dy = e.in({3, 11, 129}, 21);
    auto [y, rstd] = ops::rmsnorm(x, w, 1e-5);
    Tensor dw = ops::zeros({129}, e.dt, e.dev);
    Tensor dx = ops::rmsnorm_backward(x, w, rstd, dy, &dw);
    return std::vector{y, rstd, dx, dw};
  });
  // A strided input, and decode's one wide row (the block-per-row path on CUDA).
  add(Op::RmsNorm, "add_rmsnorm", Tol::Reduction, [](const Env &e) {
    Tensor x = e.in({136, 9}, 70).transpose(0, 1), r = e.in({9, 136}, 71);
    Tensor w = e.in({136}, 72);
    auto [s, y, rstd] = ops::add_rmsnorm(x, r, w, 1e-5);
    Tensor xw = e.in({1, 4096}, 73), rw = e.in({1, 4096}, 74), ww = e.in({4096}, 75);
    auto [sw, yw, rstdw] = ops::add_rmsnorm(xw, rw, ww, 1e-6);
    return std::vector{s, y, rstd, sw, yw, rstdw};
  });
  add(Op::LayerNorm, "layernorm", Tol::Reduction, [](const Env &e) {
    Tensor x = e.in({7, 200}, 22), w = e.in({200}, 23), b = e.in({200}, 24);
    Tensor dy = e.in({7, 200}, 25);
    auto [y, mean, rstd] = ops::layernorm(x, w, b, 1e-5);
    Tensor dw = ops::zeros({200}, e.dt, e.dev), db = ops::zeros({200}, e.dt, e.dev);
    Tensor dx = ops::layernorm_backward(x, w, mean, rstd, dy, &dw, &db);
    return std::vector{y, mean, rstd, dx, dw, db};
  });
  for (auto style : {ops::RopeStyle::Interleaved, ops::RopeStyle::RotateHalf}) {
    add(Op::Rope, style == ops::RopeStyle::Interleaved ? "rope_interleaved" : "rope_rotate_half",
        Tol::Reduction, [style](const Env &e) {
          auto [cos, sin] = ops::rope_tables(32, 16, 10000.0, e.dt, e.dev);
          Tensor x = e.in({2, 9, 3, 16}, 26);
          return std::vector{ops::rope(x, cos, sin, style, 5),
                             ops::rope(x, cos, sin, style, 5, /*backward=*/true)};
        });
  }
  std::uint64_t act_seed = 27;  // every activation of kActivations, forward and backward
  for_each_activation([&]<Op O>() {
    const std::uint64_t seed = act_seed;
    act_seed += 2;
    add(O, std::string(op_name(O)), Tol::Elementwise, [seed](const Env &e) {
      Tensor x = e.in({5, 301}, seed, -6, 6), dy = e.in({5, 301}, seed + 1);
      return std::vector{ops::activation(O, x), ops::activation_backward(O, x, dy)};
    });
  });
  add(Op::SwiGlu, "swiglu", Tol::Elementwise, [](const Env &e) {
    Tensor g = e.in({5, 301}, 31, -6, 6), u = e.in({5, 301}, 32), d = e.in({5, 301}, 33);
    auto [dg, du] = ops::swiglu_backward(g, u, d);
    return std::vector{ops::swiglu(g, u), dg, du};
  });
  // Attention: training shapes (forward + backward) at the tensor-core head
  // dims and an odd one, GQA 2:1, and a decode step reading a KV-cache view
  // with a larger batch stride.
  for (std::int64_t D : {16, 64, 128}) {
    add(Op::Attention, "attention_train_d" + std::to_string(D), Tol::Attention, [D](const Env &e) {
      const std::int64_t B = 2, T = 70, Hq = 4, Hkv = 2;
      Tensor q = e.in({B, T, Hq, D}, 34), k = e.in({B, T, Hkv, D}, 35);
      Tensor v = e.in({B, T, Hkv, D}, 36), dout = e.in({B, T, Hq, D}, 37);
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      auto [out, lse] = ops::attention(q, k, v, scale, 0);
      auto [dq, dk, dv] = ops::attention_backward(q, k, v, out, lse, dout, scale);
      return std::vector{out, lse, dq, dk, dv};
    });
  }
  add(Op::Attention, "attention_decode_kv_cache", Tol::Attention, [](const Env &e) {
    const std::int64_t B = 2, Tmax = 48, len = 40, Hq = 8, Hkv = 2, D = 64;
    Tensor kc = e.in({B, Tmax, Hkv, D}, 38), vc = e.in({B, Tmax, Hkv, D}, 39);
    Tensor q = e.in({B, 3, Hq, D}, 40);
    auto [out, lse] = ops::attention(q, kc.narrow(1, 0, len), vc.narrow(1, 0, len), 0.125, len - 3);
    return std::vector{out, lse};
  });
  add(Op::CrossEntropy, "cross_entropy", Tol::Reduction, [](const Env &e) {
    const std::int64_t N = 17, V = 1000;
    Tensor logits = e.in({N, V}, 41, -5, 5);
    std::vector<std::int32_t> t(N);
    for (std::int64_t i = 0; i < N; ++i) t[i] = static_cast<std::int32_t>((i * 389) % V);
    t[3] = -100;  // ignored row
    Tensor targets = ops::from_vector(t, {N}).to(e.dev);
    auto [loss, lse] = ops::cross_entropy(logits, targets, -100);
    Tensor dloss = e.in_f32({N}, 42);
    Tensor d = ops::cross_entropy_backward(logits, lse, targets, dloss, -100);
    Tensor d_inplace =
        ops::cross_entropy_backward(logits.clone(), lse, targets, dloss, -100, /*in_place=*/true);
    return std::vector{loss, lse, d, d_inplace};
  });
  add(Op::Dropout, "dropout", Tol::Elementwise, [](const Env &e) {
    Generator g(7, 11);
    Tensor x = e.in({3, 1001}, 43);
    auto [y, mask] = ops::dropout(x, 0.3, g);
    Tensor dx = ops::dropout_backward(e.in({3, 1001}, 44), mask, 0.3);
    return std::vector{y, mask.to(DType::F32), dx};
  });
  add(Op::AdamW, "adamw", Tol::Elementwise, [](const Env &e) {
    // Optimizer state is f32 whatever the model dtype (mixed precision keeps
    // f32 masters).
    Tensor p = e.in_f32({1001}, 45), m = ops::zeros({1001}, DType::F32, e.dev);
    Tensor v = ops::zeros({1001}, DType::F32, e.dev);
    for (int step = 1; step <= 3; ++step)
      ops::adamw_step_(p, e.in_f32({1001}, 46 + step), m, v, 1e-2, 0.9, 0.95, 1e-8, 0.1, step);
    // The multi-tensor step: an f32 parameter and a low-precision one with an
    // f32 master.
    ops::AdamWTensors a{e.in_f32({257}, 50),
                        e.in_f32({257}, 51),
                        Tensor(),
                        ops::zeros({257}, DType::F32, e.dev),
                        ops::zeros({257}, DType::F32, e.dev),
                        0.1};
    // In bf16 the second item is a bf16 parameter with an f32 master and a bf16
    // gradient.
    const bool lowp = e.dt != DType::F32;
    Tensor master = e.in_f32({3, 33}, 52);
    ops::AdamWTensors b{lowp ? master.to(e.dt) : master,
                        e.in({3, 33}, 53),
                        lowp ? master : Tensor(),
                        ops::zeros({3, 33}, DType::F32, e.dev),
                        ops::zeros({3, 33}, DType::F32, e.dev),
                        0.0};
    std::vector<ops::AdamWTensors> items{a, b};
    ops::adamw_multi_step_(items, 1e-2, 0.9, 0.95, 1e-8, 1);
    return std::vector{p, m, v, a.param, a.m, a.v, b.param, master, b.m, b.v};
  });
  add(Op::Sgd, "sgd", Tol::Elementwise, [](const Env &e) {
    Tensor p = e.in_f32({1001}, 54), buf = ops::zeros({1001}, DType::F32, e.dev);
    for (int step = 1; step <= 3; ++step)
      ops::sgd_step_(p, e.in_f32({1001}, 55 + step), buf, 0.1, 0.9, 0.0, 1e-4, true, step);
    return std::vector{p, buf};
  });
  add(Op::Random, "randn", Tol::Elementwise, [](const Env &e) {
    Generator g(123, 4);
    return std::vector{ops::randn({7, 131}, g, 0.5, 2.0, e.dt, e.dev)};
  });
  add(Op::Random, "rand_uniform", Tol::Elementwise, [](const Env &e) {
    Generator g(321, 9);
    return std::vector{ops::rand_uniform({7, 131}, g, -2.0, 3.0, e.dt, e.dev)};
  });
  // GEMM: plain, transposed, beta accumulation, batched, a broadcast 2-d b,
  // bias, odd sizes.
  add(Op::Gemm, "matmul_odd", Tol::Matmul, [](const Env &e) {
    return std::vector{ops::matmul(e.in({33, 17}, 60), e.in({17, 129}, 61))};
  });
  add(Op::Gemm, "matmul_transposed", Tol::Matmul, [](const Env &e) {
    return std::vector{ops::matmul(e.in({17, 33}, 62), e.in({129, 17}, 63), true, true)};
  });
  add(Op::Gemm, "matmul_batched_broadcast", Tol::Matmul, [](const Env &e) {
    return std::vector{ops::matmul(e.in({3, 7, 65}, 64), e.in({3, 65, 9}, 65)),
                       ops::matmul(e.in({3, 7, 65}, 66), e.in({65, 9}, 67))};
  });
  add(Op::Gemm, "gemm_beta_accumulate", Tol::Matmul, [](const Env &e) {
    // In-place gemm is the f32 gradient-accumulation path (the CPU has it in
    // f32/f64 only).
    Tensor c = e.in_f32({31, 45}, 68);
    ops::gemm_(c, e.in_f32({100, 31}, 69), e.in_f32({45, 100}, 70), true, true, 0.5, 1.0);
    return std::vector{c};
  });
  add(Op::Gemm, "linear_bias_strided_input", Tol::Matmul, [](const Env &e) {
    Tensor x = e.in({2, 64, 5}, 71).transpose(1, 2);  // (2, 5, 64), not contiguous
    return std::vector{ops::linear(x, e.in({48, 64}, 72), e.in({48}, 73)),
                       ops::linear(x, e.in({48, 64}, 74), Tensor())};
  });
  // The cases other test files of this binary register beside their op's own tests.
  for (const Case &r : backend_ops::registered_cases()) c.push_back(r);
  return c;
}

// ---- comparison
// -----------------------------------------------------------------------------

std::string check_finite(const std::vector<double> &v) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      return "non-finite value " + std::to_string(v[i]) + " at " + std::to_string(i);
  return "";
}

bool have_gpu() { return cuda::device_count() > 0; }

TEST(BackendOps, EveryOpHasACase) {
  std::set<Op> covered;
  for (const Case &c : all_cases()) covered.insert(c.op);
  std::string missing;
  for (const auto &info : kOpList)
    if (!covered.count(info.op))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(info.name);
  EXPECT_TRUE(missing.empty()) << "ops with no backend-ops case: " << missing;
}

TEST(BackendOps, CasesRunOnMetaWithTheSameShapes) {
  // The meta device follows the CUDA path (outputs only); every case must at
  // least build its outputs there with the CPU's shapes and dtypes. Inputs are
  // made on the CPU, so run the meta side with inputs moved to meta.
  for (const Case &c : all_cases()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      std::vector<Tensor> cpu = c.run(Env{Device::cpu(), dt});
      std::vector<Tensor> meta;
      ASSERT_NO_THROW(meta = c.run(Env{Device::meta(), dt})) << c.name;
      ASSERT_EQ(cpu.size(), meta.size()) << c.name;
      for (std::size_t i = 0; i < cpu.size(); ++i) {
        EXPECT_EQ(cpu[i].shape(), meta[i].shape()) << c.name << " output " << i;
        EXPECT_EQ(cpu[i].dtype(), meta[i].dtype()) << c.name << " output " << i;
      }
    }
  }
}

class BackendOpsCuda : public ::testing::TestWithParam<DType> {};

TEST_P(BackendOpsCuda, MatchesCpu) {
  if (!have_gpu())
    GTEST_SKIP() << "no CUDA device: the backend-ops comparison (" << all_cases().size()
                 << " cases x f32/bf16) needs a GPU; scripts/gpu_check.sh runs it";
  const DType dt = GetParam();
  caching::set_guard_bytes(64);
  int failures = 0;
  for (const Case &c : all_cases()) {
    SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)));
    std::vector<Tensor> ref = c.run(Env{Device::cpu(), dt});
    std::vector<Tensor> got;
    try {
      got = c.run(Env{Device::cuda(), dt});
      cuda::device_synchronize();
    } catch (const Error &err) {
      ADD_FAILURE() << c.name << ": " << err.what();
      ++failures;
      continue;
    }
    ASSERT_EQ(ref.size(), got.size());
    const double limit = nmse_limit(c.tol, dt);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(ref[i].shape(), got[i].shape()) << "output " << i;
      EXPECT_EQ(ref[i].dtype(), got[i].dtype()) << "output " << i;
      EXPECT_TRUE(got[i].device().is_cuda())
          << "output " << i << " is on " << got[i].device().str();
      std::vector<double> a = ref[i].to_double_vector(), b = got[i].to_double_vector();
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(check_finite(a), "") << "CPU output " << i;
      EXPECT_EQ(check_finite(b), "") << "CUDA output " << i;
      double num = 0, den = 0;
      for (std::size_t j = 0; j < a.size(); ++j) {
        num += (b[j] - a[j]) * (b[j] - a[j]);
        den += a[j] * a[j];
      }
      const double nmse = den > 0 ? num / den : num;
      EXPECT_LE(nmse, limit) << "output " << i << " nmse " << nmse;
      if (!(nmse <= limit)) ++failures;
    }
    std::vector<std::string> broken = caching::check_guards();
    for (const auto &b : broken) ADD_FAILURE() << "guard bytes overwritten: " << b;
  }
  caching::set_guard_bytes(0);
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BackendOpsCuda, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto &info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace kiln
