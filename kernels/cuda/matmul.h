// GEMM on cuBLASLt, for row-major kiln matrices.
//
//   D = alpha * op(A) @ op(B) + beta * C [+ bias]      (batched: per batch entry)
//
// op(A): (M, K), op(B): (K, N), C = D: (M, N), all row-major with row strides lda/ldb/ldc (the
// stored, untransposed matrix: A is stored (M, K) with lda >= K, or (K, M) with lda >= M when
// trans_a). Batched: matrix i at A + i*stride_a, B + i*stride_b, C + i*stride_c (elements);
// stride_a/stride_b may be 0 (one matrix broadcast over the batch), stride_c may not when
// batch > 1. beta == 0 writes D (`=`, C is not read, NaNs in it do not leak); beta != 0
// accumulates (`+=` scaled), which is how gradients accumulate. Storage f32, bf16 or f16; the
// product is always accumulated in f32 (CUBLAS_COMPUTE_32F, f32 alpha/beta). f32 is exact fp32
// unless set_allow_tf32(true) opts into TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32).
//
// Row-major to column-major: cuBLAS sees a row-major (R, C) matrix with row stride ld as a
// column-major (C, R) matrix with the same ld, i.e. its transpose. So D^T = op(B)^T op(A)^T is
// computed: cuBLAS's A is kiln's B (transa = trans_b), cuBLAS's B is kiln's A (transb = trans_a),
// m = N, n = M, k = K. plan_gemm() below does this mapping; it is plain C++ and tested on the CPU.
// A bonus of the swap: cuBLASLt's bias vector runs along D's column-major rows, which are kiln's
// output columns, so a Linear bias (N) needs no transpose.
//
// Everything above the launchers is host-only integer logic (inline, so tests need no GPU and
// the CPU-only build compiles it too). The launchers live in matmul.cpp (cuBLASLt calls are host
// code); they cache descriptors and heuristic results, keyed by GemmKey, so a training loop that
// repeats its shapes makes no heuristic query after the first step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/common/error.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

enum class GemmType : int { F32 = 0, BF16 = 1, F16 = 2 };
inline int gemm_type_size(GemmType t) { return t == GemmType::F32 ? 4 : 2; }
inline const char* gemm_type_name(GemmType t) {
  return t == GemmType::F32 ? "f32" : t == GemmType::BF16 ? "bf16" : "f16";
}

// Fused epilogues (cuBLASLt applies them to the f32 result before the store). Shapes are
// kiln's row-major ones: D (M, N).
//   None         D = alpha*op(A)op(B) + beta*C
//   Bias         D = ... + bias                         bias (N), D's dtype, contiguous
// (cuBLASLt's GELU epilogues are left out until a fused MLP calls them, with a GPU test.)
enum class GemmEpilogue : int { None = 0, Bias };
inline bool epilogue_has_bias(GemmEpilogue e) { return e == GemmEpilogue::Bias; }

// A GEMM in kiln's row-major terms (see the top comment).
struct GemmArgs {
  GemmType type = GemmType::F32;
  bool trans_a = false, trans_b = false;
  std::int64_t M = 0, N = 0, K = 0, batch = 1;
  std::int64_t lda = 0, ldb = 0, ldc = 0;                 // row strides, elements
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // batch strides, elements
};

// What cuBLASLt gets (column-major). Each layout describes the STORED matrix: rows x cols with
// leading dimension ld (>= rows); transa/transb say whether the op transposes it.
struct GemmPlan {
  bool swap = true;  // cuBLAS A is kiln's B and vice versa (always, for row-major kiln tensors)
  bool transa = false, transb = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t a_rows = 0, a_cols = 0, lda = 0;  // cuBLAS A (= kiln B)
  std::int64_t b_rows = 0, b_cols = 0, ldb = 0;  // cuBLAS B (= kiln A)
  std::int64_t c_rows = 0, c_cols = 0, ldc = 0;  // C and D: (N, M) column-major
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  std::int64_t batch = 1;
};

// Maps row-major args onto cuBLASLt, validating them (sizes >= 1 and int32-sized as cuBLASLt
// needs, ld >= the stored row length, non-negative strides, stride_c != 0 when batched).
inline GemmPlan plan_gemm(const GemmArgs& g) {
  KILN_CHECK(g.M >= 1 && g.N >= 1 && g.K >= 1 && g.batch >= 1,
             "[gemm] cuBLASLt needs M, N, K, batch >= 1 (got {}, {}, {}, {}); callers handle "
             "empty products",
             g.M, g.N, g.K, g.batch);
  constexpr std::int64_t kMax = 2147483647;
  KILN_CHECK(g.M <= kMax && g.N <= kMax && g.K <= kMax && g.batch <= kMax,
             "[gemm] sizes M={} N={} K={} batch={} exceed cuBLASLt's int32 range", g.M, g.N, g.K,
             g.batch);
  const std::int64_t a_row_len = g.trans_a ? g.M : g.K;  // stored A: (M, K) or (K, M)
  const std::int64_t b_row_len = g.trans_b ? g.K : g.N;  // stored B: (K, N) or (N, K)
  KILN_CHECK(g.lda >= a_row_len && g.ldb >= b_row_len && g.ldc >= g.N,
             "[gemm] leading dimensions lda={} ldb={} ldc={} are below the row lengths {}, {}, {}",
             g.lda, g.ldb, g.ldc, a_row_len, b_row_len, g.N);
  KILN_CHECK(g.stride_a >= 0 && g.stride_b >= 0 && g.stride_c >= 0,
             "[gemm] negative batch strides {}, {}, {}", g.stride_a, g.stride_b, g.stride_c);
  KILN_CHECK(g.batch == 1 || g.stride_c > 0, "[gemm] batched output needs a nonzero stride");
  GemmPlan p;
  p.swap = true;
  p.m = g.N;
  p.n = g.M;
  p.k = g.K;
  p.transa = g.trans_b;
  p.transb = g.trans_a;
  // Stored row-major (R, C) is column-major (C, R): rows = the row length.
  p.a_rows = b_row_len;
  p.a_cols = g.trans_b ? g.N : g.K;
  p.lda = g.ldb;
  p.b_rows = a_row_len;
  p.b_cols = g.trans_a ? g.K : g.M;
  p.ldb = g.lda;
  p.c_rows = g.N;
  p.c_cols = g.M;
  p.ldc = g.ldc;
  p.batch = g.batch;
  // One matrix: strides are irrelevant; zero them so equal problems share a cache key.
  p.stride_a = g.batch > 1 ? g.stride_b : 0;
  p.stride_b = g.batch > 1 ? g.stride_a : 0;
  p.stride_c = g.batch > 1 ? g.stride_c : 0;
  return p;
}

// How a 2-d view (rows, cols) with element strides (row_stride, col_stride) can be handed to a
// BLAS without a copy. ok == false: it needs a contiguous copy. Otherwise the view is the stored
// row-major matrix (transposed == false, row stride ld) or the transpose of a stored row-major
// (cols, rows) matrix with row stride ld (transposed == true: flip the op's trans flag). Strides
// of size-1 dims do not matter. Broadcast (stride 0) and overlapping views need a copy.
struct BlasView {
  bool ok = false;
  bool transposed = false;
  std::int64_t ld = 0;
};
inline BlasView blas_view(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                          std::int64_t col_stride) {
  if (rows < 0 || cols < 0 || row_stride < 0 || col_stride < 0) return {};
  const std::int64_t r1 = std::max<std::int64_t>(rows, 1), c1 = std::max<std::int64_t>(cols, 1);
  // Row-major: unit column stride, rows at least a row apart.
  if ((cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= c1))
    return {true, false, rows <= 1 ? c1 : row_stride};
  // Column-major: unit row stride, columns at least a column apart.
  if ((rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= r1))
    return {true, true, cols <= 1 ? r1 : col_stride};
  return {};
}

// Leading dims of a view (..., rows, cols) collapse into one row dim (stride row_stride) when
// each stride equals the next one times its size (size-1 dims ignored). Returns -1 when they do
// not (the caller copies). For Linear's x (..., in) -> (rows, in).
inline std::int64_t collapsed_row_stride(const std::int64_t* shape, const std::int64_t* strides,
                                         int ndim) {
  if (ndim < 2) return -1;
  std::int64_t stride = strides[ndim - 2], extent = shape[ndim - 2];
  bool have = shape[ndim - 2] != 1;
  for (int d = ndim - 3; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (!have) {  // everything after d had size 1
      stride = strides[d];
      extent = shape[d];
      have = true;
      continue;
    }
    if (strides[d] != stride * extent) return -1;
    extent *= shape[d];
  }
  return have ? stride : 0;  // 0: a single row, any stride works
}

// Largest power of two <= 16 dividing the address and, when batched, every batch entry's address
// (cuBLASLt's best kernels want 16-byte aligned operands; it must be told the real alignment, or
// it assumes 256). A null pointer (no bias) is 16.
inline int gemm_alignment(std::uintptr_t addr, std::int64_t batch_stride, std::int64_t batch,
                          int elem_size) {
  std::uint64_t bits = addr | 16u;
  if (batch > 1) bits |= static_cast<std::uint64_t>(batch_stride) * elem_size;  // 0: broadcast
  return static_cast<int>(bits & (~bits + 1));                                  // lowest set bit
}

// Validation of the epilogue's extra operand (bias length is N by construction).
inline void check_gemm_epilogue(GemmEpilogue e, const void* bias) {
  if (epilogue_has_bias(e))
    KILN_CHECK(bias != nullptr, "[gemm] epilogue {} needs a bias pointer", static_cast<int>(e));
}

// Cache key: everything a cached descriptor or a heuristic answer depends on. Pointers enter
// only through their alignment (heuristics choose by it); the bias pointer itself is set on the
// cached descriptor per call.
struct GemmKey {
  int device = 0;
  int type = 0;  // GemmType
  int tf32 = 0;
  int epilogue = 0;  // GemmEpilogue
  int transa = 0, transb = 0;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int align_a = 16, align_b = 16, align_c = 16, align_bias = 16;
  bool operator==(const GemmKey&) const = default;
};
struct GemmKeyHash {
  std::size_t operator()(const GemmKey& k) const {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    auto mix = [&](std::int64_t v) {
      h ^= static_cast<std::uint64_t>(v);
      h *= 1099511628211ull;
    };
    for (std::int64_t v : {std::int64_t(k.device),
                           std::int64_t(k.type),
                           std::int64_t(k.tf32),
                           std::int64_t(k.epilogue),
                           std::int64_t(k.transa),
                           std::int64_t(k.transb),
                           k.m,
                           k.n,
                           k.k,
                           k.batch,
                           k.lda,
                           k.ldb,
                           k.ldc,
                           k.stride_a,
                           k.stride_b,
                           k.stride_c,
                           std::int64_t(k.align_a),
                           std::int64_t(k.align_b),
                           std::int64_t(k.align_c),
                           std::int64_t(k.align_bias)})
      mix(v);
    return static_cast<std::size_t>(h);
  }
};

// The epilogue and its extra operand (null without a bias).
struct GemmEpilogueArgs {
  GemmEpilogue epilogue = GemmEpilogue::None;
  const void* bias = nullptr;  // (N) in the output dtype
};

inline GemmKey make_gemm_key(int device, GemmType type, bool tf32, const GemmPlan& p,
                             const GemmEpilogueArgs& ep, int align_a, int align_b, int align_c,
                             int align_bias) {
  GemmKey k;
  k.device = device;
  k.type = static_cast<int>(type);
  k.tf32 = type == GemmType::F32 && tf32;  // TF32 only means something for f32
  k.epilogue = static_cast<int>(ep.epilogue);
  k.transa = p.transa;
  k.transb = p.transb;
  k.m = p.m;
  k.n = p.n;
  k.k = p.k;
  k.batch = p.batch;
  k.lda = p.lda;
  k.ldb = p.ldb;
  k.ldc = p.ldc;
  k.stride_a = p.stride_a;
  k.stride_b = p.stride_b;
  k.stride_c = p.stride_c;
  k.align_a = align_a;
  k.align_b = align_b;
  k.align_c = align_c;
  k.align_bias = epilogue_has_bias(ep.epilogue) ? align_bias : 16;
  return k;
}

// ---- launchers (matmul.cpp; CUDA builds only) ---------------------------------------------------
#if defined(KILN_CUDA)

// TF32 for f32 GEMMs: off by default, so the f32 path is the exact "checking" mode. Process-wide.
void set_allow_tf32(bool allow);
bool allow_tf32();

// D = alpha * op(A) op(B) + beta * D [+ bias] on `stream`, with the args above (C is D: cuBLASLt
// reads and writes the same buffer when beta != 0). Uses cublaslt_handle() and the shared
// cublaslt_workspace(), which assumes every matmul is ordered on one stream (kiln launches all
// work on the legacy default stream). Fails with the problem's description when cuBLASLt has no
// algorithm for it.
void gemm_lt(const GemmArgs& args, float alpha, const void* a, const void* b, float beta, void* d,
             const GemmEpilogueArgs& ep = {}, StreamHandle stream = nullptr);
// The same, but returns false (and launches nothing) when cuBLASLt has no algorithm, so a caller
// can fall back (e.g. to an unfused bias). The answer is cached too.
bool try_gemm_lt(const GemmArgs& args, float alpha, const void* a, const void* b, float beta,
                 void* d, const GemmEpilogueArgs& ep = {}, StreamHandle stream = nullptr);

struct GemmCacheStats {
  std::int64_t entries = 0;            // cached problems (including "no algorithm" answers)
  std::int64_t heuristic_queries = 0;  // cublasLtMatmulAlgoGetHeuristic calls so far
  std::int64_t hits = 0;               // launches served from the cache
};
GemmCacheStats gemm_cache_stats();
// Drops every cached descriptor (tests; the cache also clears itself past kGemmCacheMax).
void gemm_cache_clear();
inline constexpr std::size_t kGemmCacheMax = 4096;

#endif  // KILN_CUDA

}  // namespace kiln::cuda
