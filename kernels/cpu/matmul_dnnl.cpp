// bf16 GEMM on oneDNN matmul, and its widening sgemm fallback (see matmul_dnnl.h).
//
// Primitive cache: the first call for a problem (sizes, row and batch strides, transposes,
// element types, alpha, beta, bias) creates the oneDNN matmul primitive with a user-managed
// scratchpad; later calls reuse it. As the cuBLASLt descriptor cache (kernels/cuda/matmul.cpp),
// it is per process and cleared wholesale past kCacheMax entries (prefill lengths vary). The
// mutex is held only for the lookup: executing a primitive is thread-safe when each call brings
// its own scratchpad, which the user mode guarantees.
#include "kernels/cpu/matmul_dnnl.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;

constexpr std::size_t kCacheMax = 1024;
// Widening fallback: blocks of at most kWidenBlock rows/columns of op(A), op(B) and C. Three
// 256x256 f32 blocks are 768 KiB, inside one core's L2 (2 MiB on Sapphire Rapids).
constexpr std::int64_t kWidenBlock = 256;

// One GEMM problem as the primitive sees it (pointers excluded). a_type: bf16 or f32 inputs.
struct Problem {
  dt in_type = dt::bf16;
  Bf16Gemm g;
};

using Key = std::array<std::int64_t, 18>;
struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::uint64_t h = 1469598103934665603ull;
    for (std::int64_t v : k) h = (h ^ static_cast<std::uint64_t>(v)) * 1099511628211ull;
    return static_cast<std::size_t>(h);
  }
};

std::int64_t float_bits(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

Key make_key(const Problem& p) {
  const Bf16Gemm& g = p.g;
  return {g.M,
          g.N,
          g.K,
          g.lda,
          g.ldb,
          g.ldc,
          g.batch,
          g.stride_a,
          g.stride_b,
          g.stride_c,
          float_bits(g.alpha),
          float_bits(g.beta),
          g.trans_a,
          g.trans_b,
          static_cast<std::int64_t>(p.in_type),
          static_cast<std::int64_t>(g.c_type),
          g.has_bias ? 1 + static_cast<std::int64_t>(g.bias_type) : 0,
          0};
}

struct Entry {
  dnnl::matmul prim;
  dnnl::matmul::primitive_desc pd;
  std::int64_t scratch_bytes = 0;
  std::string impl;
};

struct Cache {
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> entries;
  std::int64_t created = 0, hits = 0;
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: no exit-order hazards with oneDNN's globals
  return *c;
}

const dnnl::engine& engine() {
  static const dnnl::engine e = [] {
    try {
      return dnnl::engine(dnnl::engine::kind::cpu, 0);
    } catch (const dnnl::error& err) {
      fail("[onednn] creating the CPU engine failed: {} (status {})", err.what(),
           static_cast<int>(err.status));
    }
  }();
  return e;
}

dt elt_type(GemmElt e) {
  return e == GemmElt::F32 ? dt::f32 : e == GemmElt::F16 ? dt::f16 : dt::bf16;
}

// The problem with batches folded where they can be: a shared B (stride_b 0) under row-major As
// and Cs whose batches are back to back is one (batch*M, K) x (K, N) GEMM, which oneDNN tiles
// better than batch small ones.
Bf16Gemm fold_batch(Bf16Gemm g) {
  if (g.batch > 1 && g.stride_b == 0 && !g.trans_a && g.stride_a == g.M * g.lda &&
      g.stride_c == g.M * g.ldc) {
    g.M *= g.batch;
    g.batch = 1;
    g.stride_a = g.stride_c = 0;
  }
  if (g.batch == 1) g.stride_a = g.stride_b = g.stride_c = 0;
  return g;
}

// oneDNN broadcasts the batch of A or of B, not of both: with both shared, each C of the batch
// is its own GEMM (C may differ per entry when beta != 0), one after another on one primitive.
bool both_shared(const Bf16Gemm& g) { return g.batch > 1 && g.stride_a == 0 && g.stride_b == 0; }
Bf16Gemm one_entry(Bf16Gemm g) {
  g.batch = 1;
  g.stride_a = g.stride_b = g.stride_c = 0;
  return g;
}
Bf16Gemm onednn_problem(const Bf16Gemm& g) { return both_shared(g) ? one_entry(g) : fold_batch(g); }

// A stored matrix as a oneDNN memory descriptor of its logical (rows, cols) = op(X), with the
// batch dim in front when batched (size 1, broadcast, when its batch stride is 0).
memory::desc matrix_desc(dt type, std::int64_t rows, std::int64_t cols, std::int64_t ld, bool trans,
                         std::int64_t batch, std::int64_t batch_stride) {
  const memory::dim rs = trans ? 1 : ld, cs = trans ? ld : 1;
  if (batch == 1) return memory::desc({rows, cols}, type, {rs, cs});
  const std::int64_t nb = batch_stride == 0 ? 1 : batch;
  const std::int64_t bs =
      batch_stride == 0 ? rows * cols * std::max<std::int64_t>(ld, 1) : batch_stride;
  return memory::desc({nb, rows, cols}, type, {bs, rs, cs});
}

std::shared_ptr<const Entry> build_entry(const Problem& p) {
  (void)cpu_isa();  // caps oneDNN's ISA (isa.cpp) before its first primitive
  const Bf16Gemm& g = p.g;
  auto e = std::make_shared<Entry>();
  const memory::desc a_md = matrix_desc(p.in_type, g.M, g.K, g.lda, g.trans_a, g.batch, g.stride_a);
  const memory::desc b_md = matrix_desc(p.in_type, g.K, g.N, g.ldb, g.trans_b, g.batch, g.stride_b);
  const memory::desc c_md =
      matrix_desc(elt_type(g.c_type), g.M, g.N, g.ldc, false, g.batch, g.stride_c);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(g.beta);
    attr.set_post_ops(po);
  }
  if (g.has_bias) {
    const memory::desc bias_md =
        g.batch == 1 ? memory::desc({1, g.N}, elt_type(g.bias_type), {g.N, 1})
                     : memory::desc({1, 1, g.N}, elt_type(g.bias_type), {g.N, g.N, 1});
    e->pd =
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), attr, engine());
  } else {
    e->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine());
  }
  e->prim = dnnl::matmul(e->pd);
  e->scratch_bytes = static_cast<std::int64_t>(e->pd.scratchpad_desc().get_size());
  e->impl = e->pd.impl_info_str();
  return e;
}

std::string describe(const Problem& p) {
  const Bf16Gemm& g = p.g;
  return fmt::format("{}{} x {}{} M={} N={} K={} lda={} ldb={} ldc={} batch={} strides {}/{}/{}",
                     p.in_type == dt::bf16 ? "bf16" : "f32", g.trans_a ? "^T" : "",
                     p.in_type == dt::bf16 ? "bf16" : "f32", g.trans_b ? "^T" : "", g.M, g.N, g.K,
                     g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c);
}

[[noreturn]] void rethrow(const dnnl::error& err, const char* what, const Problem& p) {
  fail("[onednn] {} failed for {}: {} (status {})", what, describe(p), err.what(),
       static_cast<int>(err.status));
}

std::shared_ptr<const Entry> lookup(const Problem& p) {
  const Key key = make_key(p);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.entries.find(key);
    if (it != c.entries.end()) {
      ++c.hits;
      return it->second;
    }
  }
  std::shared_ptr<const Entry> e;
  try {
    e = build_entry(p);
  } catch (const dnnl::error& err) {
    rethrow(err, "creating the matmul primitive", p);
  }
  std::lock_guard lock(c.mutex);
  if (c.entries.size() >= kCacheMax) c.entries.clear();
  ++c.created;
  c.entries.emplace(key, e);
  return e;
}

void execute(const Problem& p, const Entry& e, const void* A, const void* B, void* C,
             const void* bias, void* scratch, std::int64_t scratch_bytes) {
  KILN_CHECK(scratch_bytes >= e.scratch_bytes,
             "[onednn] matmul needs {} scratchpad bytes, was given {} ({})", e.scratch_bytes,
             scratch_bytes, describe(p));
  try {
    const dnnl::engine& eng = engine();
    thread_local dnnl::stream stream(eng);
    std::unordered_map<int, memory> args;
    args.emplace(DNNL_ARG_SRC, memory(e.pd.src_desc(), eng, const_cast<void*>(A)));
    args.emplace(DNNL_ARG_WEIGHTS, memory(e.pd.weights_desc(), eng, const_cast<void*>(B)));
    args.emplace(DNNL_ARG_DST, memory(e.pd.dst_desc(), eng, C));
    if (p.g.has_bias)
      args.emplace(DNNL_ARG_BIAS, memory(e.pd.bias_desc(), eng, const_cast<void*>(bias)));
    if (e.scratch_bytes > 0)
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.pd.scratchpad_desc(), eng, scratch));
    e.prim.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& err) {
    rethrow(err, "executing the matmul primitive", p);
  }
}

// ---- shared argument checks and the trivial cases --------------------------------------------

void check_gemm(const char* op, const Bf16Gemm& g) {
  KILN_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0 && g.batch >= 0,
             "[{}] negative size M={} N={} K={} batch={}", op, g.M, g.N, g.K, g.batch);
  const std::int64_t a_cols = g.trans_a ? g.M : g.K, b_cols = g.trans_b ? g.K : g.N;
  KILN_CHECK(g.lda >= std::max<std::int64_t>(1, a_cols), "[{}] lda {} < {}", op, g.lda, a_cols);
  KILN_CHECK(g.ldb >= std::max<std::int64_t>(1, b_cols), "[{}] ldb {} < {}", op, g.ldb, b_cols);
  KILN_CHECK(g.ldc >= std::max<std::int64_t>(1, g.N), "[{}] ldc {} < {}", op, g.ldc, g.N);
  KILN_CHECK(g.stride_a >= 0 && g.stride_b >= 0 && g.stride_c >= 0,
             "[{}] negative batch stride a={} b={} c={}", op, g.stride_a, g.stride_b, g.stride_c);
  KILN_CHECK(g.batch <= 1 || g.stride_c != 0,
             "[{}] stride_c 0 with batch {} would write one C many times", op, g.batch);
  KILN_CHECK(!g.has_bias || g.alpha == 1.0f, "[{}] a bias needs alpha 1 (got {})", op, g.alpha);
}

float load(const void* p, GemmElt t, std::int64_t i) {
  switch (t) {
    case GemmElt::F32:
      return static_cast<const float*>(p)[i];
    case GemmElt::F16:
      return f16_to_float(static_cast<const f16*>(p)[i]);
    case GemmElt::BF16:
      break;
  }
  return bf16_to_float(static_cast<const bf16*>(p)[i]);
}
void store(void* p, GemmElt t, std::int64_t i, float v) {
  if (t == GemmElt::F32)
    static_cast<float*>(p)[i] = v;
  else if (t == GemmElt::F16)
    static_cast<f16*>(p)[i] = float_to_f16(v);
  else
    static_cast<bf16*>(p)[i] = float_to_bf16(v);
}

// K == 0 or alpha == 0: C = beta * C + bias (beta == 0 overwrites).
void scale_and_bias(const Bf16Gemm& g, void* C, const void* bias) {
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t i = 0; i < g.M; ++i)
      for (std::int64_t j = 0; j < g.N; ++j) {
        const std::int64_t at = b * g.stride_c + i * g.ldc + j;
        float v = g.beta == 0.0f ? 0.0f : g.beta * load(C, g.c_type, at);
        if (g.has_bias) v += load(bias, g.bias_type, j);
        store(C, g.c_type, at, v);
      }
}

// ---- widening fallback ------------------------------------------------------------------------

// Per thread: one block of op(A), one of op(B) and, for a bf16 C, an f32 block of C. Threads
// take whole C tiles (one OpenMP region per GEMM, each sgemm single-threaded inside it): BLAS's
// own threads, woken for every small block, stall for milliseconds on a loaded machine.
struct WidenBlocks {
  std::int64_t mb, nb, kb;
  std::int64_t a_floats, b_floats, c_floats;  // c: 0 when C is f32 (accumulated in place)
  std::int64_t tiles_m, tiles_n, tiles, threads;
  std::int64_t thread_floats() const { return (a_floats + b_floats + c_floats + 15) / 16 * 16; }
  std::int64_t bytes() const { return threads * thread_floats() * 4; }
};
WidenBlocks widen_blocks(const Bf16Gemm& g) {
  WidenBlocks w;
  w.mb = std::clamp<std::int64_t>(g.M, 1, kWidenBlock);
  w.nb = std::clamp<std::int64_t>(g.N, 1, kWidenBlock);
  w.kb = std::clamp<std::int64_t>(g.K, 1, kWidenBlock);
  w.a_floats = w.mb * w.kb;
  w.b_floats = w.kb * w.nb;
  w.c_floats = g.c_type == GemmElt::F32 ? 0 : w.mb * w.nb;
  w.tiles_m = (g.M + w.mb - 1) / w.mb;
  w.tiles_n = (g.N + w.nb - 1) / w.nb;
  w.tiles = g.batch * w.tiles_m * w.tiles_n;
  w.threads = omp_in_parallel() ? 1 : std::clamp<std::int64_t>(omp_get_max_threads(), 1, w.tiles);
  return w;
}

// The block of op(X) at (r0, c0), (rows, cols), widened to f32 in dst as it is stored: row-major
// (rows, cols) when !trans, else the stored (cols, rows) block, which sgemm reads transposed.
// Either way the reads run along stored rows: gathering a transposed block column by column
// strides whole rows apart (64 KiB for a 32000-wide gradient), which thrashes the caches.
// Returns dst's row stride.
// E: bf16 or f16 (f16 rows through F16C's vcvtph2ps where the CPU has it).
template <class E>
std::int64_t widen_block(const E* X, std::int64_t ld, bool trans, std::int64_t r0, std::int64_t c0,
                         std::int64_t rows, std::int64_t cols, float* dst) {
  const std::int64_t stored_rows = trans ? cols : rows, stored_cols = trans ? rows : cols;
  const E* base = trans ? X + c0 * ld + r0 : X + r0 * ld + c0;
  for (std::int64_t r = 0; r < stored_rows; ++r) {
    const E* s = base + r * ld;
    float* d = dst + r * stored_cols;
    if constexpr (std::is_same_v<E, f16>)
      f16_to_f32(stored_cols, s, d);
    else
      for (std::int64_t c = 0; c < stored_cols; ++c) d[c] = bf16_to_float(s[c]);
  }
  return stored_cols;
}

// C tile (i0, j0) of one batch entry (A, B, C already offset to it): K in blocks, accumulated
// in f32, rounded once into a bf16 C.
template <class E>
void widen_tile(const Bf16Gemm& g, const WidenBlocks& w, const E* A, const E* B, void* C,
                const void* bias, std::int64_t i0, std::int64_t j0, float* scratch) {
  float* a_blk = scratch;
  float* b_blk = a_blk + w.a_floats;
  float* c_blk = b_blk + w.b_floats;
  const std::int64_t nb = std::min(w.nb, g.N - j0), mb = std::min(w.mb, g.M - i0);
  // acc (mb, nb) with row stride ldacc: C itself when f32, else the f32 block.
  const bool in_place = g.c_type == GemmElt::F32;
  float* acc = in_place ? static_cast<float*>(C) + i0 * g.ldc + j0 : c_blk;
  const std::int64_t ldacc = in_place ? g.ldc : nb;
  for (std::int64_t i = 0; i < mb; ++i)
    for (std::int64_t j = 0; j < nb; ++j) {
      const std::int64_t at = (i0 + i) * g.ldc + j0 + j;
      float v = g.beta == 0.0f ? 0.0f : g.beta * load(C, g.c_type, at);
      if (g.has_bias) v += load(bias, g.bias_type, j0 + j);
      acc[i * ldacc + j] = v;
    }
  for (std::int64_t k0 = 0; k0 < g.K; k0 += w.kb) {
    const std::int64_t kb = std::min(w.kb, g.K - k0);
    const std::int64_t lda = widen_block(A, g.lda, g.trans_a, i0, k0, mb, kb, a_blk);
    const std::int64_t ldb = widen_block(B, g.ldb, g.trans_b, k0, j0, kb, nb, b_blk);
    sgemm_openblas(g.trans_a, g.trans_b, mb, nb, kb, g.alpha, a_blk, lda, b_blk, ldb, 1.0f, acc,
                   ldacc);
  }
  if (!in_place)
    for (std::int64_t i = 0; i < mb; ++i)
      for (std::int64_t j = 0; j < nb; ++j)
        store(C, g.c_type, (i0 + i) * g.ldc + j0 + j, acc[i * ldacc + j]);
}

std::int64_t elt_size(GemmElt t) { return t == GemmElt::F32 ? 4 : 2; }

template <class E>
void widen_sgemm(const Bf16Gemm& g, const E* A, const E* B, void* C, const void* bias,
                 void* scratch, std::int64_t scratch_bytes) {
  const WidenBlocks w = widen_blocks(g);
  KILN_CHECK(scratch_bytes >= w.bytes(), "[bf16_gemm] needs {} scratch bytes, was given {}",
             w.bytes(), scratch_bytes);
  const std::int64_t per_batch = w.tiles_m * w.tiles_n;
  auto run_tile = [&](std::int64_t t, int thread) {
    const std::int64_t b = t / per_batch, tm = (t % per_batch) / w.tiles_n, tn = t % w.tiles_n;
    float* mine = static_cast<float*>(scratch) + thread * w.thread_floats();
    widen_tile(g, w, A + b * g.stride_a, B + b * g.stride_b,
               static_cast<char*>(C) + b * g.stride_c * elt_size(g.c_type), bias, tm * w.mb,
               tn * w.nb, mine);
  };
  // One thread: no parallel construct at all, not a serialized one (`if (false)`). OpenBLAS,
  // called inside a serialized region, asks omp_in_parallel() (false: the region is inactive) and
  // forks its own team. libgomp gives that nested team its threads; LLVM's libomp (clang builds)
  // runs it with one, and OpenBLAS's threaded sgemm then waits forever for the partner it was
  // promised (seen in test_nn MixedPrecision.Bf16LossTracksF32, clang 14, 2 threads).
  if (w.threads > 1) {
#pragma omp parallel for num_threads(static_cast <int>(w.threads)) schedule(static)
    for (std::int64_t t = 0; t < w.tiles; ++t) run_tile(t, omp_get_thread_num());
  } else {
    for (std::int64_t t = 0; t < w.tiles; ++t) run_tile(t, 0);
  }
}

}  // namespace

namespace {
constexpr int kNoOverride = -1;
std::atomic<int> g_path_override{kNoOverride};
}  // namespace

void set_bf16_gemm_path_override(const Bf16GemmPath* path) {
  g_path_override.store(path ? static_cast<int>(*path) : kNoOverride);
}

Bf16GemmPath bf16_gemm_path() {
  if (const int o = g_path_override.load(std::memory_order_relaxed); o != kNoOverride)
    return static_cast<Bf16GemmPath>(o);
  return cpu_has(CpuIsa::Amx) ? Bf16GemmPath::Onednn : Bf16GemmPath::WidenSgemm;
}

std::int64_t bf16_gemm_scratch_bytes(const Bf16Gemm& g0) {
  check_gemm("bf16_gemm", g0);
  if (g0.M == 0 || g0.N == 0 || g0.batch == 0 || g0.K == 0 || g0.alpha == 0.0f) return 0;
  if (bf16_gemm_path() == Bf16GemmPath::WidenSgemm) return widen_blocks(g0).bytes();
  return lookup({dt::bf16, onednn_problem(g0)})->scratch_bytes;
}

void bf16_gemm(const Bf16Gemm& g0, const bf16* A, const bf16* B, void* C, const void* bias,
               void* scratch, std::int64_t scratch_bytes) {
  check_gemm("bf16_gemm", g0);
  if (g0.M == 0 || g0.N == 0 || g0.batch == 0) return;
  if (g0.K == 0 || g0.alpha == 0.0f) return scale_and_bias(g0, C, bias);
  if (bf16_gemm_path() == Bf16GemmPath::WidenSgemm)
    return widen_sgemm(g0, A, B, C, bias, scratch, scratch_bytes);
  const Problem p{dt::bf16, onednn_problem(g0)};
  const auto e = lookup(p);
  const std::int64_t entries = both_shared(g0) ? g0.batch : 1;
  for (std::int64_t b = 0; b < entries; ++b)
    execute(p, *e, A, B, static_cast<char*>(C) + b * g0.stride_c * elt_size(g0.c_type), bias,
            scratch, scratch_bytes);
}

std::string bf16_gemm_impl(const Bf16Gemm& g) {
  check_gemm("bf16_gemm", g);
  if (bf16_gemm_path() == Bf16GemmPath::WidenSgemm) return "widen+sgemm";
  return lookup({dt::bf16, onednn_problem(g)})->impl;
}

namespace {
// One f32 product as a plan (gemm<float>'s layout rules).
Bf16Gemm sgemm_plan(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                    float alpha, std::int64_t lda, std::int64_t ldb, float beta, std::int64_t ldc) {
  return {.trans_a = trans_a,
          .trans_b = trans_b,
          .M = M,
          .N = N,
          .K = K,
          .lda = lda,
          .ldb = ldb,
          .ldc = ldc,
          .alpha = alpha,
          .beta = beta,
          .c_type = GemmElt::F32};
}
}  // namespace

void onednn_sgemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                  float beta, float* C, std::int64_t ldc) {
  const Bf16Gemm g = sgemm_plan(trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc);
  check_gemm("onednn_sgemm", g);
  if (M == 0 || N == 0) return;
  KILN_CHECK(K > 0 && alpha != 0.0f, "[onednn_sgemm] needs K > 0 and alpha != 0");
  const Problem p{dt::f32, g};
  const auto e = lookup(p);
  // Kept per thread between calls (not zeroed per call, which would tilt the comparison).
  thread_local std::vector<std::byte> scratch;
  if (scratch.size() < static_cast<std::size_t>(e->scratch_bytes) + 64)
    scratch.resize(static_cast<std::size_t>(e->scratch_bytes) + 64);
  void* aligned =
      scratch.data() + (64 - reinterpret_cast<std::uintptr_t>(scratch.data()) % 64) % 64;
  execute(p, *e, A, B, C, nullptr, aligned, e->scratch_bytes);
}

bool try_onednn_sgemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                      float alpha, const float* A, std::int64_t lda, const float* B,
                      std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  const Problem p{dt::f32, sgemm_plan(trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc)};
  const auto e = lookup(p);
  if (e->scratch_bytes > 0) return false;
  execute(p, *e, A, B, C, nullptr, nullptr, 0);
  return true;
}

std::int64_t f16_gemm_scratch_bytes(const Bf16Gemm& g) {
  check_gemm("f16_gemm", g);
  if (g.M == 0 || g.N == 0 || g.batch == 0 || g.K == 0 || g.alpha == 0.0f) return 0;
  return widen_blocks(g).bytes();
}

void f16_gemm(const Bf16Gemm& g, const f16* A, const f16* B, void* C, const void* bias,
              void* scratch, std::int64_t scratch_bytes) {
  check_gemm("f16_gemm", g);
  KILN_CHECK(g.c_type != GemmElt::BF16 && (!g.has_bias || g.bias_type != GemmElt::BF16),
             "[f16_gemm] C and the bias are f16 or f32");
  if (g.M == 0 || g.N == 0 || g.batch == 0) return;
  if (g.K == 0 || g.alpha == 0.0f) return scale_and_bias(g, C, bias);
  widen_sgemm(g, A, B, C, bias, scratch, scratch_bytes);
}

OnednnCacheStats onednn_cache_stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return {static_cast<std::int64_t>(c.entries.size()), c.created, c.hits};
}

void onednn_cache_clear() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.entries.clear();
}

}  // namespace kiln::cpu
