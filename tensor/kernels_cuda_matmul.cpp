// CUDA glue, matmul family: gemm, matmul and linear on cuBLASLt (kernels/cuda/matmul.h), and
// linear's single bf16 row on kiln's GEMV (kernels/cuda/gemv.h), as entries registered beside
// their bodies (tensor/kernels_cuda_glue.h). The front end (tensor/ops_basic.cpp) has checked
// shapes and dtypes and allocated the outputs; one body serves every dtype (cuBLASLt takes the
// type as a value).
//
// Strided inputs go to cuBLASLt without a copy whenever a BLAS can read them: a row-major view
// with any row stride, or a transposed view (unit row stride), which flips the op's trans flag
// instead (blas_view). Only views with no unit stride, broadcast (stride 0) rows, or Linear
// inputs whose leading dims do not collapse are copied, and the copy is charged to Temporaries.
// (B,M,K)@(K,N) with a row-major A whose batches are back to back runs as one (B*M, K)@(K, N)
// GEMM; otherwise a 2-d B is broadcast over the batch with batch stride 0 (and copied per batch
// entry only if cuBLASLt has no algorithm for a zero stride).
#include <algorithm>
#include <utility>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/matmul.h"
#include "tensor/kernels_cuda_glue.h"
#include "tensor/memory.h"
#include "tensor/op_args.h"

namespace kiln::ops {
namespace cuda_glue {
namespace {

template <class T>
struct GemmCuda {
  static void run(GemmArgs& a);
};
template <class T>
struct MatmulCuda {
  static void run(MatmulArgs& a);
};
template <class T>
struct LinearCuda {
  static void run(LinearArgs& a);
};

#if defined(KILN_CUDA)

using cuda::GemmEpilogue;
using cuda::GemmEpilogueArgs;
using cuda::GemmType;
using LtArgs = cuda::GemmArgs;  // the launcher's arguments (GemmArgs is the op's)

GemmType gemm_type(DType t, const char* op) {
  switch (t) {
    case DType::F32:
      return GemmType::F32;
    case DType::BF16:
      return GemmType::BF16;
    case DType::F16:
      return GemmType::F16;
    default:
      fail("[{}] {} is not supported on CUDA", op, dtype_name(t));
  }
}

void check_device(const Tensor& out, const char* op) {
  const int current = cuda::current_device();
  KILN_CHECK(out.device().index == current,
             "[{}] tensors are on {} but the current CUDA device is {}", op, out.device().str(),
             current);
}

// A matrix operand (the last two dims of a 2-d or 3-d tensor) as cuBLASLt reads it: the stored
// row-major matrix at ptr with row stride ld, op trans, and the batch stride of a 3-d tensor.
// `hold` keeps a contiguous copy alive when the view could not be read in place.
struct Operand {
  Tensor hold;
  const void* ptr = nullptr;
  std::int64_t ld = 0;
  bool trans = false;
  std::int64_t batch_stride = 0;
};

Operand contiguous_operand(const Tensor& t, bool trans) {
  Operand o;
  {
    MemoryScope scratch(MemCategory::Temporaries);
    o.hold = t.contiguous();
  }
  o.ptr = o.hold.raw_data();
  o.ld = std::max<std::int64_t>(t.size(-1), 1);
  o.trans = trans;
  o.batch_stride = t.dim() == 3 ? t.size(-2) * t.size(-1) : 0;
  return o;
}

Operand operand(const Tensor& t, bool trans) {
  const int d = t.dim();
  const cuda::BlasView v =
      cuda::blas_view(t.size(d - 2), t.size(d - 1), t.stride(d - 2), t.stride(d - 1));
  const std::int64_t batch_stride = d == 3 ? t.stride(0) : 0;
  if (!v.ok || batch_stride < 0) return contiguous_operand(t, trans);
  Operand o;
  o.hold = t;
  o.ptr = t.raw_data();
  o.ld = v.ld;
  o.trans = trans != v.transposed;
  o.batch_stride = batch_stride;
  return o;
}

// A 2-d matrix, or a 3-d tensor whose batch stride is 0, as a contiguous (batch, R, C) copy.
Operand expanded_operand(const Tensor& t, std::int64_t batch, bool trans) {
  const Tensor t3 = t.dim() == 3 ? t : t.unsqueeze(0);
  return contiguous_operand(t3.expand({batch, t3.size(1), t3.size(2)}), trans);
}

// Linear's x (..., K) as a (rows, K) operand.
Operand rows_operand(const Tensor& x, std::int64_t rows, std::int64_t K) {
  std::int64_t row_stride = 0;  // x 1-d: a single row
  if (x.dim() >= 2)
    row_stride = cuda::collapsed_row_stride(x.shape().data(), x.strides().data(), x.dim());
  if (row_stride < 0) return contiguous_operand(x, false);
  const cuda::BlasView v = cuda::blas_view(rows, K, row_stride, x.stride(-1));
  if (!v.ok) return contiguous_operand(x, false);
  Operand o;
  o.hold = x;
  o.ptr = x.raw_data();
  o.ld = v.ld;
  o.trans = v.transposed;
  return o;
}

// Element range [first, last] a view touches in its storage.
std::pair<std::int64_t, std::int64_t> extent(const Tensor& t) {
  std::int64_t last = t.offset();
  for (int d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {t.offset(), last};
}
bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.same_storage(b) || a.numel() == 0 || b.numel() == 0) return false;
  const auto [a0, a1] = extent(a);
  const auto [b0, b1] = extent(b);
  const std::int64_t ea = static_cast<std::int64_t>(dtype_size(a.dtype()));
  const std::int64_t eb = static_cast<std::int64_t>(dtype_size(b.dtype()));
  return a0 * ea < (b1 + 1) * eb && b0 * eb < (a1 + 1) * ea;
}

void zero(Tensor& t) { cuda::memset_async(t.raw_data(), 0, t.nbytes()); }

// The launcher's arguments for one (M, K) x (K, N) product into a dense (M, N) output.
LtArgs gemm_args(GemmType type, const Operand& a, const Operand& b, std::int64_t M, std::int64_t N,
                 std::int64_t K) {
  LtArgs g;
  g.type = type;
  g.trans_a = a.trans;
  g.trans_b = b.trans;
  g.M = M;
  g.N = N;
  g.K = K;
  g.lda = a.ld;
  g.ldb = b.ld;
  g.ldc = N;
  return g;
}

// c = alpha * op(a) op(b) + beta * c; 2-d, c contiguous.
void gemm(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
          double beta) {
  const GemmType type = gemm_type(c.dtype(), "gemm");
  check_device(c, "gemm");
  KILN_CHECK(!overlaps(c, a) && !overlaps(c, b), "[gemm] the output overlaps an input");
  const std::int64_t M = c.size(0), N = c.size(1), K = trans_a ? a.size(0) : a.size(1);
  if (K == 0) {  // empty product: c = beta * c (BLAS: beta == 0 does not read c)
    if (beta == 0.0)
      zero(c);
    else if (beta != 1.0)
      scale_(c, beta);
    return;
  }
  const Operand oa = operand(a, trans_a), ob = operand(b, trans_b);
  const LtArgs g = gemm_args(type, oa, ob, M, N, K);
  cuda::gemm_lt(g, static_cast<float>(alpha), oa.ptr, ob.ptr, static_cast<float>(beta),
                c.raw_data());
}

// out = op(a) op(b): (M,K)@(K,N), (B,M,K)@(B,K,N) or (B,M,K)@(K,N); out contiguous.
void matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Tensor& out) {
  const GemmType type = gemm_type(out.dtype(), "matmul");
  check_device(out, "matmul");
  const std::int64_t batch = a.dim() == 3 ? a.size(0) : 1;
  const std::int64_t M = out.size(-2), N = out.size(-1), K = trans_a ? a.size(-2) : a.size(-1);
  if (K == 0) return zero(out);
  const Operand oa = operand(a, trans_a), ob = operand(b, trans_b);
  LtArgs g = gemm_args(type, oa, ob, M, N, K);
  if (batch > 1 && b.dim() == 2 && !oa.trans &&
      (oa.batch_stride == M * oa.ld || (M == 1 && oa.batch_stride >= K))) {
    // A's batches are consecutive rows of one (B*M, K) matrix (or single rows B apart): one GEMM
    // against the shared B, which cuBLASLt tiles better than B small batched ones.
    g.M = batch * M;
    if (M == 1) g.lda = oa.batch_stride;
  } else if (batch > 1) {
    g.batch = batch;
    g.stride_a = oa.batch_stride;
    g.stride_b = b.dim() == 3 ? ob.batch_stride : 0;  // 2-d b: the same matrix for every entry
    g.stride_c = M * N;
  }
  if (g.batch > 1 && (g.stride_a == 0 || g.stride_b == 0)) {
    if (cuda::try_gemm_lt(g, 1.0f, oa.ptr, ob.ptr, 0.0f, out.raw_data())) return;
    // No algorithm takes a batch stride of 0 here: give each batch entry its own copy.
    const Operand ea = g.stride_a == 0 ? expanded_operand(a, batch, trans_a) : oa;
    const Operand eb = g.stride_b == 0 ? expanded_operand(b, batch, trans_b) : ob;
    g.trans_a = ea.trans;
    g.trans_b = eb.trans;
    g.lda = ea.ld;
    g.ldb = eb.ld;
    g.stride_a = ea.batch_stride;
    g.stride_b = eb.batch_stride;
    cuda::gemm_lt(g, 1.0f, ea.ptr, eb.ptr, 0.0f, out.raw_data());
    return;
  }
  cuda::gemm_lt(g, 1.0f, oa.ptr, ob.ptr, 0.0f, out.raw_data());
}

// out = x w^T + bias: x (..., K), w (N, K), bias (N) or undefined, out (..., N) contiguous.
void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  const GemmType type = gemm_type(out.dtype(), "linear");
  check_device(out, "linear");
  const std::int64_t N = w.size(0), K = w.size(1), rows = out.numel() / N;
  Tensor b;  // bias in out's dtype, contiguous
  if (bias.defined()) {
    b = bias;
    if (b.dtype() != out.dtype() || !b.is_contiguous()) {
      MemoryScope scratch(MemCategory::Temporaries);
      b = bias.to(out.dtype()).contiguous();
    }
  }
  if (K == 0) {  // empty product: out = bias (or 0)
    if (b.defined())
      out.copy_(b.expand(out.shape()));
    else
      zero(out);
    return;
  }
  // Up to kGemvMaxRows bf16 rows (decode, small serving batches) without a bias: kiln's
  // bandwidth-bound GEMV (gemv.h), each row's result the same as alone; rows of a contiguous x.
  if (rows <= cuda::kGemvMaxRows && type == GemmType::BF16 && !b.defined() &&
      cuda::gemv_enabled() && w.is_contiguous() && x.stride(-1) == 1 &&
      (rows == 1 || x.is_contiguous()) &&
      cuda::gemv_supported(N, K, w.raw_data(), x.raw_data(), out.raw_data())) {
    cuda::gemv_bf16(static_cast<int>(rows), N, K, w.data<bf16>(), x.data<bf16>(), K,
                    out.data<bf16>(), N, nullptr);
    return;
  }
  const Operand ox = rows_operand(x, rows, K), ow = operand(w, true);
  const LtArgs g = gemm_args(type, ox, ow, rows, N, K);
  if (b.defined()) {
    GemmEpilogueArgs ep;
    ep.epilogue = GemmEpilogue::Bias;
    ep.bias = b.raw_data();
    if (cuda::try_gemm_lt(g, 1.0f, ox.ptr, ow.ptr, 0.0f, out.raw_data(), ep)) return;
    // No fused-bias algorithm for this problem (alignment, sizes): broadcast, then accumulate.
    out.copy_(b.expand(out.shape()));
    cuda::gemm_lt(g, 1.0f, ox.ptr, ow.ptr, 1.0f, out.raw_data());
    return;
  }
  cuda::gemm_lt(g, 1.0f, ox.ptr, ow.ptr, 0.0f, out.raw_data());
}

template <class T>
void GemmCuda<T>::run(GemmArgs& a) {
  gemm(a.c, a.a, a.b, a.trans_a, a.trans_b, a.alpha, a.beta);
}
template <class T>
void MatmulCuda<T>::run(MatmulArgs& a) {
  matmul(a.a, a.b, a.trans_a, a.trans_b, a.out);
}
template <class T>
void LinearCuda<T>::run(LinearArgs& a) {
  linear(a.x, a.w, a.bias, a.out);
}

#endif  // KILN_CUDA

}  // namespace

// Strided operands go to cuBLASLt in place where a BLAS can read them (see the top).
void register_matmul() {
  register_cuda<GemmArgs, GemmCuda, float, bf16, f16>({.layout = Layout::Strided});
  register_cuda<MatmulArgs, MatmulCuda, float, bf16, f16>({.layout = Layout::Strided});
  register_cuda<LinearArgs, LinearCuda, float, bf16, f16>({.layout = Layout::Strided});
}

}  // namespace cuda_glue
}  // namespace kiln::ops
