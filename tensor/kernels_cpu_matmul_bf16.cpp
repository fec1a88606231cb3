// Native bf16 and f16 CPU kernels of the matmul family (gemm, matmul, linear) on
// kernels/cpu/matmul_dnnl.h (bf16: oneDNN on AMX, widened blocks through sgemm below; f16:
// widened blocks, by F16C) and kernels/cpu/gemv_bf16.h (decode): 16-bit tensors are multiplied
// as they are, with f32 accumulation, instead of through f32 copies of every operand.
//
// Strided operands are read in place whenever a BLAS can read them: a row-major view with any row
// stride, or a transposed view (unit row stride), which flips the op's trans flag; a 3-d operand
// adds its batch stride (0: one matrix broadcast over the batch). The registrations' `accepts`
// says which views those are, so the dispatcher copies only the others (charged to Temporaries,
// on meta too). The kernel's one allocation is the GEMM scratch (oneDNN's user-managed
// scratchpad, or the widening blocks), declared through `.scratch` with the same plan, so the
// dry run charges the same bytes.
#include <algorithm>

#include "kernels/cpu/gemv_bf16.h"
#include "kernels/cpu/matmul_dnnl.h"
#include "tensor/kernels_cpu.h"
#include "tensor/op_args.h"

namespace kiln::ops {
namespace cpu_glue {
namespace {

using kiln::cpu::Bf16Gemm;
using kiln::cpu::GemmElt;

// A (rows, cols) matrix with strides (sr, sc) as a BLAS reads it: the stored row-major matrix's
// row stride ld, and whether it is stored transposed.
struct BlasView {
  bool ok = false;
  std::int64_t ld = 0;
  bool transposed = false;
};
BlasView blas_view(std::int64_t rows, std::int64_t cols, std::int64_t sr, std::int64_t sc) {
  // A dim of size 1 has no meaningful stride: pick the one that makes the view dense.
  const std::int64_t r = std::max<std::int64_t>(rows, 1), c = std::max<std::int64_t>(cols, 1);
  if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= c)) return {true, rows <= 1 ? c : sr, false};
  if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= r)) return {true, cols <= 1 ? r : sc, true};
  return {};
}

// The last two dims of a 2-d or 3-d tensor as an operand, and its batch stride (0 for 2-d, or
// for a batch of one, or a broadcast batch). A batch stride that lets matrices overlap or
// interleave (smaller than one stored matrix) is not read in place.
struct Operand {
  bool ok = false;
  std::int64_t ld = 0, batch_stride = 0;
  bool transposed = false;
};
Operand operand(const Tensor& t) {
  const int d = t.dim();
  const BlasView v = blas_view(t.size(d - 2), t.size(d - 1), t.stride(d - 2), t.stride(d - 1));
  Operand o{v.ok, v.ld, 0, v.transposed};
  if (d == 3 && t.size(0) > 1 && t.stride(0) != 0) {
    const std::int64_t stored_rows = v.transposed ? t.size(2) : t.size(1);
    if (t.stride(0) < stored_rows * v.ld) o.ok = false;
    o.batch_stride = t.stride(0);
  }
  return o;
}

// Linear's x (..., K) as (rows, K): its leading dims must collapse into one row stride.
Operand rows_operand(const Tensor& x) {
  const std::int64_t K = x.size(-1), rows = rows_of(x);
  if (x.dim() <= 1) return {true, std::max<std::int64_t>(K, 1), 0, false};
  std::int64_t row_stride = -1;  // of the innermost leading dim of size > 1
  for (int d = x.dim() - 2; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (row_stride < 0) {
      row_stride = x.stride(d);
    } else {
      // dim d must step over all of dims d+1..n-2 as one block of rows
      std::int64_t inner_rows = 1;
      for (int e = d + 1; e < x.dim() - 1; ++e) inner_rows *= x.size(e);
      if (x.stride(d) != inner_rows * row_stride) return {};
    }
  }
  if (row_stride < 0) row_stride = std::max<std::int64_t>(K, 1);  // a single row
  const BlasView v = blas_view(rows, K, row_stride, x.stride(-1));
  return {v.ok, v.ld, 0, v.transposed};
}

bool gemm_accepts(int slot, const Tensor& t) { return slot == 0 || operand(t).ok; }
bool matmul_accepts(int slot, const Tensor& t) { return slot == 2 || operand(t).ok; }
bool linear_accepts(int slot, const Tensor& t) {
  if (slot == 0) return rows_operand(t).ok;
  if (slot == 1) return operand(t).ok;
  return t.is_contiguous();  // bias
}

// ---- plans: the one GEMM each op runs (shared by the kernel and its scratch declaration) ------

Bf16Gemm gemm_plan(const GemmArgs& a) {
  const Operand oa = operand(a.a), ob = operand(a.b);
  Bf16Gemm g;
  g.M = a.c.size(0);
  g.N = a.c.size(1);
  g.K = a.trans_a ? a.a.size(0) : a.a.size(1);
  g.trans_a = a.trans_a != oa.transposed;
  g.trans_b = a.trans_b != ob.transposed;
  g.lda = oa.ld;
  g.ldb = ob.ld;
  g.ldc = std::max<std::int64_t>(g.N, 1);
  g.alpha = static_cast<float>(a.alpha);
  g.beta = static_cast<float>(a.beta);
  return g;
}

Bf16Gemm matmul_plan(const MatmulArgs& a) {
  const Operand oa = operand(a.a), ob = operand(a.b);
  Bf16Gemm g;
  g.M = a.out.size(-2);
  g.N = a.out.size(-1);
  g.K = a.trans_a ? a.a.size(-2) : a.a.size(-1);
  g.trans_a = a.trans_a != oa.transposed;
  g.trans_b = a.trans_b != ob.transposed;
  g.lda = oa.ld;
  g.ldb = ob.ld;
  g.ldc = std::max<std::int64_t>(g.N, 1);
  g.batch = a.out.dim() == 3 ? a.out.size(0) : 1;
  g.stride_a = oa.batch_stride;
  g.stride_b = ob.batch_stride;
  g.stride_c = g.batch > 1 ? g.M * g.N : 0;
  return g;
}

// Linear's rows, counted by the output: with K == 0 the input (rows, 0) has no elements to count
// rows by, and the output (the bias, or zeros) must still be written.
std::int64_t linear_rows(const LinearArgs& a) {
  const std::int64_t N = a.w.size(0);
  return N > 0 ? a.out.numel() / N : rows_of(a.x);
}

Bf16Gemm linear_plan(const LinearArgs& a) {
  const Operand ox = rows_operand(a.x), ow = operand(a.w);
  Bf16Gemm g;
  g.M = linear_rows(a);
  g.N = a.w.size(0);
  g.K = a.w.size(1);
  g.trans_a = ox.transposed;
  g.trans_b = !ow.transposed;  // out = x w^T
  g.lda = ox.ld;
  g.ldb = ow.ld;
  g.ldc = std::max<std::int64_t>(g.N, 1);
  g.has_bias = a.bias.defined();
  return g;
}

// E: the storage type, bf16 (oneDNN, or widening below AMX) or f16 (always widening, by F16C).
template <class E>
constexpr GemmElt kElt = std::is_same_v<E, f16> ? GemmElt::F16 : GemmElt::BF16;

// The plan with C and the bias in the op's storage type.
template <class E>
Bf16Gemm typed(Bf16Gemm g) {
  g.c_type = kElt<E>;
  g.bias_type = kElt<E>;
  return g;
}

template <class E>
std::int64_t scratch_bytes(const Bf16Gemm& g) {
  if constexpr (std::is_same_v<E, f16>)
    return kiln::cpu::f16_gemm_scratch_bytes(g);
  else
    return kiln::cpu::bf16_gemm_scratch_bytes(g);
}

template <class A, Bf16Gemm (*Plan)(const A&), class E>
ScratchList plan_scratch(const A& a, DType) {
  return {scratch_bytes<E>(typed<E>(Plan(a)))};
}

// The GEMM's scratch, tracked as Temporaries (as charge_scratch does on meta).
Tensor scratch_buffer(std::int64_t bytes, Device device) {
  if (bytes <= 0) return Tensor();
  MemoryScope scratch(MemCategory::Temporaries);
  return Tensor::empty({bytes}, DType::Bool, device);
}

template <class E>
void run_plan(const Bf16Gemm& plan, const Tensor& a, const Tensor& b, Tensor& c,
              const Tensor& bias) {
  const Bf16Gemm g = typed<E>(plan);
  const std::int64_t bytes = scratch_bytes<E>(g);
  Tensor scratch = scratch_buffer(bytes, c.device());
  const void* bias_data = bias.defined() ? bias.raw_data() : nullptr;
  void* scratch_data = scratch.defined() ? scratch.raw_data() : nullptr;
  if constexpr (std::is_same_v<E, f16>)
    kiln::cpu::f16_gemm(g, a.data<f16>(), b.data<f16>(), c.raw_data(), bias_data, scratch_data,
                        bytes);
  else
    kiln::cpu::bf16_gemm(g, a.data<bf16>(), b.data<bf16>(), c.raw_data(), bias_data, scratch_data,
                         bytes);
}

template <class E>
void gemm_half(GemmArgs& a) {
  run_plan<E>(gemm_plan(a), a.a, a.b, a.c, Tensor());
}

template <class E>
void matmul_half(MatmulArgs& a) {
  run_plan<E>(matmul_plan(a), a.a, a.b, a.out, Tensor());
}

// Up to this many rows of x (decode, small batches), bf16 Linear is the bandwidth-bound GEMV
// (kernels/cpu/gemv_bf16.h), which reads the weight once, in place, and allocates nothing. At
// 16 rows the GEMV is already compute-bound (2.5 GB/s of weights, one loaded thread) while
// oneDNN's AMX tiles take 16 rows at a time, so the GEMM takes over above a few rows.
constexpr std::int64_t kLinearGemvMaxRows = 4;

// Whether the GEMV reads this Linear as it is: few rows, x and w row-major (any row stride).
bool linear_runs_gemv(const LinearArgs& a) {
  return linear_rows(a) <= kLinearGemvMaxRows && !rows_operand(a.x).transposed &&
         !operand(a.w).transposed;
}

// out (rows, N) = x (rows, K) w^T + bias: the GEMV for decode, else one GEMM with the bias fused.
template <class E>
void linear_half(LinearArgs& a) {
  if (!linear_runs_gemv(a)) return run_plan<E>(linear_plan(a), a.x, a.w, a.out, a.bias);
  const Operand ox = rows_operand(a.x), ow = operand(a.w);
  const std::int64_t N = a.w.size(0), K = a.w.size(1);
  const E* bias = a.bias.defined() ? a.bias.data<E>() : nullptr;
  if constexpr (std::is_same_v<E, f16>)
    kiln::cpu::gemv_f16<f16, f16>(linear_rows(a), N, K, a.x.data<f16>(), ox.ld, a.w.data<f16>(),
                                  ow.ld, bias, a.out.data<f16>(), N);
  else
    kiln::cpu::gemv_bf16<bf16, bf16>(linear_rows(a), N, K, a.x.data<bf16>(), ox.ld,
                                     a.w.data<bf16>(), ow.ld, bias, a.out.data<bf16>(), N);
}

template <class E>
ScratchList linear_scratch(const LinearArgs& a, DType d) {
  if (linear_runs_gemv(a)) return {};
  return plan_scratch<LinearArgs, linear_plan, E>(a, d);
}

template <class E>
void register_half(DType dtype) {
  register_kernel<GemmArgs>(DeviceType::CPU, dtype,
                            {.run = &gemm_half<E>,
                             .accepts = &gemm_accepts,
                             .scratch = &plan_scratch<GemmArgs, gemm_plan, E>});
  register_kernel<MatmulArgs>(DeviceType::CPU, dtype,
                              {.run = &matmul_half<E>,
                               .accepts = &matmul_accepts,
                               .scratch = &plan_scratch<MatmulArgs, matmul_plan, E>});
  register_kernel<LinearArgs>(
      DeviceType::CPU, dtype,
      {.run = &linear_half<E>, .accepts = &linear_accepts, .scratch = &linear_scratch<E>});
}

}  // namespace

std::int64_t linear_bf16_dense_scratch_bytes(std::int64_t rows, std::int64_t n, std::int64_t k,
                                             bool has_bias) {
  if (rows <= kLinearGemvMaxRows) return 0;  // linear_runs_gemv for dense operands
  // linear_plan of row-major operands: out = x w^T.
  Bf16Gemm g;
  g.M = rows;
  g.N = n;
  g.K = k;
  g.trans_b = true;
  g.lda = std::max<std::int64_t>(k, 1);
  g.ldb = std::max<std::int64_t>(k, 1);
  g.ldc = std::max<std::int64_t>(n, 1);
  g.has_bias = has_bias;
  return kiln::cpu::bf16_gemm_scratch_bytes(g);
}

void register_matmul_bf16() {
  register_half<bf16>(DType::BF16);
  register_half<f16>(DType::F16);
}

}  // namespace cpu_glue
}  // namespace kiln::ops
