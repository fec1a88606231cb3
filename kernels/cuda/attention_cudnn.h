// cuDNN's fused scaled-dot-product ("flash") attention, forward and backward, built directly on the
// cuDNN v9 backend graph API (no cudnn-frontend). kiln's second attention implementation: a
// cross-check for kiln's own kernel (ops::set_attention_impl(ops::AttentionImpl::Cudnn)).
//
// Math (as kernels/cpu/attention.h): causal attention with grouped-query heads,
//   S = scale * q k^T, masked where key j > q_offset + i,  P = softmax(S),  out = P v,
//   lse = log(sum_j exp(S_ij)) (natural log, f32); query head h reads kv head h / (Hq / Hkv).
//   Backward (Tq == Tk, q_offset 0): dv = P^T dout, dP = dout v^T, Di = rowsum(dout * out),
//   dS = P * (dP - Di), dq = scale * dS k, dk = scale * dS^T q; GQA sums dk/dv over the group.
//   All outputs are written (=), never accumulated.
//
// How cuDNN is driven: cuDNN 9.19 has no single attention call for a causal mask on Hopper; its
// fused-attention (runtime-fusion) engines take an operation graph of matmul, pointwise and
// reduction nodes, the pattern cudnn-frontend's composite SDPA node emits for cuDNN < 9.21:
//   forward:  S = Q K^T -> *scale -> select(row + q_offset >= col, S, -inf) -> softmax written as
//             max/sub/exp/sum, Stats = max + log(sum) (the natural-log lse, exactly kiln's lse),
//             P = exp / sum -> O = P V.
//   backward: softmax_sum = rowsum(dO * O); P = exp(scale * Q K^T - Stats) (masked);
//             dV = P^T dO; dS = scale * P * (dO V^T - softmax_sum); dK = dS^T Q;
//             dQ = dS K (accumulated in an f32 buffer, then copied into dq);
//             GQA: dK/dV per query head, reduced over the group.
// The graph is first described as plain data (GraphSpec, CPU-testable), then translated into
// backend descriptors, finalized, and given an execution plan by cuDNN's heuristics. Plans are
// cached per SdpaKey (bounded, process lifetime), so a shape is planned once.
//
// Decoding: each token grows Tk (and q_offset), so each step is a new SdpaKey, and planning one
// compiles a kernel with NVRTC (~5 s). So decode keys (forward, q_offset > 0) are planned as
// cuDNN dynamic-shape graphs (CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED) sharing one
// kernel cache (CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR) per shape_family(): the first step of a
// family compiles the kernel, later steps finalize a plan that binds the cached kernel (cheap).
// This needs cuDNN >= 9.5 at run time (the kernel cache's operation-graph attribute); with an
// older library, or when cuDNN refuses the dynamic graph, the family falls back to one compiled
// plan per shape (and says so once on stderr). Bucketing Tk instead was not chosen: it would
// read keys past Tk, which kiln's KV cache leaves uninitialized (0 * NaN in P V).
//
// Layouts are kiln's (see ops::attention in tensor/ops.h), mapped to cuDNN's (batch, head, seq,
// hidden) dims with strides, so nothing is transposed or copied:
//   q, out, dq, dout: (B, Tq, Hq, D) dense -> dims (B, Hq, Tq, D),  strides (Tq*Hq*D, D, Hq*D, 1)
//   k, v: (B, Tk, Hkv, D), batch stride kbs -> dims (B, Hkv, Tk, D), strides (kbs, D, Hkv*D, 1)
//   lse: (B, Hq, Tq) f32                    -> dims (B, Hq, Tq, 1),  strides (Hq*Tq, Tq, 1, 1)
//   K^T / V^T are the same memory described with the last two dims and strides swapped.
//
// This header is plain C++ (compiled by g++ too): no cuDNN types. The GraphSpec and layout
// functions need no device; workspace_bytes/forward/backward need one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace kiln::cuda::cudnn_sdpa {

// Storage type of q, k, v, out and the gradients (cuDNN's fused attention needs half types).
enum class IoType : std::uint8_t { BF16, F16 };

// Everything that shapes a graph and its plan: the plan-cache key.
struct SdpaKey {
  bool backward = false;
  IoType io = IoType::BF16;
  std::int64_t B = 0, Tq = 0, Tk = 0, Hq = 0, Hkv = 0, D = 0;
  std::int64_t kv_batch_stride = 0;  // elements from k[b] to k[b+1] (v alike); >= Tk * Hkv * D
  std::int64_t q_offset = 0;         // query i sits at position q_offset + i (causal shift)
  float scale = 0.0f;                // compared bitwise (finite, checked by validate)
  int device = 0;                    // plans and handles are per device
  bool operator==(const SdpaKey&) const = default;
};
std::size_t hash_key(const SdpaKey& key);
// "fwd bf16 B=2 Tq=64 Tk=64 Hq=8 Hkv=2 D=64 kbs=... q_offset=0 scale=0.125 cuda:0", for messages.
std::string describe(const SdpaKey& key);
// Fails with "[attention_cudnn] ..." when the key is outside what this path supports: sizes > 0,
// Hq % Hkv == 0, q_offset + Tq <= Tk, kbs >= Tk*Hkv*D, D a multiple of 8 and <= 256 (cuDNN's
// fused attention surface on Hopper), backward only with Tq == Tk, q_offset 0 and dense k/v, a
// finite nonzero scale, and every bound buffer within 2^31 elements.
void validate(const SdpaKey& key);

// Versions: the graph is built with the cuDNN 9 backend API; kMinCudnnVersion is what it needs
// at run time (cudnnGetVersion() of the library actually loaded), kMinDynamicShapeVersion what
// the decode kernel cache needs (above).
inline constexpr int kMinCudnnVersion = 90000;
inline constexpr int kMinDynamicShapeVersion = 90500;
// Fails with "[attention_cudnn] the loaded cuDNN is X ... needs >= 9.0.0 ..." (naming `where`,
// the library's file, when known) when `loaded` is below kMinCudnnVersion or not cuDNN 9.
void check_cudnn_version(int loaded, const std::string& where = "");

// The kernel-cache key of a plan: decode keys (forward, q_offset > 0) with Tk, q_offset and the
// kv batch stride cleared, so that every step of a decode (same B, Tq, heads, D, dtype, scale,
// device) maps to one family; any other key is its own family, unchanged.
SdpaKey shape_family(const SdpaKey& key);
// Whether `key` is planned as a dynamic-shape graph with the family's kernel cache, given the
// loaded cuDNN version.
bool uses_kernel_cache(const SdpaKey& key, int cudnn_version);

// A 4-d tensor as cuDNN sees it: dims and strides in elements.
struct Layout4 {
  std::array<std::int64_t, 4> dims{};
  std::array<std::int64_t, 4> strides{};
  bool operator==(const Layout4&) const = default;
};
Layout4 q_layout(const SdpaKey& key);       // q, out, dq, dout
Layout4 kv_layout(const SdpaKey& key);      // k, v (and dk, dv in backward, where kbs is dense)
Layout4 stats_layout(const SdpaKey& key);   // lse
Layout4 scores_layout(const SdpaKey& key);  // (B, Hq, Tq, Tk) dense, the virtual score matrix
Layout4 swap_last_two(const Layout4& l);    // K -> K^T as a strided view

// ---- the graph, as data -------------------------------------------------------------------------
enum class ElemType : std::uint8_t { F32, BF16, F16, I32, Bool };
enum class OpKind : std::uint8_t { Matmul, Pointwise, Reduction, Reshape };
enum class PwMode : std::uint8_t {
  Add,
  Sub,
  Mul,
  Div,
  Exp,
  Log,
  Identity,
  GenIndex,
  CmpGe,
  Select
};
enum class RedMode : std::uint8_t { Add, Max };

// Fixed unique ids of the tensors the caller binds (variant pack) or that carry by-value scalars;
// virtual intermediates get ids from kFirstVirtual on.
namespace uid {
inline constexpr std::int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8,
                              kDV = 9, kScale = 10, kNegInf = 11, kShift = 12, kOne = 13,
                              kSoftmaxSum = 14, kDQAccum = 15, kFirstVirtual = 100;
}  // namespace uid

struct TensorSpec {
  std::int64_t uid = 0;
  std::string name;
  Layout4 layout;
  ElemType type = ElemType::F32;
  bool is_virtual = false;
  bool by_value = false;  // a host scalar passed in the variant pack (dims all 1)
};

struct OpSpec {
  OpKind kind = OpKind::Pointwise;
  std::string name;
  PwMode pw = PwMode::Add;     // Pointwise only
  RedMode red = RedMode::Add;  // Reduction only
  ElemType compute = ElemType::F32;
  std::int64_t axis = -1;  // Pointwise GenIndex axis (and the shift Add, as cudnn-frontend)
  // Input uids in port order: pointwise x, b, t (select: x = value if true, b = value if false, t =
  // predicate); matmul a, b; reduction and reshape x.
  std::vector<std::int64_t> inputs;
  std::int64_t output = 0;
};

struct GraphSpec {
  std::vector<TensorSpec> tensors;
  std::vector<OpSpec> ops;
  float scale = 0.0f, neg_inf = 0.0f,
        one = 1.0f;                                  // by-value scalars (kScale, kNegInf, kOne)
  std::int32_t shift = 0;                            // kShift (only when q_offset > 0)
  const TensorSpec& tensor(std::int64_t uid) const;  // fails if absent
  // Non-virtual, non-by-value uids: what the variant pack binds to device memory.
  std::vector<std::int64_t> bound_uids() const;
};
GraphSpec build_graph(const SdpaKey& key);

// Device scratch the graph needs beyond cuDNN's own workspace, in bytes: backward binds an f32
// softmax_sum (B, Hq, Tq) and an f32 dQ accumulator (B, Hq, Tq, D); forward none. Each piece starts
// at a 256-byte boundary after cuDNN's workspace.
// (Host arithmetic: the dry run declares it for the cuDNN backward entries.)
inline constexpr std::size_t kScratchAlign = 256;
inline std::size_t align_up(std::size_t n) {
  return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}
inline std::size_t scratch_bytes(const SdpaKey& key) {
  if (!key.backward) return 0;
  const auto rows = static_cast<std::size_t>(key.B * key.Hq * key.Tq);
  return align_up(rows * sizeof(float)) + align_up(rows * static_cast<std::size_t>(key.D) * 4);
}

// Builds the backend descriptors of every tensor and operation of the graph and the operation graph
// over them, and finalizes them all, with no cuDNN handle (cuDNN 9 allows this; engine heuristics
// and plans need a device). Returns the number of descriptors finalized. Lets the CPU tests check
// attribute names, types and counts, the shapes cuDNN checks per operation, and that the ops form
// one graph.
int finalize_graph_without_device(const SdpaKey& key);

// Deviceless planning (cuDNN >= 9.8): runs cuDNN's engine heuristics for a device described by
// `device_json` (a CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION) and tries to finalize an execution
// plan from each engine config offered, with no GPU. cuDNN's fused attention comes from its
// runtime-fusion engines, which generate and compile (NVRTC) a kernel for the graph at plan
// finalize and then load it with the driver: with no driver they are skipped (status
// NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING), and with the toolkit's stub libcuda loaded they get
// as far as loading (EXECUTION_FAILED_CUDA_DRIVER), which shows cuDNN accepted and compiled the
// graph for that device. Never throws for an unsupported graph: it reports what happened.
struct DevicelessPlan {
  int heuristics_mode = -1;     // cudnnBackendHeurMode_t of the configs below (A, else FALLBACK)
  int configs = 0;              // engine configs the heuristics offered
  int finalized = 0;            // plans finalized (only possible with a working driver)
  int compiled_not_loaded = 0;  // plans that failed only at loading the kernel (stub driver)
  std::int64_t workspace = -1;  // workspace of the first finalized plan
  std::string summary;          // per-mode, per-config statuses, for messages
};
DevicelessPlan plan_without_device(const SdpaKey& key, const std::string& device_json);
// The same for a given graph (tests use it to try variants of build_graph's graph).
DevicelessPlan plan_without_device(const SdpaKey& key, const GraphSpec& graph,
                                   const std::string& device_json);

#if defined(KILN_CUDA)
// Total device workspace for `key`: cuDNN's plan workspace (aligned up) + scratch_bytes. Builds and
// caches the plan on first use (needs a device; the current device must be key.device).
std::size_t workspace_bytes(const SdpaKey& key);

// Forward. q, o: (B, Tq, Hq, D); k, v: (B, Tk, Hkv, D) with batch stride key.kv_batch_stride;
// stats: (B, Hq, Tq) f32 (kiln's lse). All pointers 16-byte aligned. workspace: at least
// workspace_bytes(key), 256-byte aligned.
void forward(const SdpaKey& key, const void* q, const void* k, const void* v, void* o, float* stats,
             void* workspace, std::size_t workspace_size, StreamHandle stream);

// Backward (key.backward, Tq == Tk, q_offset 0, dense k/v). dq like q; dk, dv like k.
void backward(const SdpaKey& key, const void* q, const void* k, const void* v, const void* o,
              const float* stats, const void* dout, void* dq, void* dk, void* dv, void* workspace,
              std::size_t workspace_size, StreamHandle stream);

// Number of cached plans, and of kernel caches (decode families) (for tests).
std::size_t cached_plans();
std::size_t cached_kernel_families();
#endif

}  // namespace kiln::cuda::cudnn_sdpa
