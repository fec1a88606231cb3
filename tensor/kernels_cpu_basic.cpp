// CPU kernels of the basic families (copy, fill, random, elementwise, reductions, matmul):
// the glue from op arguments (tensor/op_args.h) to kernels/cpu/, and their registrations.
// Each glue runs on tensors in its compute type T, as the dispatcher delivered them: contiguous
// unless registered Layout::Strided.
#include <algorithm>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemv_bf16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/random.h"
#include "kernels/cpu/reduce.h"
#include "tensor/kernels_cpu.h"
#include "tensor/op_args.h"

namespace kiln::ops {
namespace cpu_glue {
namespace {

// dst (contiguous, T) = src (any dtype, any strides, expanded to dst's shape).
template <class T>
struct CopyCpu {
  static void run(CopyArgs& a) {
    const Tensor& s = a.src;
    dispatch_dtype(s.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      kiln::cpu::copy_strided<S, T>(s.dim(), s.shape().data(), static_cast<const S*>(s.raw_data()),
                                    s.strides().data(), a.dst.template data<T>());
    });
  }
};

template <class T>
struct FillCpu {
  static void run(FillArgs& a) {
    kiln::cpu::fill<T>(a.t.numel(), kiln::cpu::convert_scalar<T>(a.value), a.t.template data<T>());
  }
};

// Draws in T (f32, or f64 for f64), so every dtype sees the same numbers.
template <class T>
struct RandomCpu {
  static void run(RandomArgs& a) {
    if (a.normal)
      kiln::cpu::random_normal<T>(a.t.numel(), a.a, a.b, a.seed, a.offset, a.t.template data<T>());
    else
      kiln::cpu::random_uniform<T>(a.t.numel(), a.a, a.b, a.seed, a.offset, a.t.template data<T>());
  }
};

template <class T>
struct BinaryCpu {
  static void run(BinaryArgs& a) {
    const Shape& shape = a.out.shape();
    Tensor ea = a.a.expand(shape), eb = a.b.expand(shape);
    kiln::cpu::binary<T>(static_cast<kiln::cpu::BinaryOp>(a.op), static_cast<int>(shape.size()),
                         shape.data(), ea.template data<T>(), ea.strides().data(),
                         eb.template data<T>(), eb.strides().data(), a.out.template data<T>());
  }
};

template <class T>
struct UnaryCpu {
  static void run(UnaryArgs& a) {
    kiln::cpu::unary<T>(static_cast<kiln::cpu::UnaryOp>(a.op), a.x.numel(), a.x.template data<T>(),
                        a.out.template data<T>());
  }
};

template <class T>
struct AffineCpu {
  static void run(AffineArgs& a) {
    T* out = a.out.template data<T>();
    kiln::cpu::mul_scalar<T>(a.x.numel(), a.x.template data<T>(), static_cast<T>(a.alpha), out);
    if (a.beta != 0.0) kiln::cpu::add_scalar<T>(a.x.numel(), out, static_cast<T>(a.beta), out);
  }
};

template <class T>
struct AxpyCpu {
  static void run(AxpyArgs& a) {
    kiln::cpu::axpy<T>(a.y.numel(), static_cast<T>(a.alpha), a.x.template data<T>(),
                       a.y.template data<T>());
  }
};

template <class T>
struct ScaleCpu {
  static void run(ScaleArgs& a) {
    T* y = a.y.template data<T>();
    kiln::cpu::mul_scalar<T>(a.y.numel(), y, static_cast<T>(a.alpha), y);
  }
};

template <class T>
struct ReduceCpu {
  static void run(ReduceArgs& a) {
    kiln::cpu::reduce<T>(static_cast<kiln::cpu::ReduceOp>(a.op), a.outer, a.n, a.inner,
                         a.x.template data<T>(), a.out.template data<T>());
  }
};

template <class T>
struct ArgmaxCpu {
  static void run(ArgmaxArgs& a) {
    kiln::cpu::argmax<T>(a.outer, a.n, a.inner, a.x.template data<T>(),
                         a.out.template data<std::int64_t>());
  }
};

template <class T>
struct SumAllCpu {
  static void run(SumAllArgs& a) {
    kiln::cpu::sum_all<T>(a.x.numel(), a.x.template data<T>(), a.out.template data<T>());
  }
};

template <class T>
struct SumSquaresCpu {
  static void run(SumSquaresArgs& a) {
    a.result = kiln::cpu::sum_squares<T>(a.x.numel(), a.x.template data<T>());
  }
};

template <class T>
struct GemmCpu {
  static void run(GemmArgs& a) {
    const std::int64_t M = a.c.size(0), N = a.c.size(1);
    const std::int64_t K = a.trans_a ? a.a.size(0) : a.a.size(1);
    kiln::cpu::gemm<T>(a.trans_a, a.trans_b, M, N, K, static_cast<T>(a.alpha),
                       a.a.template data<T>(), a.a.size(1), a.b.template data<T>(), a.b.size(1),
                       static_cast<T>(a.beta), a.c.template data<T>(), N);
  }
};

template <class T>
struct MatmulCpu {
  static void run(MatmulArgs& a) {
    const std::int64_t M = a.out.size(-2), N = a.out.size(-1);
    const std::int64_t K = a.trans_a ? a.a.size(-2) : a.a.size(-1);
    const std::int64_t batch = a.out.dim() == 3 ? a.out.size(0) : 1;
    kiln::cpu::gemm_batched<T>(a.trans_a, a.trans_b, M, N, K, T(1), a.a.template data<T>(),
                               a.a.size(-1), a.a.dim() == 3 ? M * K : 0, a.b.template data<T>(),
                               a.b.size(-1), a.b.dim() == 3 ? K * N : 0, T(0),
                               a.out.template data<T>(), N, M * N, batch);
  }
};

template <class T>
struct LinearCpu {
  static void run(LinearArgs& a) {
    const std::int64_t N = a.w.size(0), K = a.w.size(1), rows = rows_of(a.x);
    T* out = a.out.template data<T>();
    T beta = T(0);
    if (a.bias.defined()) {
      // Broadcast the bias into the output, then accumulate the product.
      const T* bp = a.bias.template data<T>();
      for (std::int64_t r = 0; r < rows; ++r) std::copy(bp, bp + N, out + r * N);
      beta = T(1);
    }
    kiln::cpu::gemm<T>(false, true, rows, N, K, T(1), a.x.template data<T>(), K,
                       a.w.template data<T>(), K, beta, out, N);
  }
};

// ---- bf16 Linear -------------------------------------------------------------------------------

// Up to this many rows of x (decode, small batches), bf16 Linear is a bandwidth-bound GEMV that
// reads the bf16 weight once, in place. Above it, the f32 kernel runs on f32 copies, as the
// dispatcher would convert for it (prefill, training).
constexpr std::int64_t kLinearGemvMaxRows = 16;

// out = x w^T + bias, all bf16 and contiguous; rows_of(x) <= kLinearGemvMaxRows.
void linear_bf16_gemv(LinearArgs& a) {
  const std::int64_t N = a.w.size(0), K = a.w.size(1), rows = rows_of(a.x);
  kiln::cpu::gemv_bf16<bf16, bf16>(rows, N, K, a.x.data<bf16>(), K, a.w.data<bf16>(), K,
                                   a.bias.defined() ? a.bias.data<bf16>() : nullptr,
                                   a.out.data<bf16>(), N);
}

Chosen<LinearArgs> linear_f32_kernel() {
  return {find_kernel<LinearArgs>(DeviceType::CPU, DType::F32), DType::F32};
}

struct LinearBf16Cpu {
  static void run(LinearArgs& a) {
    if (rows_of(a.x) <= kLinearGemvMaxRows) return linear_bf16_gemv(a);
    run_chosen(a, linear_f32_kernel());
  }
  // The f32 copies run_chosen makes for the f32 kernel (x, w, bias, then out's buffer), alive
  // together during the call; none for the GEMV.
  static ScratchList scratch(const LinearArgs& a, DType) {
    if (rows_of(a.x) <= kLinearGemvMaxRows) return {};
    ScratchList bytes;
    for (const Tensor* t : {&a.x, &a.w, &a.bias, &a.out})
      if (t->defined()) bytes.push_back(t->numel() * static_cast<std::int64_t>(sizeof(float)));
    return bytes;
  }
};

}  // namespace

void register_basic() {
  register_all_dtypes<CopyArgs, CopyCpu>({.layout = Layout::Strided});
  register_all_dtypes<FillArgs, FillCpu>();
  register_float<RandomArgs, RandomCpu>();
  // Strided: the kernel walks a and b through their (broadcast) strides.
  register_float<BinaryArgs, BinaryCpu>({.layout = Layout::Strided});
  register_float<UnaryArgs, UnaryCpu>();
  register_float<AffineArgs, AffineCpu>();
  register_float<AxpyArgs, AxpyCpu>();
  register_float<ScaleArgs, ScaleCpu>();
  register_float<ReduceArgs, ReduceCpu>();
  register_float<ArgmaxArgs, ArgmaxCpu>();
  register_float<SumAllArgs, SumAllCpu>();
  register_float<SumSquaresArgs, SumSquaresCpu>();
  register_float<GemmArgs, GemmCpu>();
  register_float<MatmulArgs, MatmulCpu>();
  register_float<LinearArgs, LinearCpu>();
  register_kernel<LinearArgs>(DeviceType::CPU, DType::BF16,
                              {.run = &LinearBf16Cpu::run, .scratch = &LinearBf16Cpu::scratch});
}

}  // namespace cpu_glue
}  // namespace kiln::ops
