// cuBLASLt launchers for kernels/cuda/matmul.h (the math, layouts and the row-major ->
// column-major mapping are documented there). Host code only: cuBLASLt is a host API, so this
// file is compiled by the C++ compiler into kiln_kernels_cuda.
//
// Descriptor cache: the first call for a GemmKey creates the matmul descriptor, the three
// layouts (C and D share one) and asks cublasLtMatmulAlgoGetHeuristic for an algorithm; every
// later call with the same key reuses them and only sets the bias pointer. A "no algorithm"
// answer is cached too. The cache is per process, keyed by device, and is cleared wholesale past
// kGemmCacheMax entries (dynamic shapes, e.g. prefill lengths, could otherwise grow it forever).
// One mutex guards it and is held across cublasLtMatmul, since the cached descriptor's pointer
// attributes are set per call; the launch itself is asynchronous, so this costs no GPU time.
#include "kernels/cuda/matmul.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace kiln::cuda {
namespace {

std::atomic<bool> g_allow_tf32{false};

cudaDataType_t cuda_type(GemmType t) {
  switch (t) {
    case GemmType::F32:
      return CUDA_R_32F;
    case GemmType::BF16:
      return CUDA_R_16BF;
    case GemmType::F16:
      return CUDA_R_16F;
  }
  fail("[gemm] unknown GemmType {}", static_cast<int>(t));
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias:
      return CUBLASLT_EPILOGUE_BIAS;
  }
  fail("[gemm] unknown GemmEpilogue {}", static_cast<int>(e));
}

// Cached descriptors for one GemmKey. Destroying descriptors is host-only, so it is safe at any
// time, including process exit.
struct GemmEntry {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace_bytes = 0;
  bool has_algo = false;

  GemmEntry() = default;
  GemmEntry(const GemmEntry&) = delete;
  GemmEntry& operator=(const GemmEntry&) = delete;
  ~GemmEntry() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct PreferenceGuard {
  cublasLtMatmulPreference_t pref = nullptr;
  ~PreferenceGuard() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
};

struct GemmCache {
  std::mutex mutex;
  std::unordered_map<GemmKey, std::unique_ptr<GemmEntry>, GemmKeyHash> entries;
  std::int64_t heuristic_queries = 0;
  std::int64_t hits = 0;
};
GemmCache& cache() {
  static GemmCache* c = new GemmCache;  // never destroyed: no exit-order hazards
  return *c;
}

template <typename V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <typename V>
void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& v) {
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v)));
}
template <typename V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                                   std::int64_t ld, std::int64_t batch, std::int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows),
                                               static_cast<std::uint64_t>(cols), ld));
  try {
    if (batch > 1) {
      set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<std::int32_t>(batch));
      set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
    }
  } catch (...) {
    cublasLtMatrixLayoutDestroy(l);
    throw;
  }
  return l;
}

std::string describe(const GemmArgs& g, const GemmEpilogueArgs& ep, bool tf32) {
  return fmt::format(
      "{} {}M={} N={} K={} batch={} trans_a={} trans_b={} lda={} ldb={} ldc={} strides=({}, {}, "
      "{}) epilogue={}",
      gemm_type_name(g.type), tf32 ? "(tf32) " : "", g.M, g.N, g.K, g.batch, g.trans_a, g.trans_b,
      g.lda, g.ldb, g.ldc, g.stride_a, g.stride_b, g.stride_c, static_cast<int>(ep.epilogue));
}

// Builds the descriptors for `key` and asks the heuristic for an algorithm. The pointers are the
// first call's: the heuristic reads the bias pointer's alignment from the descriptor.
std::unique_ptr<GemmEntry> build_entry(const GemmArgs& g, const GemmPlan& p,
                                       const GemmEpilogueArgs& ep, bool tf32, const GemmKey& key,
                                       std::int64_t& queries) {
  auto e = std::make_unique<GemmEntry>();
  const cudaDataType_t type = cuda_type(g.type);
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&e->op, compute, CUDA_R_32F));
  set_desc(e->op, CUBLASLT_MATMUL_DESC_TRANSA,
           static_cast<std::int32_t>(p.transa ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_desc(e->op, CUBLASLT_MATMUL_DESC_TRANSB,
           static_cast<std::int32_t>(p.transb ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_desc(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
           static_cast<std::uint32_t>(lt_epilogue(ep.epilogue)));
  if (epilogue_has_bias(ep.epilogue)) {
    // Bias in D's dtype, one vector for every batch entry.
    set_desc(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(type));
    set_desc(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ep.bias);
  }
  e->a = make_layout(type, p.a_rows, p.a_cols, p.lda, p.batch, p.stride_a);
  e->b = make_layout(type, p.b_rows, p.b_cols, p.ldb, p.batch, p.stride_b);
  e->c = make_layout(type, p.c_rows, p.c_cols, p.ldc, p.batch, p.stride_c);

  const Workspace ws = cublaslt_workspace();
  PreferenceGuard pref;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.pref));
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
           static_cast<std::uint64_t>(ws.bytes));
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
           static_cast<std::uint32_t>(key.align_b));  // cuBLAS A = kiln B
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
           static_cast<std::uint32_t>(key.align_a));
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
           static_cast<std::uint32_t>(key.align_c));
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
           static_cast<std::uint32_t>(key.align_c));

  constexpr int kRequested = 4;
  cublasLtMatmulHeuristicResult_t results[kRequested] = {};
  int returned = 0;
  ++queries;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      cublaslt_handle(), e->op, e->a, e->b, e->c, e->c, pref.pref, kRequested, results, &returned);
  // NOT_SUPPORTED is how the heuristic says "nothing fits"; anything else is a real error.
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) KILN_CUBLAS_CHECK(st);
  for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < returned; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= ws.bytes) {
      e->algo = results[i].algo;
      e->workspace_bytes = results[i].workspaceSize;
      e->has_algo = true;
      break;
    }
  }
  return e;
}

bool run_gemm(const GemmArgs& g, float alpha, const void* a, const void* b, float beta, void* d,
              const GemmEpilogueArgs& ep, StreamHandle stream, bool must) {
  KILN_CHECK(a != nullptr && b != nullptr && d != nullptr, "[gemm] null operand pointer");
  const GemmPlan p = plan_gemm(g);
  check_gemm_epilogue(ep.epilogue, ep.bias);
  const bool tf32 = g.type == GemmType::F32 && g_allow_tf32.load(std::memory_order_relaxed);
  const int es = gemm_type_size(g.type);
  const int align_a = gemm_alignment(reinterpret_cast<std::uintptr_t>(a), g.stride_a, g.batch, es);
  const int align_b = gemm_alignment(reinterpret_cast<std::uintptr_t>(b), g.stride_b, g.batch, es);
  const int align_c = gemm_alignment(reinterpret_cast<std::uintptr_t>(d), g.stride_c, g.batch, es);
  const int align_bias = gemm_alignment(reinterpret_cast<std::uintptr_t>(ep.bias), 0, 1, es);
  const GemmKey key =
      make_gemm_key(current_device(), g.type, tf32, p, ep, align_a, align_b, align_c, align_bias);

  GemmCache& c = cache();
  std::lock_guard lock(c.mutex);
  auto it = c.entries.find(key);
  if (it == c.entries.end()) {
    if (c.entries.size() >= kGemmCacheMax) c.entries.clear();
    it = c.entries.emplace(key, build_entry(g, p, ep, tf32, key, c.heuristic_queries)).first;
  } else {
    ++c.hits;
  }
  GemmEntry& e = *it->second;
  if (!e.has_algo) {
    if (!must) return false;
    fail("[gemm] cuBLASLt has no algorithm for {} (alignments a={} b={} c={} bias={})",
         describe(g, ep, tf32), align_a, align_b, align_c, align_bias);
  }
  if (epilogue_has_bias(ep.epilogue)) set_desc(e.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ep.bias);
  const Workspace ws = cublaslt_workspace();
  // cuBLAS A = kiln B, cuBLAS B = kiln A (see plan_gemm); C and D are the same buffer.
  KILN_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), e.op, &alpha, b, e.a, a, e.b, &beta, d, e.c,
                                   d, e.c, &e.algo, e.workspace_bytes ? ws.ptr : nullptr,
                                   e.workspace_bytes, stream));
  return true;
}

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

void gemm_lt(const GemmArgs& args, float alpha, const void* a, const void* b, float beta, void* d,
             const GemmEpilogueArgs& ep, StreamHandle stream) {
  run_gemm(args, alpha, a, b, beta, d, ep, stream, true);
}

bool try_gemm_lt(const GemmArgs& args, float alpha, const void* a, const void* b, float beta,
                 void* d, const GemmEpilogueArgs& ep, StreamHandle stream) {
  return run_gemm(args, alpha, a, b, beta, d, ep, stream, false);
}

GemmCacheStats gemm_cache_stats() {
  GemmCache& c = cache();
  std::lock_guard lock(c.mutex);
  return {static_cast<std::int64_t>(c.entries.size()), c.heuristic_queries, c.hits};
}

void gemm_cache_clear() {
  GemmCache& c = cache();
  std::lock_guard lock(c.mutex);
  c.entries.clear();
}

}  // namespace kiln::cuda
