// cuDNN fused attention: kernels/cuda/attention_cudnn.{h,cpp} and
// tensor/kernels_cuda_attention.cpp (ops::attention under AttentionImpl::Cudnn).
//
// CPU tests (any CUDA build, no GPU needed):
//   - the kiln -> cuDNN dims/strides mapping, checked element by element;
//   - the plan-cache key (equality, hashing, describe) and validate()'s refusals;
//   - the graph as data: ops, uids, wiring, topological order, by-value scalars;
//   - every cuDNN backend descriptor of the forward and backward graphs, and the operation graph
//     over them, finalized with no device (cuDNN checks attribute types and per-op shapes);
//   - deviceless planning, in a child process with the toolkit's stub libcuda: cuDNN's heuristics
//     for an H100 described by device properties offer engine configs for our graphs, and plan
//     finalize gets through kernel generation and NVRTC compilation, failing only at loading the
//     kernel (the stub driver cannot). Skipped when a GPU is present (the GPU tests run instead).
// GPU tests (skipped without a device), bf16, with these thresholds:
//   cuDNN vs kiln's CPU attention (f32 compute on the same bf16 values), normalized MSE
//   nmse = sum (got - want)^2 / sum want^2:
//     out: nmse <= 1e-4 and max |err| <= 2e-2;  lse: max |err| <= 2e-3 (f32 on both sides);
//     dq, dk, dv: nmse <= 1e-3 and max |err| <= 5e-2 * max |want| (cuDNN rounds P and dS to bf16
//     for its matmuls; a wrong mask, scale or GQA mapping gives nmse ~ 1e-1 or worse).
//   cuDNN vs kiln's own CUDA attention (the test suite compares the two): the same thresholds.
#include <gtest/gtest.h>

#include "kernels/cuda/runtime.h"

#if defined(KILN_CUDA)

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"
#include "tensor/ops.h"

namespace kiln {
namespace {

namespace sdpa = ::kiln::cuda::cudnn_sdpa;

sdpa::SdpaKey make_key(bool backward, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                       std::int64_t Hq, std::int64_t Hkv, std::int64_t D, std::int64_t kbs = 0,
                       std::int64_t q_offset = 0) {
  sdpa::SdpaKey k;
  k.backward = backward;
  k.B = B;
  k.Tq = Tq;
  k.Tk = Tk;
  k.Hq = Hq;
  k.Hkv = Hkv;
  k.D = D;
  k.kv_batch_stride = kbs ? kbs : Tk * Hkv * D;
  k.q_offset = q_offset;
  k.scale = 1.0f / std::sqrt(static_cast<float>(D));
  return k;
}

// ---- layouts ------------------------------------------------------------------------------------

TEST(CudnnAttentionHost, LayoutsMapKilnToCudnnDims) {
  // B=2, Tq=5, Tk=7 in a KV cache of capacity 9, Hq=8, Hkv=2, D=16.
  const sdpa::SdpaKey k = make_key(false, 2, 5, 7, 8, 2, 16, 9 * 2 * 16, 2);
  using A = std::array<std::int64_t, 4>;
  EXPECT_EQ(sdpa::q_layout(k).dims, (A{2, 8, 5, 16}));
  EXPECT_EQ(sdpa::q_layout(k).strides, (A{640, 16, 128, 1}));
  EXPECT_EQ(sdpa::kv_layout(k).dims, (A{2, 2, 7, 16}));
  EXPECT_EQ(sdpa::kv_layout(k).strides, (A{288, 16, 32, 1}));
  EXPECT_EQ(sdpa::stats_layout(k).dims, (A{2, 8, 5, 1}));
  EXPECT_EQ(sdpa::stats_layout(k).strides, (A{40, 5, 1, 1}));
  EXPECT_EQ(sdpa::scores_layout(k).dims, (A{2, 8, 5, 7}));
  EXPECT_EQ(sdpa::scores_layout(k).strides, (A{280, 35, 7, 1}));
  const sdpa::Layout4 kt = sdpa::swap_last_two(sdpa::kv_layout(k));
  EXPECT_EQ(kt.dims, (A{2, 2, 16, 7}));
  EXPECT_EQ(kt.strides, (A{288, 16, 1, 32}));

  // Every element: cuDNN's (b, h, t, d) offset is kiln's (b, t, h, d) offset.
  const sdpa::Layout4 ql = sdpa::q_layout(k), kl = sdpa::kv_layout(k);
  for (std::int64_t b = 0; b < k.B; ++b)
    for (std::int64_t t = 0; t < k.Tk; ++t)
      for (std::int64_t d = 0; d < k.D; ++d) {
        for (std::int64_t h = 0; h < k.Hq && t < k.Tq; ++h) {
          const std::int64_t kiln_q = ((b * k.Tq + t) * k.Hq + h) * k.D + d;
          EXPECT_EQ(b * ql.strides[0] + h * ql.strides[1] + t * ql.strides[2] + d * ql.strides[3],
                    kiln_q);
        }
        for (std::int64_t h = 0; h < k.Hkv; ++h) {
          const std::int64_t kiln_k = b * k.kv_batch_stride + (t * k.Hkv + h) * k.D + d;
          EXPECT_EQ(b * kl.strides[0] + h * kl.strides[1] + t * kl.strides[2] + d * kl.strides[3],
                    kiln_k);
          // K^T reads the same element at (b, h, d, t).
          EXPECT_EQ(b * kt.strides[0] + h * kt.strides[1] + d * kt.strides[2] + t * kt.strides[3],
                    kiln_k);
        }
      }
  // lse (B, Hq, Tq) contiguous.
  const sdpa::Layout4 sl = sdpa::stats_layout(k);
  EXPECT_EQ(1 * sl.strides[0] + 3 * sl.strides[1] + 4 * sl.strides[2], (1 * 8 + 3) * 5 + 4);
}

// ---- key ----------------------------------------------------------------------------------------

TEST(CudnnAttentionHost, KeyEqualityHashAndDescribe) {
  const sdpa::SdpaKey base = make_key(false, 2, 64, 64, 8, 2, 64);
  EXPECT_EQ(sdpa::describe(base),
            "fwd bf16 B=2 Tq=64 Tk=64 Hq=8 Hkv=2 D=64 kbs=8192 q_offset=0 scale=0.125 cuda:0");
  sdpa::SdpaKey same = base;
  EXPECT_TRUE(same == base);
  EXPECT_EQ(sdpa::hash_key(same), sdpa::hash_key(base));

  // Each field is part of the key.
  std::vector<sdpa::SdpaKey> variants(13, base);
  variants[0].backward = true;
  variants[1].io = sdpa::IoType::F16;
  variants[2].B = 3;
  variants[3].Tq = 63;
  variants[4].Tk = 65;
  variants[5].Hq = 16;
  variants[6].Hkv = 4;
  variants[7].D = 128;
  variants[8].kv_batch_stride = 9000;
  variants[9].q_offset = 1;
  variants[10].scale = 0.25f;
  variants[11].device = 1;
  variants[12].scale = std::nextafter(0.125f, 1.0f);  // compared bitwise
  struct Hash {
    std::size_t operator()(const sdpa::SdpaKey& k) const { return sdpa::hash_key(k); }
  };
  std::unordered_set<sdpa::SdpaKey, Hash> set{base};
  std::set<std::size_t> hashes{sdpa::hash_key(base)};
  for (const auto& v : variants) {
    EXPECT_FALSE(v == base) << sdpa::describe(v);
    set.insert(v);
    hashes.insert(sdpa::hash_key(v));
  }
  EXPECT_EQ(set.size(), variants.size() + 1);
  EXPECT_EQ(hashes.size(), variants.size() + 1);  // no collisions among these
}

TEST(CudnnAttentionHost, DecodeStepsShareOneKernelFamily) {
  // Decoding one token at a time into a cache of capacity 512: Tk, q_offset (and, at B = 1, the
  // dense kv stride) change every step; the family does not, so the kernel compiles once.
  const sdpa::SdpaKey step1 = make_key(false, 1, 1, 6, 16, 4, 128, 0, 5);
  const sdpa::SdpaKey step2 = make_key(false, 1, 1, 7, 16, 4, 128, 0, 6);
  const sdpa::SdpaKey step9 = make_key(false, 2, 1, 300, 16, 4, 128, 512 * 4 * 128, 299);
  const sdpa::SdpaKey step10 = make_key(false, 2, 1, 301, 16, 4, 128, 512 * 4 * 128, 300);
  EXPECT_FALSE(step1 == step2);  // still separate plans (cheap ones, from the kernel cache)
  EXPECT_TRUE(sdpa::shape_family(step1) == sdpa::shape_family(step2));
  EXPECT_EQ(sdpa::hash_key(sdpa::shape_family(step1)), sdpa::hash_key(sdpa::shape_family(step2)));
  EXPECT_TRUE(sdpa::shape_family(step9) == sdpa::shape_family(step10));
  EXPECT_EQ(sdpa::shape_family(step1).Tk, 0);
  EXPECT_EQ(sdpa::shape_family(step1).q_offset, 0);
  // What the kernel depends on stays in the family: batch, heads, D, dtype, scale, device, Tq.
  sdpa::SdpaKey other = step2;
  for (auto change :
       {+[](sdpa::SdpaKey& k) { k.B = 2; }, +[](sdpa::SdpaKey& k) { k.Tq = 2; },
        +[](sdpa::SdpaKey& k) { k.Hkv = 8; }, +[](sdpa::SdpaKey& k) { k.D = 64; },
        +[](sdpa::SdpaKey& k) { k.io = sdpa::IoType::F16; },
        +[](sdpa::SdpaKey& k) { k.scale = 0.5f; }, +[](sdpa::SdpaKey& k) { k.device = 1; }}) {
    other = step2;
    change(other);
    EXPECT_FALSE(sdpa::shape_family(other) == sdpa::shape_family(step1)) << sdpa::describe(other);
  }
  // Prefill (q_offset 0) and backward keys are their own family, unchanged.
  const sdpa::SdpaKey prefill = make_key(false, 1, 64, 64, 16, 4, 128);
  const sdpa::SdpaKey bwd = make_key(true, 1, 64, 64, 16, 4, 128);
  EXPECT_TRUE(sdpa::shape_family(prefill) == prefill);
  EXPECT_TRUE(sdpa::shape_family(bwd) == bwd);
  // Dynamic shapes with a kernel cache: decode keys only, cuDNN >= 9.5 only.
  EXPECT_TRUE(sdpa::uses_kernel_cache(step1, 90500));
  EXPECT_TRUE(sdpa::uses_kernel_cache(step1, 91900));
  EXPECT_FALSE(sdpa::uses_kernel_cache(step1, 90400));
  EXPECT_FALSE(sdpa::uses_kernel_cache(prefill, 91900));
  EXPECT_FALSE(sdpa::uses_kernel_cache(bwd, 91900));
}

TEST(CudnnAttentionHost, LoadedCudnnVersionIsChecked) {
  EXPECT_NO_THROW(sdpa::check_cudnn_version(sdpa::kMinCudnnVersion));
  EXPECT_NO_THROW(sdpa::check_cudnn_version(cuda::cudnn_version()));  // the one loaded here
  try {
    sdpa::check_cudnn_version(80907, "/opt/old/libcudnn.so.8");
    ADD_FAILURE() << "expected an error for cuDNN 8.9.7";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[attention_cudnn] the loaded cuDNN is 8.9.7 (/opt/old/libcudnn.so.8)", 0),
              0u)
        << msg;
    EXPECT_NE(msg.find("needs cuDNN >= 9.0.0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("LD_LIBRARY_PATH"), std::string::npos) << msg;
  }
  EXPECT_THROW(sdpa::check_cudnn_version(100000), Error);  // a future major: another ABI
}

TEST(CudnnAttentionHost, ValidateRefusesUnsupportedShapes) {
  EXPECT_NO_THROW(sdpa::validate(make_key(false, 2, 64, 64, 8, 2, 64)));
  EXPECT_NO_THROW(sdpa::validate(make_key(false, 2, 1, 300, 16, 4, 128, 512 * 4 * 128, 299)));
  EXPECT_NO_THROW(sdpa::validate(make_key(true, 1, 1024, 1024, 8, 8, 256)));
  auto refused = [](const sdpa::SdpaKey& k, const char* what) {
    try {
      sdpa::validate(k);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("[attention_cudnn]"), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      return;
    }
    ADD_FAILURE() << "accepted " << sdpa::describe(k);
  };
  refused(make_key(false, 2, 8, 8, 6, 4, 64), "not divisible");
  refused(make_key(false, 2, 8, 8, 8, 2, 60), "head dim 60");
  refused(make_key(false, 2, 8, 8, 8, 2, 264), "head dim 264");
  refused(make_key(false, 2, 8, 9, 8, 2, 64, 0, 2), "need keys up to 10");
  refused(make_key(false, 2, 8, 8, 8, 2, 64, 100), "kv batch stride 100");
  refused(make_key(true, 2, 8, 9, 8, 2, 64, 0, 1), "backward needs Tq == Tk");
  refused(make_key(true, 2, 8, 8, 8, 2, 64, 8 * 2 * 64 + 64), "backward needs");
  refused(make_key(false, 0, 8, 8, 8, 2, 64), "empty");
  sdpa::SdpaKey bad_scale = make_key(false, 2, 8, 8, 8, 2, 64);
  bad_scale.scale = std::numeric_limits<float>::quiet_NaN();
  refused(bad_scale, "bad scale");
  bad_scale.scale = 0.0f;
  refused(bad_scale, "bad scale");
  refused(make_key(false, 64, 4096, 4096, 64, 8, 256), "2^31");
}

// ---- the graph as data --------------------------------------------------------------------------

struct Census {
  int matmul = 0, reduction = 0, reshape = 0, pointwise = 0;
  std::vector<std::string> names;
};
Census census(const sdpa::GraphSpec& g) {
  Census c;
  for (const auto& op : g.ops) {
    c.names.push_back(op.name);
    switch (op.kind) {
      case sdpa::OpKind::Matmul:
        ++c.matmul;
        break;
      case sdpa::OpKind::Reduction:
        ++c.reduction;
        break;
      case sdpa::OpKind::Reshape:
        ++c.reshape;
        break;
      case sdpa::OpKind::Pointwise:
        ++c.pointwise;
        break;
    }
  }
  return c;
}

// Every op reads tensors that exist and that are produced earlier (or are graph inputs); every
// virtual tensor is written exactly once and read at least once; uids are unique.
void check_wiring(const sdpa::GraphSpec& g) {
  std::set<std::int64_t> uids, produced, read;
  for (const auto& t : g.tensors) EXPECT_TRUE(uids.insert(t.uid).second) << "dup uid " << t.uid;
  for (const auto& op : g.ops) {
    for (std::int64_t in : op.inputs) {
      const sdpa::TensorSpec& t = g.tensor(in);
      if (t.is_virtual) {
        EXPECT_TRUE(produced.count(in)) << op.name << " reads " << t.name;
      }
      read.insert(in);
    }
    EXPECT_TRUE(produced.insert(op.output).second) << "written twice: " << op.output;
    EXPECT_FALSE(g.tensor(op.output).by_value) << op.name;
  }
  for (const auto& t : g.tensors) {
    if (t.is_virtual) {
      EXPECT_TRUE(produced.count(t.uid)) << t.name;
      EXPECT_TRUE(read.count(t.uid)) << t.name << " is never read";
    }
    if (t.by_value) {
      EXPECT_EQ(t.layout.dims, (std::array<std::int64_t, 4>{1, 1, 1, 1}));
    }
  }
}

TEST(CudnnAttentionHost, ForwardGraph) {
  for (std::int64_t q_offset : {0, 3}) {
    const sdpa::SdpaKey k = make_key(false, 2, 61, 61 + q_offset, 8, 2, 64, 0, q_offset);
    const sdpa::GraphSpec g = sdpa::build_graph(k);
    check_wiring(g);
    const Census c = census(g);
    EXPECT_EQ(c.matmul, 2);
    EXPECT_EQ(c.reduction, 2);  // row max, row sum
    EXPECT_EQ(c.reshape, 0);
    // *scale, gen_row/col_index, [row+q_offset], row>=col, select, sub_max, exp, log, lse, div
    EXPECT_EQ(c.pointwise, q_offset ? 11 : 10);
    EXPECT_EQ(std::count(c.names.begin(), c.names.end(), "row+q_offset"), q_offset ? 1 : 0);
    EXPECT_EQ(g.bound_uids(),
              (std::vector<std::int64_t>{sdpa::uid::kQ, sdpa::uid::kK, sdpa::uid::kV, sdpa::uid::kO,
                                         sdpa::uid::kStats}));
    EXPECT_EQ(g.tensor(sdpa::uid::kK).layout, sdpa::swap_last_two(sdpa::kv_layout(k)));
    EXPECT_EQ(g.tensor(sdpa::uid::kV).layout, sdpa::kv_layout(k));
    EXPECT_EQ(g.tensor(sdpa::uid::kStats).type, sdpa::ElemType::F32);
    EXPECT_EQ(g.tensor(sdpa::uid::kO).type, sdpa::ElemType::BF16);
    EXPECT_EQ(g.ops.front().name, "q@k^T");
    EXPECT_EQ(g.ops.back().name, "p@v");
    EXPECT_EQ(g.ops.back().output, sdpa::uid::kO);
    EXPECT_EQ(g.tensor(g.ops.back().inputs[0]).type,
              sdpa::ElemType::BF16);  // P in I/O type
    EXPECT_FLOAT_EQ(g.scale, 0.125f);
    EXPECT_TRUE(std::isinf(g.neg_inf) && g.neg_inf < 0);
    EXPECT_EQ(g.shift, q_offset);
    for (const auto& op : g.ops) {
      if (op.name == "causal_select") {
        // kept scores where the predicate holds, -inf elsewhere
        ASSERT_EQ(op.inputs.size(), 3u);
        EXPECT_EQ(g.tensor(op.inputs[0]).name, "scaled_scores");
        EXPECT_EQ(op.inputs[1], sdpa::uid::kNegInf);
        EXPECT_EQ(g.tensor(op.inputs[2]).type, sdpa::ElemType::Bool);
      }
      if (op.name == "gen_row_index") {
        EXPECT_EQ(op.axis, 2);
      }
      if (op.name == "gen_col_index") {
        EXPECT_EQ(op.axis, 3);
      }
      if (op.name == "lse=max+log") {
        EXPECT_EQ(op.output, sdpa::uid::kStats);
      }
    }
  }
}

TEST(CudnnAttentionHost, BackwardGraph) {
  for (std::int64_t hkv : {8, 2}) {
    const sdpa::SdpaKey k = make_key(true, 2, 100, 100, 8, hkv, 64);
    const sdpa::GraphSpec g = sdpa::build_graph(k);
    check_wiring(g);
    const Census c = census(g);
    EXPECT_EQ(c.matmul, 5);  // q k^T, P^T dO, dO v^T, dS^T q, dS k
    EXPECT_EQ(c.reshape, 3);
    EXPECT_EQ(c.reduction,
              hkv == 8 ? 1 : 3);  // rowsum(dO*O) [+ the GQA group sums]
    using namespace sdpa::uid;
    EXPECT_EQ(g.bound_uids(), (std::vector<std::int64_t>{kQ, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
                                                         kSoftmaxSum, kDQAccum}));
    EXPECT_EQ(g.tensor(kV).layout, sdpa::swap_last_two(sdpa::kv_layout(k)));
    EXPECT_EQ(g.tensor(kDK).layout, sdpa::kv_layout(k));
    EXPECT_EQ(g.tensor(kDQ).layout, sdpa::q_layout(k));
    EXPECT_EQ(g.tensor(kDQAccum).type, sdpa::ElemType::F32);
    EXPECT_EQ(g.tensor(kSoftmaxSum).layout, sdpa::stats_layout(k));
    EXPECT_EQ(g.ops.back().name, "dq=dq_accum");
  }
  // Scratch: softmax_sum (B*Hq*Tq f32) and dQ accumulator (B*Hq*Tq*D f32), 256-aligned.
  EXPECT_EQ(sdpa::scratch_bytes(make_key(false, 2, 100, 100, 8, 2, 64)), 0u);
  EXPECT_EQ(sdpa::scratch_bytes(make_key(true, 2, 100, 100, 8, 2, 64)), 6400u + 409600u);
  EXPECT_EQ(sdpa::scratch_bytes(make_key(true, 1, 3, 3, 1, 1, 8)), 256u + 256u);
}

// ---- cuDNN descriptors without a device ---------------------------------------------------------

TEST(CudnnAttentionHost, DescriptorsFinalizeWithoutDevice) {
  const sdpa::SdpaKey keys[] = {
      make_key(false, 2, 61, 61, 8, 8, 64),
      make_key(false, 2, 3, 67, 8, 2, 128, 80 * 2 * 128,
               64),  // decode into a cache view
      make_key(false, 2, 1, 300, 16, 4, 128, 0, 299),
      make_key(true, 2, 61, 61, 8, 8, 64),
      make_key(true, 1, 200, 200, 8, 2, 128),
  };
  for (const auto& k : keys) {
    const sdpa::GraphSpec g = sdpa::build_graph(k);
    std::size_t non_reshape = 0;
    for (const auto& op : g.ops) non_reshape += op.kind != sdpa::OpKind::Reshape;
    // tensors + ops + their pointwise/matmul/reduction descriptors + the operation graph
    const std::size_t want = g.tensors.size() + g.ops.size() + non_reshape + 1;
    int got = 0;
    ASSERT_NO_THROW(got = sdpa::finalize_graph_without_device(k)) << sdpa::describe(k);
    EXPECT_EQ(static_cast<std::size_t>(got), want) << sdpa::describe(k);
  }
}

// An H100 SXM as cuDNN's device-properties JSON (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, cuDNN
// 9.8+): nominal values from the card's specifications. Only the heuristics read it.
constexpr const char* kH100Json = R"({"maxGridSize":[2147483647,65535,65535],
 "maxBlockSize":[1024,1024,64],"regsPerBlock":65536,"multiProcessorCount":132,"warpSize":32,
 "maxSharedMemoryPerBlock":49152,"maxSharedMemoryPerBlockOptin":232448,
 "reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,"maxCtasPerSM":32,
 "maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"pciDeviceId":0,"isTccDriver":0,
 "supportCoopLaunch":1,"totalGlobalMem":85029158912,"smClockRateKHz":1980000,
 "memClockRateKHz":2619000,"l2CacheSize":52428800,"cudaDeviceId":0,"deviceVer":900,
 "driverVer":13000,"deviceName":"NVIDIA H100 80GB HBM3"})";

std::string stub_libcuda() {
  if (const char* env = std::getenv("KILN_CUDA_STUB_LIBCUDA")) return env;
  for (const char* p : {"/usr/local/cuda/lib64/stubs/libcuda.so",
                        "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so"})
    if (std::filesystem::exists(p)) return p;
  return {};
}

// Child process body: load the stub driver under its soname (libcuda.so.1), then plan each key for
// the H100 description. Exit 0 when every graph got at least one engine config that cuDNN compiled
// (or finalized), 1 otherwise (with the summary on stderr).
[[noreturn]] void deviceless_child(const std::string& stub,
                                   const std::vector<sdpa::SdpaKey>& keys) {
  if (!dlopen(stub.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    std::fprintf(stderr, "dlopen %s: %s\n", stub.c_str(), dlerror());
    _exit(2);
  }
  int bad = 0;
  for (const auto& k : keys) {
    try {
      const sdpa::DevicelessPlan p = sdpa::plan_without_device(k, kH100Json);
      if (p.configs == 0 || p.finalized + p.compiled_not_loaded == 0) {
        std::fprintf(stderr, "%s: no engine compiled:%s\n", sdpa::describe(k).c_str(),
                     p.summary.c_str());
        ++bad;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", sdpa::describe(k).c_str(), e.what());
      ++bad;
    }
  }
  std::fflush(stderr);
  _exit(bad ? 1 : 0);
}

TEST(CudnnAttentionHost, DevicelessPlansCompileForH100) {
  if (cuda::device_count() > 0)
    // [expected-skip]: scripts/gpu_check.sh does not count this skip as a CUDA test that failed
    // to run on a GPU machine; it is meant to skip there.
    GTEST_SKIP() << "[expected-skip] a CUDA device is present: the GPU tests plan and run for real";
  if (cuda::cudnn_version() < 90800)
    GTEST_SKIP() << "deviceless planning needs cuDNN >= 9.8, have " << cuda::cudnn_version();
  const std::string stub = stub_libcuda();
  if (stub.empty())
    GTEST_SKIP()
        << "no stub libcuda (set KILN_CUDA_STUB_LIBCUDA to the toolkit's lib64/stubs/libcuda.so)";
  // GQA forward decoding into a cache view, and GQA backward (each ~5 s of NVRTC on 2 cores).
  const std::vector<sdpa::SdpaKey> keys = {make_key(false, 2, 3, 67, 8, 2, 128, 80 * 2 * 128, 64),
                                           make_key(true, 2, 200, 200, 8, 2, 64)};
  // The stub must not leak into this process (it would stand in for a real driver).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(deviceless_child(stub, keys), ::testing::ExitedWithCode(0), "");
}

// ---- GPU ----------------------------------------------------------------------------------------

#define REQUIRE_GPU()                                                       \
  do {                                                                      \
    if (cuda::device_count() == 0)                                          \
      GTEST_SKIP() << "no CUDA device: cuDNN attention runs only on a GPU " \
                      "(the host-side "                                     \
                      "tests above cover the graph and descriptors)";       \
  } while (0)

struct ImplScope {
  ops::AttentionImpl prev;
  explicit ImplScope(ops::AttentionImpl impl) : prev(ops::attention_impl()) {
    ops::set_attention_impl(impl);
  }
  ~ImplScope() { ops::set_attention_impl(prev); }
};

// bf16 values in [lo, hi], as a CPU f32 tensor holding exactly those values.
Tensor rand_bf16_values(const Shape& shape, std::uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(static_cast<float>(lo), static_cast<float>(hi));
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(g);
  return ops::from_vector(v, shape, DType::F32).to(DType::BF16).to(DType::F32);
}
Tensor to_gpu_bf16(const Tensor& t) { return t.to(Device::cuda(0), DType::BF16); }
Tensor to_cpu_f32(const Tensor& t) { return t.to(Device::cpu(), DType::F32); }

struct Diff {
  double nmse = 0, max_abs = 0, want_max = 0;
  bool finite = true;
};
Diff diff(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = to_cpu_f32(got).to_double_vector();
  const std::vector<double> b = to_cpu_f32(want).to_double_vector();
  EXPECT_EQ(a.size(), b.size());
  Diff d;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!std::isfinite(a[i])) d.finite = false;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
    d.max_abs = std::max(d.max_abs, std::abs(a[i] - b[i]));
    d.want_max = std::max(d.want_max, std::abs(b[i]));
  }
  d.nmse = den > 0 ? num / den : num;
  return d;
}

#define EXPECT_OUT_CLOSE(got, want, what)          \
  do {                                             \
    const Diff d_ = diff(got, want);               \
    EXPECT_TRUE(d_.finite) << what << ": NaN/Inf"; \
    EXPECT_LE(d_.nmse, 1e-4) << what;              \
    EXPECT_LE(d_.max_abs, 2e-2) << what;           \
  } while (0)
#define EXPECT_LSE_CLOSE(got, want, what)          \
  do {                                             \
    const Diff d_ = diff(got, want);               \
    EXPECT_TRUE(d_.finite) << what << ": NaN/Inf"; \
    EXPECT_LE(d_.max_abs, 2e-3) << what;           \
  } while (0)
#define EXPECT_GRAD_CLOSE(got, want, what)             \
  do {                                                 \
    const Diff d_ = diff(got, want);                   \
    EXPECT_TRUE(d_.finite) << what << ": NaN/Inf";     \
    EXPECT_LE(d_.nmse, 1e-3) << what;                  \
    EXPECT_LE(d_.max_abs, 5e-2 * d_.want_max) << what; \
  } while (0)

struct CudnnCase {
  std::int64_t B, T, Hq, Hkv, D;
};
std::string name(const CudnnCase& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " Hq=" + std::to_string(c.Hq) +
         " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D);
}
std::vector<CudnnCase> training_cases() {
  std::vector<CudnnCase> cases;
  for (std::int64_t D : {64, 128})
    for (std::int64_t T : {64, 200, 1024})
      for (std::int64_t ratio : {1, 4}) cases.push_back({T == 1024 ? 1 : 2, T, 8, 8 / ratio, D});
  return cases;
}

TEST(CudnnAttentionGpu, ForwardBackwardMatchCpu) {
  REQUIRE_GPU();
  ImplScope impl(ops::AttentionImpl::Cudnn);
  std::uint64_t seed = 1000;
  for (const CudnnCase& c : training_cases()) {
    SCOPED_TRACE(name(c));
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    // q in [-2, 2] makes the softmax peaky enough to exercise the max subtraction.
    Tensor q = rand_bf16_values({c.B, c.T, c.Hq, c.D}, ++seed, -2, 2);
    Tensor k = rand_bf16_values({c.B, c.T, c.Hkv, c.D}, ++seed);
    Tensor v = rand_bf16_values({c.B, c.T, c.Hkv, c.D}, ++seed);
    Tensor dout = rand_bf16_values({c.B, c.T, c.Hq, c.D}, ++seed);
    auto [o_ref, lse_ref] = ops::attention(q, k, v, scale, 0);  // CPU, f32
    auto [dq_ref, dk_ref, dv_ref] = ops::attention_backward(q, k, v, o_ref, lse_ref, dout, scale);

    Tensor qg = to_gpu_bf16(q), kg = to_gpu_bf16(k), vg = to_gpu_bf16(v);
    auto [o, lse] = ops::attention(qg, kg, vg, scale, 0);
    ASSERT_EQ(o.dtype(), DType::BF16);
    ASSERT_EQ(lse.dtype(), DType::F32);
    EXPECT_OUT_CLOSE(o, o_ref, "out");
    EXPECT_LSE_CLOSE(lse, lse_ref, "lse");
    auto [dq, dk, dv] = ops::attention_backward(qg, kg, vg, o, lse, to_gpu_bf16(dout), scale);
    EXPECT_GRAD_CLOSE(dq, dq_ref, "dq");
    EXPECT_GRAD_CLOSE(dk, dk_ref, "dk");
    EXPECT_GRAD_CLOSE(dv, dv_ref, "dv");
  }
}

TEST(CudnnAttentionGpu, DecodeIntoKvCacheViewMatchesCpu) {
  REQUIRE_GPU();
  ImplScope impl(ops::AttentionImpl::Cudnn);
  const std::int64_t B = 2, Hq = 8, Hkv = 2, D = 128, Tmax = 96;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Tensor kc = rand_bf16_values({B, Tmax, Hkv, D}, 7), vc = rand_bf16_values({B, Tmax, Hkv, D}, 8);
  Tensor kcg = to_gpu_bf16(kc), vcg = to_gpu_bf16(vc);
  struct Step {
    std::int64_t Tq, Tk, q_offset;
  };
  // Decode (Tq = 1), a short prefill chunk, and an offset below Tk - Tq (keys past the last query's
  // position are masked).
  for (const Step s : {Step{1, 70, 69}, Step{3, 41, 38}, Step{3, 50, 20}}) {
    SCOPED_TRACE("Tq=" + std::to_string(s.Tq) + " Tk=" + std::to_string(s.Tk) +
                 " q_offset=" + std::to_string(s.q_offset));
    Tensor q = rand_bf16_values({B, s.Tq, Hq, D}, 9 + s.Tk, -2, 2);
    auto [o_ref, lse_ref] =
        ops::attention(q, kc.narrow(1, 0, s.Tk), vc.narrow(1, 0, s.Tk), scale, s.q_offset);
    Tensor kv_k = kcg.narrow(1, 0, s.Tk), kv_v = vcg.narrow(1, 0, s.Tk);
    ASSERT_FALSE(kv_k.is_contiguous());  // batch stride Tmax*Hkv*D: passed to cuDNN as is
    auto [o, lse] = ops::attention(to_gpu_bf16(q), kv_k, kv_v, scale, s.q_offset);
    EXPECT_OUT_CLOSE(o, o_ref, "out");
    EXPECT_LSE_CLOSE(lse, lse_ref, "lse");
  }
}

TEST(CudnnAttentionGpu, MatchesKilnCudaAttention) {
  REQUIRE_GPU();
  std::uint64_t seed = 2000;
  for (const CudnnCase& c : {CudnnCase{2, 200, 8, 2, 64}, CudnnCase{1, 1024, 8, 8, 128}}) {
    SCOPED_TRACE(name(c));
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    Tensor q = to_gpu_bf16(rand_bf16_values({c.B, c.T, c.Hq, c.D}, ++seed, -2, 2));
    Tensor k = to_gpu_bf16(rand_bf16_values({c.B, c.T, c.Hkv, c.D}, ++seed));
    Tensor v = to_gpu_bf16(rand_bf16_values({c.B, c.T, c.Hkv, c.D}, ++seed));
    Tensor dout = to_gpu_bf16(rand_bf16_values({c.B, c.T, c.Hq, c.D}, ++seed));
    Tensor o_k, lse_k, dq_k, dk_k, dv_k;
    {
      ImplScope impl(ops::AttentionImpl::Kiln);
      std::tie(o_k, lse_k) = ops::attention(q, k, v, scale, 0);
      std::tie(dq_k, dk_k, dv_k) = ops::attention_backward(q, k, v, o_k, lse_k, dout, scale);
    }
    ImplScope impl(ops::AttentionImpl::Cudnn);
    auto [o, lse] = ops::attention(q, k, v, scale, 0);
    auto [dq, dk, dv] = ops::attention_backward(q, k, v, o, lse, dout, scale);
    EXPECT_OUT_CLOSE(o, o_k, "out");
    EXPECT_LSE_CLOSE(lse, lse_k, "lse");
    EXPECT_GRAD_CLOSE(dq, dq_k, "dq");
    EXPECT_GRAD_CLOSE(dk, dk_k, "dk");
    EXPECT_GRAD_CLOSE(dv, dv_k, "dv");
  }
}

// f32 has no cuDNN path: under --attention cudnn it runs kiln's kernel (the table keeps kiln's f32
// entry), so the result is kiln's to the bit and no cuDNN plan is made for it.
TEST(CudnnAttentionGpu, PlansAreCachedAndF32RunsKilnsKernel) {
  REQUIRE_GPU();
  ImplScope impl(ops::AttentionImpl::Cudnn);
  Tensor q = to_gpu_bf16(rand_bf16_values({1, 32, 4, 64}, 1));
  Tensor k = to_gpu_bf16(rand_bf16_values({1, 32, 4, 64}, 2));
  (void)ops::attention(q, k, k, 0.125, 0);
  const std::size_t plans = sdpa::cached_plans();
  (void)ops::attention(q, k, k, 0.125, 0);
  EXPECT_EQ(sdpa::cached_plans(), plans);  // same key: same plan
  (void)ops::attention(q, k, k, 0.25, 0);
  EXPECT_EQ(sdpa::cached_plans(), plans + 1);  // the scale is part of the key

  Tensor q32 = q.to(DType::F32), k32 = k.to(DType::F32);
  auto [o, lse] = ops::attention(q32, k32, k32, 0.125, 0);
  EXPECT_EQ(sdpa::cached_plans(), plans + 1);
  ImplScope kiln_impl(ops::AttentionImpl::Kiln);
  auto [o_k, lse_k] = ops::attention(q32, k32, k32, 0.125, 0);
  EXPECT_EQ(o.to(Device::cpu()).to_double_vector(), o_k.to(Device::cpu()).to_double_vector());
  EXPECT_EQ(lse.to(Device::cpu()).to_double_vector(), lse_k.to(Device::cpu()).to_double_vector());
}

// --attention auto (the default): training's shape goes to cuDNN (a plan is made, and the outputs
// are cuDNN's to the bit), a decode step over a KV cache view and a head dim cuDNN cannot take go
// to kiln's kernels (no plan; kiln's outputs to the bit).
TEST(CudnnAttentionGpu, AutoTakesCudnnForTrainingAndKilnForDecode) {
  REQUIRE_GPU();
  auto bits = [](const Tensor& t) { return t.to(Device::cpu()).to_double_vector(); };
  auto run = [](ops::AttentionImpl impl, const Tensor& q, const Tensor& k, std::int64_t off,
                std::size_t* plans_made) {
    ImplScope scope(impl);
    const std::size_t before = sdpa::cached_plans();
    auto r = ops::attention(q, k, k, 0.125, off);
    if (plans_made) *plans_made = sdpa::cached_plans() - before;
    return r;
  };
  // Training: B 2, T 96, 8 query heads over 2 kv heads, D 48 (stories15M's head dim).
  Tensor q = to_gpu_bf16(rand_bf16_values({2, 96, 8, 48}, 11, -2, 2));
  Tensor k = to_gpu_bf16(rand_bf16_values({2, 96, 2, 48}, 12));
  std::size_t made = 0;
  auto [o_auto, lse_auto] = run(ops::AttentionImpl::Auto, q, k, 0, &made);
  EXPECT_EQ(made, 1u);  // a fresh scale/shape: Auto planned it with cuDNN
  auto [o_cudnn, lse_cudnn] = run(ops::AttentionImpl::Cudnn, q, k, 0, nullptr);
  EXPECT_EQ(bits(o_auto), bits(o_cudnn));
  EXPECT_EQ(bits(lse_auto), bits(lse_cudnn));
  Tensor dout = to_gpu_bf16(rand_bf16_values({2, 96, 8, 48}, 13));
  std::vector<std::vector<double>> grads[2];
  for (int i = 0; i < 2; ++i) {
    ImplScope scope(i == 0 ? ops::AttentionImpl::Auto : ops::AttentionImpl::Cudnn);
    auto [dq, dk, dv] = ops::attention_backward(q, k, k, o_cudnn, lse_cudnn, dout, 0.125);
    grads[i] = {bits(dq), bits(dk), bits(dv)};
  }
  EXPECT_EQ(grads[0], grads[1]);

  // Decode: one query at position 40 over a KV cache view (batch stride of 64 positions).
  Tensor cache = to_gpu_bf16(rand_bf16_values({2, 64, 2, 48}, 14));
  Tensor kv = cache.narrow(1, 0, 41);
  Tensor q1 = to_gpu_bf16(rand_bf16_values({2, 1, 8, 48}, 15));
  auto [o_dec, lse_dec] = run(ops::AttentionImpl::Auto, q1, kv, 40, &made);
  EXPECT_EQ(made, 0u);
  auto [o_kiln, lse_kiln] = run(ops::AttentionImpl::Kiln, q1, kv, 40, nullptr);
  EXPECT_EQ(bits(o_dec), bits(o_kiln));
  EXPECT_EQ(bits(lse_dec), bits(lse_kiln));

  // Head dim 20 (not a multiple of 8): kiln's kernels even for training's shape.
  Tensor q20 = to_gpu_bf16(rand_bf16_values({1, 32, 4, 20}, 16));
  Tensor k20 = to_gpu_bf16(rand_bf16_values({1, 32, 4, 20}, 17));
  auto [o20, lse20] = run(ops::AttentionImpl::Auto, q20, k20, 0, &made);
  EXPECT_EQ(made, 0u);
  auto [o20k, lse20k] = run(ops::AttentionImpl::Kiln, q20, k20, 0, nullptr);
  EXPECT_EQ(bits(o20), bits(o20k));
}

}  // namespace
}  // namespace kiln

#else  // CPU-only build

TEST(CudnnAttentionHost, NeedsCudaBuild) {
  GTEST_SKIP() << "kiln was built without CUDA: the cuDNN attention path and its host-side tests "
                  "are not compiled";
}

#endif  // KILN_CUDA
