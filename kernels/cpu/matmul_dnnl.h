// bf16 GEMM on the CPU: oneDNN matmul (AMX / AVX512-BF16), or widened blocks through OpenBLAS
// sgemm where the CPU (or KILN_CPU_ISA) has no bf16 arithmetic.
//
//   C = alpha * op(A) @ op(B) + beta * C + bias      (= when beta == 0: C is not read, NaNs in it
//                                                     do not leak; else accumulates)
// A, B bf16; products accumulated in f32; C bf16 or f32 (rounded once, at the end); bias (N) bf16
// or f32, added to every row, only with alpha == 1. op(X) is X or X^T. op(A): (M, K), op(B):
// (K, N), C: (M, N). lda/ldb/ldc are the row strides of the stored (untransposed) matrices: A is
// stored (M, K) with lda >= K, or (K, M) with lda >= M when trans_a. Batches: matrix b of A, B, C
// at A + b*stride_a, B + b*stride_b, C + b*stride_c (elements); stride_a / stride_b 0 uses one
// matrix for every batch entry.
//
// Paths (bf16_gemm_path, by cpu_isa()):
//   Onednn      cpu_isa() == Amx: a cached oneDNN matmul primitive; oneDNN picks its kernel up to
//               the level it was capped at (isa.cpp caps it once at KILN_CPU_ISA or the detected
//               level): brgemm on AMX tiles ("brg:avx512_core_amx_bf16").
//   WidenSgemm  below Amx: op(A) and op(B) widened to f32 one cache-sized block at a time (at
//               most 256x256 elements of each), multiplied by OpenBLAS sgemm into an f32 block of
//               C, rounded once into C. OpenMP threads take whole C tiles, each with its own
//               blocks (the scratch grows with the thread count). Measured on this machine
//               (docs/cpu_gemm.md): oneDNN 2.6's AVX512-BF16 brgemm ("brg:avx512_core_bf16") ran
//               at 0.2-1x of this, its plain AVX-512 emulation ("gemm:jit") at 0.3-0.4x, and it
//               has no AVX2 bf16 matmul. set_bf16_gemm_path_override(Onednn) still runs them.
// Both take their scratch from the caller (bf16_gemm_scratch_bytes): oneDNN runs with a
// user-managed scratchpad, so every byte is the caller's and is tracked.
//
// Errors from oneDNN (dnnl::error) are rethrown as kiln::Error "[onednn] ...".
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/half.h"

namespace kiln::cpu {

enum class GemmElt : std::uint8_t { F32, BF16, F16 };  // C's and the bias's element type

struct Bf16Gemm {
  bool trans_a = false, trans_b = false;
  std::int64_t M = 0, N = 0, K = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
  GemmElt c_type = GemmElt::BF16;
  bool has_bias = false;
  GemmElt bias_type = GemmElt::BF16;
};

enum class Bf16GemmPath : std::uint8_t { Onednn, WidenSgemm };

// The path bf16_gemm takes at the current cpu_isa().
Bf16GemmPath bf16_gemm_path();

// Benchmarks only (bench/bench_gemm.cpp --path): take one path at every level, to measure
// oneDNN's own lower-level bf16 kernels against WidenSgemm. Null: by cpu_isa() (the default).
void set_bf16_gemm_path_override(const Bf16GemmPath* path);

// The scratch bytes bf16_gemm needs for g on the current path (0 when none). On the oneDNN path
// this creates (and caches) the primitive, so the answer is the scratchpad it will use.
std::int64_t bf16_gemm_scratch_bytes(const Bf16Gemm& g);

// Runs g. scratch: at least bf16_gemm_scratch_bytes(g) bytes, 64-byte aligned (may be null when
// that is 0). bias: N elements of g.bias_type when g.has_bias.
void bf16_gemm(const Bf16Gemm& g, const bf16* A, const bf16* B, void* C, const void* bias,
               void* scratch, std::int64_t scratch_bytes);

// The same GEMM on f16 A and B (C and bias f16 or f32), always on the widening path: f16 blocks
// widened to f32 by F16C (AVX2 and above; half.h below) and multiplied by OpenBLAS sgemm.
// f16_gemm_scratch_bytes: the scratch it needs (the widening blocks), as bf16's.
std::int64_t f16_gemm_scratch_bytes(const Bf16Gemm& g);
void f16_gemm(const Bf16Gemm& g, const f16* A, const f16* B, void* C, const void* bias,
              void* scratch, std::int64_t scratch_bytes);

// The oneDNN implementation g runs on (e.g. "brg:avx512_core_amx_bf16"), or "widen+sgemm".
std::string bf16_gemm_impl(const Bf16Gemm& g);

// f32 GEMM through oneDNN (for measuring it against OpenBLAS: bench/bench_gemm.cpp). Same
// layout rules as gemm<float> in matmul.h; keeps its scratchpad itself, per thread (untracked).
void onednn_sgemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                  float beta, float* C, std::int64_t ldc);

// The same product for gemm<float> (matmul.h's rule): runs it and returns true when oneDNN's
// primitive needs no scratchpad (none of the measured shapes does, and a scratchpad here would
// be memory the tracker cannot see); returns false, having done nothing, when it would need one.
// The caller has handled M == 0, N == 0, K == 0 and alpha == 0.
bool try_onednn_sgemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                      float alpha, const float* A, std::int64_t lda, const float* B,
                      std::int64_t ldb, float beta, float* C, std::int64_t ldc);
struct OnednnCacheStats {
  std::int64_t entries = 0, created = 0, hits = 0;
};
OnednnCacheStats onednn_cache_stats();
void onednn_cache_clear();

}  // namespace kiln::cpu
