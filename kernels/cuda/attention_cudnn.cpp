// cuDNN fused attention through the v9 backend graph API: the graph's descriptors, the plans and
// their cache, and the launches. See attention_cudnn.h for the math, the graph and the layouts;
// the key, its validation, the layouts and the graph as data are in attention_cudnn_graph.cpp.
// Host code only (no kernels of ours): a .cpp compiled into kiln_kernels_cuda with the CUDA
// include directories.
//
// Descriptor lifetime: every tensor, operation, graph, engine config and plan descriptor of a
// cached plan is owned by that plan and kept alive with it. Cached plans are never destroyed at
// exit (the cache is leaked on purpose), like the library handles in runtime.cu, since destroying
// them from a static destructor races with the CUDA runtime's teardown.
#include "kernels/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "kernels/common/error.h"

static_assert(CUDNN_MAJOR >= 9, "[attention_cudnn] needs the cuDNN 9 backend graph API");

namespace kiln::cuda::cudnn_sdpa {

// ---- the cuDNN version --------------------------------------------------------------------------

namespace {
std::string version_str(int v) {
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}
}  // namespace

void check_cudnn_version(int loaded, const std::string& where) {
  KILN_CHECK(loaded >= kMinCudnnVersion && loaded / 10000 == CUDNN_MAJOR,
             "[attention_cudnn] the loaded cuDNN is {}{}; the attention graph needs cuDNN >= {} "
             "and < {}.0.0 (kiln was built against {}): put a cuDNN 9 first on LD_LIBRARY_PATH",
             version_str(loaded), where.empty() ? "" : fmt::format(" ({})", where),
             version_str(kMinCudnnVersion), CUDNN_MAJOR + 1, version_str(CUDNN_VERSION));
}

// ---- backend descriptors ------------------------------------------------------------------------

namespace {

// Sets one attribute; the failing call (descriptor, attribute name, type) is in the message.
#define SDPA_SET(desc, attr, type, count, ptr) \
  KILN_CUDNN_CHECK(cudnnBackendSetAttribute((desc).get(), attr, type, count, ptr))

class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) {
    KILN_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* ptr() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

cudnnDataType_t to_cudnn(ElemType t) {
  switch (t) {
    case ElemType::F32:
      return CUDNN_DATA_FLOAT;
    case ElemType::BF16:
      return CUDNN_DATA_BFLOAT16;
    case ElemType::F16:
      return CUDNN_DATA_HALF;
    case ElemType::I32:
      return CUDNN_DATA_INT32;
    case ElemType::Bool:
      return CUDNN_DATA_BOOLEAN;
  }
  fail("[attention_cudnn] unknown element type");
}

cudnnPointwiseMode_t to_cudnn(PwMode m) {
  switch (m) {
    case PwMode::Add:
      return CUDNN_POINTWISE_ADD;
    case PwMode::Sub:
      return CUDNN_POINTWISE_SUB;
    case PwMode::Mul:
      return CUDNN_POINTWISE_MUL;
    case PwMode::Div:
      return CUDNN_POINTWISE_DIV;
    case PwMode::Exp:
      return CUDNN_POINTWISE_EXP;
    case PwMode::Log:
      return CUDNN_POINTWISE_LOG;
    case PwMode::Identity:
      return CUDNN_POINTWISE_IDENTITY;
    case PwMode::GenIndex:
      return CUDNN_POINTWISE_GEN_INDEX;
    case PwMode::CmpGe:
      return CUDNN_POINTWISE_CMP_GE;
    case PwMode::Select:
      return CUDNN_POINTWISE_BINARY_SELECT;
  }
  fail("[attention_cudnn] unknown pointwise mode");
}

// Number of inputs a pointwise mode takes (the x, b, t ports).
std::size_t pointwise_arity(PwMode m) {
  switch (m) {
    case PwMode::Exp:
    case PwMode::Log:
    case PwMode::Identity:
    case PwMode::GenIndex:
      return 1;
    case PwMode::Select:
      return 3;
    default:
      return 2;
  }
}

Desc make_tensor(const TensorSpec& t) {
  Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const cudnnDataType_t dt = to_cudnn(t.type);
  const std::int64_t id = t.uid, alignment = 16;
  const bool is_virtual = t.is_virtual, by_value = t.by_value;
  SDPA_SET(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  SDPA_SET(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.layout.dims.data());
  SDPA_SET(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.layout.strides.data());
  SDPA_SET(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
  SDPA_SET(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  SDPA_SET(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) SDPA_SET(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  KILN_CUDNN_CHECK(cudnnBackendFinalize(d.get()));
  return d;
}

// Descriptors of one graph's tensors and operations, finalized; they stay alive together.
struct BuiltOps {
  std::unordered_map<std::int64_t, Desc> tensors;
  std::vector<Desc> helpers;  // pointwise / matmul / reduction descriptors the ops point to
  std::vector<Desc> ops;
  int finalized = 0;
};

// Points attribute `attr` of `desc` at another descriptor.
#define SDPA_SET_DESC(desc, attr, value)                              \
  do {                                                                \
    cudnnBackendDescriptor_t sdpa_v_ = (value);                       \
    SDPA_SET(desc, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sdpa_v_); \
  } while (0)

void build_op(const OpSpec& op, BuiltOps& b) {
  auto tensor = [&b](std::int64_t id) {
    auto it = b.tensors.find(id);
    KILN_CHECK(it != b.tensors.end(), "[attention_cudnn] op reads unknown tensor uid {}", id);
    return it->second.get();
  };
  const std::size_t arity = op.kind == OpKind::Pointwise ? pointwise_arity(op.pw)
                            : op.kind == OpKind::Matmul  ? 2
                                                         : 1;
  KILN_CHECK(op.inputs.size() == arity, "[attention_cudnn] op '{}' has {} inputs, needs {}",
             op.name, op.inputs.size(), arity);
  const cudnnDataType_t fp32 = CUDNN_DATA_FLOAT;
  Desc helper, o;
  switch (op.kind) {
    case OpKind::Pointwise: {
      helper = Desc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
      const cudnnPointwiseMode_t mode = to_cudnn(op.pw);
      const cudnnDataType_t prec = to_cudnn(op.compute);
      SDPA_SET(helper, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
      SDPA_SET(helper, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
      if (op.axis >= 0) SDPA_SET(helper, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &op.axis);
      KILN_CUDNN_CHECK(cudnnBackendFinalize(helper.get()));
      o = Desc(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, helper.get());
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensor(op.inputs[0]));
      if (arity >= 2) SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensor(op.inputs[1]));
      if (arity >= 3) SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensor(op.inputs[2]));
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensor(op.output));
      break;
    }
    case OpKind::Matmul:
      helper = Desc(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
      SDPA_SET(helper, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &fp32);
      KILN_CUDNN_CHECK(cudnnBackendFinalize(helper.get()));
      o = Desc(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensor(op.inputs[0]));
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensor(op.inputs[1]));
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensor(op.output));
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_MATMUL_DESC, helper.get());
      break;
    case OpKind::Reduction: {
      helper = Desc(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
      const cudnnReduceTensorOp_t mode =
          op.red == RedMode::Max ? CUDNN_REDUCE_TENSOR_MAX : CUDNN_REDUCE_TENSOR_ADD;
      SDPA_SET(helper, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
      SDPA_SET(helper, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &fp32);
      KILN_CUDNN_CHECK(cudnnBackendFinalize(helper.get()));
      o = Desc(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensor(op.inputs[0]));
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensor(op.output));
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, helper.get());
      break;
    }
    case OpKind::Reshape:
      o = Desc(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensor(op.inputs[0]));
      SDPA_SET_DESC(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensor(op.output));
      break;
  }
  KILN_CUDNN_CHECK(cudnnBackendFinalize(o.get()));
  if (helper.get()) {
    b.helpers.push_back(std::move(helper));
    ++b.finalized;
  }
  b.ops.push_back(std::move(o));
  ++b.finalized;
}

// Every tensor and op of `g`, finalized. Errors name the graph, the tensor or op, and (through
// KILN_CUDNN_CHECK's call text) the attribute that failed.
BuiltOps build_ops(const SdpaKey& key, const GraphSpec& g) {
  BuiltOps b;
  for (const TensorSpec& t : g.tensors) {
    try {
      b.tensors.emplace(t.uid, make_tensor(t));
      ++b.finalized;
    } catch (const Error& e) {
      fail("[attention_cudnn] {}: tensor '{}' (uid {}): {}", describe(key), t.name, t.uid,
           e.what());
    }
  }
  for (const OpSpec& op : g.ops) {
    try {
      build_op(op, b);
    } catch (const Error& e) {
      fail("[attention_cudnn] {}: op '{}': {}", describe(key), op.name, e.what());
    }
  }
  return b;
}

}  // namespace

namespace {

// The operation graph over `ops`; the handle is optional (cuDNN 9 finalizes a graph without one,
// which is what lets the CPU tests run this far).
Desc make_graph(const SdpaKey& key, const BuiltOps& b, cudnnHandle_t handle,
                bool dynamic_shape = false) {
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Desc& o : b.ops) ops.push_back(o.get());
  if (handle) SDPA_SET(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  SDPA_SET(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           static_cast<std::int64_t>(ops.size()), ops.data());
  if (dynamic_shape) {
    const bool on = true;
    SDPA_SET(graph, CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED, CUDNN_TYPE_BOOLEAN, 1, &on);
  }
  const cudnnStatus_t gs = cudnnBackendFinalize(graph.get());
  KILN_CHECK(gs == CUDNN_STATUS_SUCCESS,
             "[attention_cudnn] cuDNN rejected the {} attention graph ({}): finalize of the "
             "operation graph: {}",
             key.backward ? "backward" : "forward", describe(key), cudnnGetErrorString(gs));
  return graph;
}

}  // namespace

int finalize_graph_without_device(const SdpaKey& key) {
  const GraphSpec g = build_graph(key);
  BuiltOps b = build_ops(key, g);
  Desc graph = make_graph(key, b, nullptr);
  return b.finalized + 1;
}

// ---- plans --------------------------------------------------------------------------------------

namespace {

// Where a plan is made for: the current device's cuDNN handle, or (deviceless, cuDNN >= 9.8) a
// device-properties descriptor.
struct Target {
  cudnnHandle_t handle = nullptr;
  cudnnBackendDescriptor_t device_prop = nullptr;
  cudnnBackendDescriptor_t kernel_cache = nullptr;  // a decode family's (dynamic shapes only)
};

struct Chosen {
  std::vector<Desc> configs;  // the heuristics' engine configs (the plan references one)
  Desc plan;
  std::int64_t workspace = 0;
};

// What one heuristics query gave: configs offered and the finalize status of each plan tried.
struct Attempt {
  int configs = 0;
  std::vector<cudnnStatus_t> statuses;
  std::string summary;
};

// Asks cuDNN's heuristics (`mode`) for engine configs and finalizes a plan from each in turn until
// one succeeds (`stop_at_first`) or all were tried. Returns true when a plan finalized; `out` then
// holds it.
bool try_heuristics(const Target& target, cudnnBackendDescriptor_t graph,
                    cudnnBackendHeurMode_t mode, bool stop_at_first, Chosen& out,
                    Attempt& attempt) {
  attempt.summary += fmt::format(" heuristics mode {}:", static_cast<int>(mode));
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  SDPA_SET(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  SDPA_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (target.device_prop) {
    SDPA_SET(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
             &target.device_prop);
  }
  const cudnnStatus_t hs = cudnnBackendFinalize(heur.get());
  if (hs != CUDNN_STATUS_SUCCESS) {
    attempt.summary += fmt::format(" finalize {};", cudnnGetErrorString(hs));
    return false;
  }
  std::int64_t count = 0;
  KILN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(cfgs.back().get());
  }
  std::int64_t got = 0;
  if (count > 0) {
    KILN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                              raw.data()));
  }
  got = std::min(got, count);
  attempt.configs = static_cast<int>(got);
  attempt.summary += fmt::format(" {} configs", got);
  bool ok = false;
  for (std::int64_t i = 0; i < got; ++i) {
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t cfg = raw[static_cast<std::size_t>(i)];
    if (target.handle) {
      SDPA_SET(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle);
    } else {
      SDPA_SET(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
               &target.device_prop);
    }
    SDPA_SET(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (target.kernel_cache) {
      SDPA_SET(plan, CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
               &target.kernel_cache);
    }
    const cudnnStatus_t ps = cudnnBackendFinalize(plan.get());
    attempt.statuses.push_back(ps);
    attempt.summary += fmt::format(" [{}]", cudnnGetErrorString(ps));
    if (ps != CUDNN_STATUS_SUCCESS || ok) continue;
    std::int64_t n = 0, ws = 0;
    KILN_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, &n, &ws));
    out.plan = std::move(plan);
    out.workspace = ws;
    ok = true;
    if (stop_at_first) break;
  }
  attempt.summary += ";";
  if (ok) out.configs = std::move(cfgs);
  return ok;
}

Chosen choose_plan(const SdpaKey& key, const Target& target, cudnnBackendDescriptor_t graph) {
  Chosen c;
  Attempt a, fallback;
  if (!try_heuristics(target, graph, CUDNN_HEUR_MODE_A, true, c, a) &&
      !try_heuristics(target, graph, CUDNN_HEUR_MODE_FALLBACK, true, c, fallback)) {
    fail(
        "[attention_cudnn] no cuDNN {} engine for this attention graph ({}):{}{} cuDNN {} (the "
        "fused attention engines compile kernels at plan time: they need NVRTC and the driver)",
        key.backward ? "backward" : "forward", describe(key), a.summary, fallback.summary,
        cudnnGetVersion());
  }
  return c;
}

struct Plan {
  SdpaKey key;
  GraphSpec spec;  // by-value scalars live here: the variant pack points at them
  BuiltOps ops;
  Desc graph;
  Chosen chosen;
};

// A decode family's kernel cache, bound to the first graph of the family (cuDNN >= 9.5).
Desc make_kernel_cache(cudnnBackendDescriptor_t first_graph) {
  Desc cache(CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR);
  SDPA_SET(cache, CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
           &first_graph);
  KILN_CUDNN_CHECK(cudnnBackendFinalize(cache.get()));
  return cache;
}

// A plan for `key`. With `kernel_cache` (a decode family's), or with `made` (the family's first
// shape: a new kernel cache is made from this plan's graph into *made), the graph is a
// dynamic-shape graph and the plan binds the family's cached kernel (compiling it the first
// time); with neither, a plain plan of its own.
std::unique_ptr<Plan> build_plan(const SdpaKey& key, cudnnBackendDescriptor_t kernel_cache,
                                 std::unique_ptr<Desc>* made = nullptr) {
  auto p = std::make_unique<Plan>();
  p->key = key;
  p->spec = build_graph(key);
  p->ops = build_ops(key, p->spec);
  Target target;
  target.handle = cudnn_handle();
  p->graph = make_graph(key, p->ops, target.handle, kernel_cache != nullptr || made != nullptr);
  if (made) {
    *made = std::make_unique<Desc>(make_kernel_cache(p->graph.get()));
    kernel_cache = (*made)->get();
  }
  target.kernel_cache = kernel_cache;
  p->chosen = choose_plan(key, target, p->graph.get());
  return p;
}

}  // namespace

DevicelessPlan plan_without_device(const SdpaKey& key, const std::string& device_json) {
  return plan_without_device(key, build_graph(key), device_json);
}

DevicelessPlan plan_without_device(const SdpaKey& key, const GraphSpec& g,
                                   const std::string& device_json) {
  KILN_CHECK(cudnnGetVersion() >= 90800,
             "[attention_cudnn] deviceless planning needs cuDNN >= 9.8, have {}",
             cudnnGetVersion());
  BuiltOps b = build_ops(key, g);
  Desc graph = make_graph(key, b, nullptr);
  Desc prop(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  SDPA_SET(prop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
           static_cast<std::int64_t>(device_json.size()), device_json.data());
  KILN_CUDNN_CHECK(cudnnBackendFinalize(prop.get()));
  Target target;
  target.device_prop = prop.get();
  DevicelessPlan out;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Chosen c;
    Attempt a;
    const bool ok = try_heuristics(target, graph.get(), mode, false, c, a);
    out.summary += a.summary;
    if (a.configs == 0) continue;
    out.heuristics_mode = static_cast<int>(mode);
    out.configs = a.configs;
    for (cudnnStatus_t st : a.statuses) {
      out.finalized += st == CUDNN_STATUS_SUCCESS;
      out.compiled_not_loaded += st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
    }
    if (ok) out.workspace = c.workspace;
    break;
  }
  return out;
}

namespace {

struct KeyHash {
  std::size_t operator()(const SdpaKey& k) const { return hash_key(k); }
};

// Bounded plan cache: decode with a growing cache makes a new key per step (Tk grows), so the
// oldest plans are dropped past kMaxPlans. Plans are shared_ptr so one in use survives eviction.
// Kernel caches, one per decode family (shape_family), are few and kept; a family whose dynamic
// graph cuDNN refused is remembered as static (nullptr), so it is not tried again.
constexpr std::size_t kMaxPlans = 256;
struct Family {
  std::unique_ptr<Desc> kernel_cache;  // null: plan each shape on its own
  std::shared_ptr<Plan> first_plan;    // its graph is the one the kernel cache was made for
};
struct PlanCache {
  std::mutex mutex;
  std::unordered_map<SdpaKey, std::shared_ptr<Plan>, KeyHash> plans;
  std::list<SdpaKey> order;  // insertion order, oldest first
  std::unordered_map<SdpaKey, Family, KeyHash> families;
};
PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache;  // leaked on purpose (see the file comment)
  return *cache;
}

// The loaded library's file, for version messages.
std::string cudnn_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudnnGetVersion), &info) != 0 && info.dli_fname)
    return info.dli_fname;
  return "";
}

// A plan for `key`, through its family's kernel cache where that applies (caller holds the
// cache's mutex).
std::shared_ptr<Plan> plan_for(PlanCache& c, const SdpaKey& key) {
  const int version = static_cast<int>(cudnnGetVersion());
  if (!uses_kernel_cache(key, version)) return build_plan(key, nullptr);
  const SdpaKey fkey = shape_family(key);
  auto it = c.families.find(fkey);
  if (it == c.families.end()) {
    // The family's first shape: build its dynamic graph, bind a kernel cache to it, and plan it
    // (this compiles the kernel). Any refusal makes the family static, with one note.
    Family fam;
    try {
      fam.first_plan = build_plan(key, nullptr, &fam.kernel_cache);
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "kiln: [attention_cudnn] cuDNN %s refused a dynamic-shape decode graph (%s): "
                   "planning each KV length on its own (one kernel compile per step): %s\n",
                   version_str(version).c_str(), describe(fkey).c_str(), e.what());
      fam = Family{};
    }
    it = c.families.emplace(fkey, std::move(fam)).first;
    if (it->second.first_plan) return it->second.first_plan;
  }
  return build_plan(key, it->second.kernel_cache ? it->second.kernel_cache->get() : nullptr);
}

std::shared_ptr<Plan> get_plan(const SdpaKey& key) {
  validate(key);
  KILN_CHECK(current_device() == key.device,
             "[attention_cudnn] plan for cuda:{} requested while cuda:{} is current", key.device,
             current_device());
  static const bool version_ok = [] {
    check_cudnn_version(static_cast<int>(cudnnGetVersion()), cudnn_library_path());
    return true;
  }();
  (void)version_ok;
  PlanCache& c = plan_cache();
  std::lock_guard lock(c.mutex);
  if (auto it = c.plans.find(key); it != c.plans.end()) return it->second;
  std::shared_ptr<Plan> p = plan_for(c, key);
  while (c.plans.size() >= kMaxPlans && !c.order.empty()) {
    c.plans.erase(c.order.front());
    c.order.pop_front();
  }
  c.plans.emplace(key, p);
  c.order.push_back(key);
  return p;
}

void check_aligned(const void* p, const char* what) {
  KILN_CHECK(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 16 == 0,
             "[attention_cudnn] {} pointer {} is not 16-byte aligned (cuDNN's tensors are declared "
             "with 16-byte alignment)",
             what, p);
}

// Binds the plan's non-virtual tensors (device pointers from `bound`, scalars from the plan) and
// runs it on `stream`.
void execute(Plan& p, const std::unordered_map<std::int64_t, void*>& bound, void* workspace,
             StreamHandle stream) {
  std::vector<std::int64_t> uids;
  std::vector<void*> ptrs;
  for (const TensorSpec& t : p.spec.tensors) {
    if (t.is_virtual) continue;
    void* ptr = nullptr;
    if (t.by_value) {
      switch (t.uid) {
        case uid::kScale:
          ptr = &p.spec.scale;
          break;
        case uid::kNegInf:
          ptr = &p.spec.neg_inf;
          break;
        case uid::kOne:
          ptr = &p.spec.one;
          break;
        case uid::kShift:
          ptr = &p.spec.shift;
          break;
        default:
          fail("[attention_cudnn] no value for scalar uid {}", t.uid);
      }
    } else {
      auto it = bound.find(t.uid);
      KILN_CHECK(it != bound.end(), "[attention_cudnn] tensor '{}' (uid {}) is not bound", t.name,
                 t.uid);
      ptr = it->second;
    }
    uids.push_back(t.uid);
    ptrs.push_back(ptr);
  }
  cudnnHandle_t handle = cudnn_handle();
  KILN_CUDNN_CHECK(cudnnSetStream(handle, stream));
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  SDPA_SET(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
           static_cast<std::int64_t>(uids.size()), uids.data());
  SDPA_SET(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<std::int64_t>(ptrs.size()), ptrs.data());
  SDPA_SET(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  KILN_CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  KILN_CUDNN_CHECK(cudnnBackendExecute(handle, p.chosen.plan.get(), pack.get()));
}

std::size_t total_workspace(const Plan& p) {
  return align_up(static_cast<std::size_t>(p.chosen.workspace)) + scratch_bytes(p.key);
}

}  // namespace

std::size_t workspace_bytes(const SdpaKey& key) { return total_workspace(*get_plan(key)); }

std::size_t cached_plans() {
  PlanCache& c = plan_cache();
  std::lock_guard lock(c.mutex);
  return c.plans.size();
}

std::size_t cached_kernel_families() {
  PlanCache& c = plan_cache();
  std::lock_guard lock(c.mutex);
  std::size_t n = 0;
  for (const auto& [k, f] : c.families) n += f.kernel_cache != nullptr;
  return n;
}

void forward(const SdpaKey& key, const void* q, const void* k, const void* v, void* o, float* stats,
             void* workspace, std::size_t workspace_size, StreamHandle stream) {
  KILN_CHECK(!key.backward, "[attention_cudnn] forward called with a backward key");
  std::shared_ptr<Plan> p = get_plan(key);
  check_aligned(q, "q");
  check_aligned(k, "k");
  check_aligned(v, "v");
  check_aligned(o, "out");
  check_aligned(stats, "lse");
  const std::size_t need = total_workspace(*p);
  KILN_CHECK(workspace_size >= need && (need == 0 || workspace != nullptr),
             "[attention_cudnn] workspace of {} bytes, plan needs {}", workspace_size, need);
  execute(*p,
          {{uid::kQ, const_cast<void*>(q)},
           {uid::kK, const_cast<void*>(k)},
           {uid::kV, const_cast<void*>(v)},
           {uid::kO, o},
           {uid::kStats, stats}},
          workspace, stream);
}

void backward(const SdpaKey& key, const void* q, const void* k, const void* v, const void* o,
              const float* stats, const void* dout, void* dq, void* dk, void* dv, void* workspace,
              std::size_t workspace_size, StreamHandle stream) {
  KILN_CHECK(key.backward, "[attention_cudnn] backward called with a forward key");
  std::shared_ptr<Plan> p = get_plan(key);
  const std::pair<const void*, const char*> pointers[] = {
      {q, "q"},       {k, "k"},   {v, "v"},   {o, "out"}, {stats, "lse"},
      {dout, "dout"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}};
  for (const auto& [ptr, name] : pointers) check_aligned(ptr, name);
  const std::size_t need = total_workspace(*p);
  KILN_CHECK(workspace_size >= need && workspace != nullptr,
             "[attention_cudnn] workspace of {} bytes, plan needs {}", workspace_size, need);
  // Our scratch follows cuDNN's workspace: softmax_sum (B*Hq*Tq f32), then dQ_accum.
  auto* base = static_cast<unsigned char*>(workspace);
  const std::size_t rows = static_cast<std::size_t>(key.B * key.Hq * key.Tq);
  unsigned char* softmax_sum = base + align_up(static_cast<std::size_t>(p->chosen.workspace));
  unsigned char* dq_accum = softmax_sum + align_up(rows * sizeof(float));
  // cuDNN >= 9.6 clears the dQ accumulator itself (cudnn-frontend stopped doing it); clearing it
  // here too is cheap next to the attention and keeps older 9.x libraries correct.
  memset_async(dq_accum, 0, rows * static_cast<std::size_t>(key.D) * sizeof(float), stream);
  execute(*p,
          {{uid::kQ, const_cast<void*>(q)},
           {uid::kK, const_cast<void*>(k)},
           {uid::kV, const_cast<void*>(v)},
           {uid::kO, const_cast<void*>(o)},
           {uid::kStats, const_cast<float*>(stats)},
           {uid::kDO, const_cast<void*>(dout)},
           {uid::kDQ, dq},
           {uid::kDK, dk},
           {uid::kDV, dv},
           {uid::kSoftmaxSum, softmax_sum},
           {uid::kDQAccum, dq_accum}},
          workspace, stream);
}

}  // namespace kiln::cuda::cudnn_sdpa
