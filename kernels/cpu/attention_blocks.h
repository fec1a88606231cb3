// The block steps of the CPU attention (kernels/cpu/attention.cpp), shared by the f32/f64
// kernels and the bf16 one (kernels/cpu/attention_bf16.cpp), which widens each block's tiles to
// f32 and runs the same steps on them. Internal to the attention kernels.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/half.h"

namespace kiln::cpu::attn {

constexpr int64_t kBlockQ = 64;  // query rows per block

// Per-head GEMMs are small and run inside our OpenMP region, one per thread. OpenBLAS's OpenMP
// build (what CMake links when present) notices the active region and stays single-threaded.
// The pthreads build does not: it would run each GEMM on its own thread pool and fight our
// threads, so pin it to one thread for the duration of the kernel. (Only for that build: in the
// OpenMP build openblas_set_num_threads would also change OpenMP's own thread count.)
class BlasSingleThreaded {
 public:
  BlasSingleThreaded() {
    if (openblas_get_parallel() == 1 && (prev_ = openblas_get_num_threads()) > 1)
      openblas_set_num_threads(1);
    else
      prev_ = 0;
  }
  ~BlasSingleThreaded() {
    if (prev_ > 1) openblas_set_num_threads(prev_);
  }
  BlasSingleThreaded(const BlasSingleThreaded&) = delete;
  BlasSingleThreaded& operator=(const BlasSingleThreaded&) = delete;

 private:
  int prev_ = 0;
};

// The task split of the forward, shared by every dtype. Tasks are (b, head, query block); in
// decode (Tq == 1, G > 1) a task is (b, kv head) and its block holds the G query heads of the
// group (rows D apart), so the cache is read once per kv head.
struct ForwardPlan {
  int64_t G, ldq, ldkv;  // query heads per kv head; row strides of q/out and k/v
  bool grouped;
  int64_t nqb, nheads, ntasks, max_rows;
  bool parallel;  // worth an OpenMP region
  ForwardPlan(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D)
      : G(Hq / Hkv), ldq(Hq * D), ldkv(Hkv * D), grouped(Tq == 1 && G > 1) {
    nqb = grouped ? 1 : (Tq + kBlockQ - 1) / kBlockQ;
    nheads = grouped ? Hkv : Hq;
    ntasks = B * nheads * nqb;
    max_rows = grouped ? std::min(G, kBlockQ) : std::min(Tq, kBlockQ);
    parallel = ntasks > 1 && double(ntasks) * double(max_rows) * double(Tk) * double(D) >= 1e5;
  }
  // Task t's query block (the largest, latest causal blocks first, for load balance), head
  // (kv head when grouped) and batch.
  int64_t block(int64_t t) const { return nqb - 1 - t % nqb; }
  int64_t head(int64_t t) const { return (t / nqb) % nheads; }
  int64_t batch(int64_t t) const { return t / (nqb * nheads); }
};

// The task split of the backward: one task per (b, kv head), so the gradient sums over a group
// of query heads have a fixed order (deterministic, independent of the thread count).
struct BackwardPlan {
  int64_t G, ldq, ldkv, nqb, brows, ntasks;
  bool parallel;
  BackwardPlan(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D)
      : G(Hq / Hkv),
        ldq(Hq * D),
        ldkv(Hkv * D),
        nqb((T + kBlockQ - 1) / kBlockQ),
        brows(std::min(T, kBlockQ)),
        ntasks(B * Hkv),
        parallel(ntasks > 1 &&
                 double(ntasks) * double(G) * double(T) * double(T) * double(D) >= 1e5) {}
};

// The f32 per-block products on AVX2 + FMA (attention_sgemm.cpp), row-major:
//   C (m x n, ldc) = alpha * op(A) op(B), or C += alpha * op(A) op(B) when accumulate;
//   op(A) = A (m x k, lda) or, with trans_a, A^T of A (k x m, lda); likewise op(B) (k x n).
// Available when the level is Avx2 or higher.
bool block_sgemm_available();
// Whether the f32 attention runs its block products on block_sgemm instead of BLAS: at Avx2
// and above for head dims up to 64 (attention_sgemm.cpp has the measurements), unless
// KILN_ATTENTION_GEMM=openblas (read once; auto or unset: the rule) or
// set_attention_gemm_openblas says otherwise.
bool block_sgemm_takes(int64_t head_dim);
// Tests and benchmarks: true: every block product on OpenBLAS; false: the rule; null: back to
// the environment. Not thread-safe against running attention.
void set_attention_gemm_openblas(const bool* on);
void block_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate,
                 float* c, int64_t ldc);

// Throws kiln::Error on sizes the kernels cannot take.
void check_attention(const char* what, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv,
                     int64_t D, int64_t q_offset, int64_t kv_batch_stride);

// Row softmax of s: (rows, kend) in place; row r keeps its first min(kend, valid0 + r * step)
// entries, the rest become 0; lse_blk[r * lse_stride] = its log-sum-exp.
template <typename T>
void softmax_rows(int64_t rows, int64_t kend, int64_t valid0, int64_t valid_step, T* s, T* lse_blk,
                  int64_t lse_stride);

// One forward block: rows queries against keys [0, kend), row r seeing keys
// [0, min(kend, valid0 + r * valid_step)).
//   q_blk: rows x D (row stride ldq), k_blk / v_blk: kend x D (row stride ldkv),
//   o_blk: rows x D (row stride ldo) (=), lse_blk: rows (stride lse_stride) (=),
//   s: scratch of rows * kend.
template <typename T>
void forward_block(int64_t rows, int64_t kend, int64_t D, T scale, const T* q_blk, int64_t ldq,
                   const T* k_blk, const T* v_blk, int64_t ldkv, int64_t valid0, int64_t valid_step,
                   T* o_blk, int64_t ldo, T* lse_blk, int64_t lse_stride, T* s);

// One backward block: query rows [i0, i0 + rows) of one head against keys [0, i0 + rows)
// (causal, training). q/out/dout/dq blocks have row stride ldq, k/v/dk/dv row stride ldkv.
//   dq_blk =, dk_blk and dv_blk += (keys [0, i0 + rows)).
//   p, dp: scratch of rows * (i0 + rows); di: scratch of rows.
template <typename T>
void backward_block(int64_t rows, int64_t i0, int64_t D, T scale, const T* q_blk, const T* o_blk,
                    const T* do_blk, const T* lse_blk, int64_t ldq, const T* k_blk, const T* v_blk,
                    int64_t ldkv, T* dq_blk, T* dk_blk, T* dv_blk, T* p, T* dp, T* di);

// The bf16 forward's training/prefill blocks on AMX tiles (attention_amx.cpp): whether it takes
// these sizes at the current level (Tq > 1, D % 32 == 0, cpu_has(Amx)), and the run, with
// attention_forward<bf16>'s arguments (sizes already checked).
bool amx_forward_supported(int64_t Tq, int64_t D);
void attention_forward_amx(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                           int64_t q_offset, float scale, const bf16* q, const bf16* k,
                           const bf16* v, int64_t kv_batch_stride, bf16* out, float* lse);

}  // namespace kiln::cpu::attn
