// CPU kernels of the basic families (copy, fill, random, elementwise, reductions, matmul):
// the glue from op arguments (tensor/op_args.h) to kernels/cpu/, and their registrations.
// Each glue runs on tensors of its storage type T (f32, f64, or bf16/f16 computed in f32 by the
// kernels; GEMMs: f32/f64 only so far), contiguous unless registered Layout::Strided.
#include <algorithm>

#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/elementwise.h"
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
    using C = kiln::cpu::compute_t<T>;
    kiln::cpu::affine<T>(a.x.numel(), a.x.template data<T>(), static_cast<C>(a.alpha),
                         static_cast<C>(a.beta), a.out.template data<T>());
  }
};

template <class T>
struct AxpyCpu {
  static void run(AxpyArgs& a) {
    kiln::cpu::axpy<T>(a.y.numel(), static_cast<kiln::cpu::compute_t<T>>(a.alpha),
                       a.x.template data<T>(), a.y.template data<T>());
  }
};

template <class T>
struct ScaleCpu {
  static void run(ScaleArgs& a) {
    T* y = a.y.template data<T>();
    kiln::cpu::mul_scalar<T>(a.y.numel(), y, static_cast<kiln::cpu::compute_t<T>>(a.alpha), y);
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

// Tensor by tensor, each through sum_squares (in its own dtype), summed in order in double.
void sum_squares_multi_cpu(SumSquaresMultiArgs& a) {
  double sum = 0;
  for (const Tensor& t : a.tensors) sum += sum_squares(t);
  a.result = sum;
}

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
    // Rows from the output: with K == 0 the input (rows, 0) has no elements to count rows by.
    const std::int64_t N = a.w.size(0), K = a.w.size(1), rows = N > 0 ? a.out.numel() / N : 0;
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

}  // namespace

}  // namespace cpu_glue

namespace cpu_glue {

void register_basic() {
  register_all_dtypes<CopyArgs, CopyCpu>({.layout = Layout::Strided});
  register_all_dtypes<FillArgs, FillCpu>();
  register_float_storage<RandomArgs, RandomCpu>();
  // Strided: the kernel walks a and b through their (broadcast) strides.
  register_float_storage<BinaryArgs, BinaryCpu>({.layout = Layout::Strided});
  register_float_storage<UnaryArgs, UnaryCpu>();
  register_float_storage<AffineArgs, AffineCpu>();
  register_float_storage<AxpyArgs, AxpyCpu>();
  register_float_storage<ScaleArgs, ScaleCpu>();
  register_float_storage<ReduceArgs, ReduceCpu>();
  register_float_storage<ArgmaxArgs, ArgmaxCpu>();
  register_float_storage<SumAllArgs, SumAllCpu>();
  register_float_storage<SumSquaresArgs, SumSquaresCpu>();
  register_kernel<SumSquaresMultiArgs>(DeviceType::CPU, DType::F32,
                                       {.run = &sum_squares_multi_cpu, .mixed_inputs = true});
  register_float<GemmArgs, GemmCpu>();
  register_float<MatmulArgs, MatmulCpu>();
  register_float<LinearArgs, LinearCpu>();
}

}  // namespace cpu_glue
}  // namespace kiln::ops
