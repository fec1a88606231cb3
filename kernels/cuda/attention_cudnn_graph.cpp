// cuDNN fused attention, the part that needs no cuDNN: the plan-cache key (its families, hash and
// description), its validation, the kiln-to-cuDNN layouts, and the graph as data (build_graph),
// which attention_cudnn.cpp turns into backend descriptors. See attention_cudnn.h for the math.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cuda/attention_cudnn.h"

namespace kiln::cuda::cudnn_sdpa {

// ---- key, validation, layouts (no device) -------------------------------------------------------

SdpaKey shape_family(const SdpaKey& key) {
  SdpaKey f = key;
  if (!key.backward && key.q_offset > 0) {
    f.Tk = 0;
    f.q_offset = 0;
    f.kv_batch_stride = 0;
  }
  return f;
}

bool uses_kernel_cache(const SdpaKey& key, int cudnn_version) {
  return !key.backward && key.q_offset > 0 && cudnn_version >= kMinDynamicShapeVersion;
}

std::size_t hash_key(const SdpaKey& k) {
  std::size_t h = 0;
  auto mix = [&h](std::uint64_t v) {
    h ^= std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  };
  mix(k.backward);
  mix(static_cast<std::uint64_t>(k.io));
  for (std::int64_t v : {k.B, k.Tq, k.Tk, k.Hq, k.Hkv, k.D, k.kv_batch_stride, k.q_offset})
    mix(static_cast<std::uint64_t>(v));
  mix(std::bit_cast<std::uint32_t>(k.scale));
  mix(static_cast<std::uint64_t>(k.device));
  return h;
}

std::string describe(const SdpaKey& k) {
  return fmt::format("{} {} B={} Tq={} Tk={} Hq={} Hkv={} D={} kbs={} q_offset={} scale={} cuda:{}",
                     k.backward ? "bwd" : "fwd", k.io == IoType::BF16 ? "bf16" : "f16", k.B, k.Tq,
                     k.Tk, k.Hq, k.Hkv, k.D, k.kv_batch_stride, k.q_offset, k.scale, k.device);
}

void validate(const SdpaKey& k) {
  const std::string what = describe(k);
  KILN_CHECK(k.B > 0 && k.Tq > 0 && k.Tk > 0 && k.Hq > 0 && k.Hkv > 0 && k.D > 0,
             "[attention_cudnn] empty or negative extent ({})", what);
  KILN_CHECK(k.Hq % k.Hkv == 0, "[attention_cudnn] {} query heads not divisible by {} kv heads",
             k.Hq, k.Hkv);
  KILN_CHECK(k.q_offset >= 0 && k.q_offset + k.Tq <= k.Tk,
             "[attention_cudnn] queries at [{}, {}) need keys up to {}, have {}", k.q_offset,
             k.q_offset + k.Tq, k.q_offset + k.Tq, k.Tk);
  KILN_CHECK(k.kv_batch_stride >= k.Tk * k.Hkv * k.D,
             "[attention_cudnn] kv batch stride {} < Tk*Hkv*D = {}", k.kv_batch_stride,
             k.Tk * k.Hkv * k.D);
  // cuDNN's fused attention surface on Hopper: head dim a multiple of 8, at most 256.
  KILN_CHECK(k.D % 8 == 0 && k.D <= 256,
             "[attention_cudnn] head dim {} unsupported by cuDNN fused attention (needs a multiple "
             "of 8, at most 256)",
             k.D);
  KILN_CHECK(std::isfinite(k.scale) && k.scale != 0.0f, "[attention_cudnn] bad scale {}", k.scale);
  if (k.backward) {
    KILN_CHECK(k.Tq == k.Tk && k.q_offset == 0 && k.kv_batch_stride == k.Tk * k.Hkv * k.D,
               "[attention_cudnn] backward needs Tq == Tk, q_offset 0 and dense k/v ({})", what);
  }
  // cuDNN's kernels size tensors with 32-bit integers: keep every bound buffer within int32.
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  const std::int64_t q_elems = k.B * k.Tq * k.Hq * k.D;
  const std::int64_t kv_span = (k.B - 1) * k.kv_batch_stride + k.Tk * k.Hkv * k.D;
  const std::int64_t dq_accum_elems = k.backward ? q_elems : 0;
  KILN_CHECK(q_elems <= kMax && kv_span <= kMax && dq_accum_elems <= kMax && k.Tk <= kMax,
             "[attention_cudnn] tensors beyond 2^31 elements are not supported ({})", what);
}

Layout4 q_layout(const SdpaKey& k) {
  return {{k.B, k.Hq, k.Tq, k.D}, {k.Tq * k.Hq * k.D, k.D, k.Hq * k.D, 1}};
}
Layout4 kv_layout(const SdpaKey& k) {
  return {{k.B, k.Hkv, k.Tk, k.D}, {k.kv_batch_stride, k.D, k.Hkv * k.D, 1}};
}
Layout4 stats_layout(const SdpaKey& k) { return {{k.B, k.Hq, k.Tq, 1}, {k.Hq * k.Tq, k.Tq, 1, 1}}; }
Layout4 scores_layout(const SdpaKey& k) {
  return {{k.B, k.Hq, k.Tq, k.Tk}, {k.Hq * k.Tq * k.Tk, k.Tq * k.Tk, k.Tk, 1}};
}
Layout4 swap_last_two(const Layout4& l) {
  Layout4 t = l;
  std::swap(t.dims[2], t.dims[3]);
  std::swap(t.strides[2], t.strides[3]);
  return t;
}

// ---- the graph as data --------------------------------------------------------------------------

const TensorSpec& GraphSpec::tensor(std::int64_t id) const {
  for (const TensorSpec& t : tensors)
    if (t.uid == id) return t;
  fail("[attention_cudnn] graph has no tensor with uid {}", id);
}

std::vector<std::int64_t> GraphSpec::bound_uids() const {
  std::vector<std::int64_t> out;
  for (const TensorSpec& t : tensors)
    if (!t.is_virtual && !t.by_value) out.push_back(t.uid);
  return out;
}

namespace {

class GraphBuilder {
 public:
  explicit GraphBuilder(const SdpaKey& key) : key_(key) {
    g_.scale = key.scale;
    g_.neg_inf = -std::numeric_limits<float>::infinity();
    g_.one = 1.0f;
    g_.shift = static_cast<std::int32_t>(key.q_offset);
  }

  std::int64_t real(std::int64_t id, std::string name, Layout4 l, ElemType t) {
    g_.tensors.push_back({id, std::move(name), l, t, false, false});
    return id;
  }
  std::int64_t scalar(std::int64_t id, std::string name, ElemType t) {
    g_.tensors.push_back({id, std::move(name), {{1, 1, 1, 1}, {1, 1, 1, 1}}, t, false, true});
    return id;
  }
  std::int64_t virt(std::string name, Layout4 l, ElemType t) {
    const std::int64_t id = next_++;
    g_.tensors.push_back({id, std::move(name), l, t, true, false});
    return id;
  }
  void pointwise(std::string name, PwMode mode, std::vector<std::int64_t> in, std::int64_t out,
                 ElemType compute = ElemType::F32, std::int64_t axis = -1) {
    g_.ops.push_back({.kind = OpKind::Pointwise,
                      .name = std::move(name),
                      .pw = mode,
                      .compute = compute,
                      .axis = axis,
                      .inputs = std::move(in),
                      .output = out});
  }
  void matmul(std::string name, std::int64_t a, std::int64_t b, std::int64_t c) {
    g_.ops.push_back(
        {.kind = OpKind::Matmul, .name = std::move(name), .inputs = {a, b}, .output = c});
  }
  void reduction(std::string name, RedMode mode, std::int64_t x, std::int64_t y) {
    g_.ops.push_back({.kind = OpKind::Reduction,
                      .name = std::move(name),
                      .red = mode,
                      .inputs = {x},
                      .output = y});
  }
  void reshape(std::string name, std::int64_t x, std::int64_t y) {
    g_.ops.push_back(
        {.kind = OpKind::Reshape, .name = std::move(name), .inputs = {x}, .output = y});
  }

  // keep(i, j) = (i + q_offset >= j): scores where kept, -inf elsewhere. The row shift is the
  // frontend's "right bound" add on the generated row index; without an offset it is left out, as
  // for a plain top-left causal mask.
  std::int64_t causal_mask(std::int64_t scores) {
    const Layout4 sl = scores_layout(key_);
    std::int64_t row = virt("row_index", sl, ElemType::I32);
    pointwise("gen_row_index", PwMode::GenIndex, {scores}, row, ElemType::F32, 2);
    const std::int64_t col = virt("col_index", sl, ElemType::I32);
    pointwise("gen_col_index", PwMode::GenIndex, {scores}, col, ElemType::F32, 3);
    if (key_.q_offset > 0) {
      scalar(uid::kShift, "q_offset", ElemType::I32);
      const std::int64_t shifted = virt("row_plus_q_offset", sl, ElemType::I32);
      pointwise("row+q_offset", PwMode::Add, {row, uid::kShift}, shifted, ElemType::I32, 3);
      row = shifted;
    }
    const std::int64_t keep = virt("causal_keep", sl, ElemType::Bool);
    pointwise("row>=col", PwMode::CmpGe, {row, col}, keep, ElemType::Bool);
    const std::int64_t out = virt("masked_scores", sl, ElemType::F32);
    pointwise("causal_select", PwMode::Select, {scores, uid::kNegInf, keep}, out);
    return out;
  }

  GraphSpec take() { return std::move(g_); }

 private:
  const SdpaKey& key_;
  GraphSpec g_;
  std::int64_t next_ = uid::kFirstVirtual;
};

}  // namespace

GraphSpec build_graph(const SdpaKey& key) {
  validate(key);
  GraphBuilder gb(key);
  const ElemType io = key.io == IoType::BF16 ? ElemType::BF16 : ElemType::F16;
  const Layout4 ql = q_layout(key), kl = kv_layout(key), sl = scores_layout(key);
  const Layout4 rows = stats_layout(key);  // (B, Hq, Tq, 1): one value per query row
  // (B, Hq, Tk, Tq): the score matrix read transposed, for P^T dO and dS^T Q.
  const Layout4 st = swap_last_two(sl);
  // (B, Hq, Tk, D) dense: dK/dV per query head before the GQA group sum.
  const Layout4 per_q_head = {{key.B, key.Hq, key.Tk, key.D},
                              {key.Hq * key.Tk * key.D, key.Tk * key.D, key.D, 1}};

  gb.real(uid::kQ, "q", ql, io);
  gb.real(uid::kK, "k^T", swap_last_two(kl),
          io);  // bound to k, described as K^T
  gb.scalar(uid::kScale, "scale", ElemType::F32);
  gb.scalar(uid::kNegInf, "-inf", ElemType::F32);

  if (!key.backward) {
    gb.real(uid::kV, "v", kl, io);
    gb.real(uid::kO, "out", ql, io);
    gb.real(uid::kStats, "lse", rows, ElemType::F32);
    const std::int64_t s = gb.virt("scores", sl, ElemType::F32);
    gb.matmul("q@k^T", uid::kQ, uid::kK, s);
    const std::int64_t s1 = gb.virt("scaled_scores", sl, ElemType::F32);
    gb.pointwise("*scale", PwMode::Mul, {s, uid::kScale}, s1);
    const std::int64_t s2 = gb.causal_mask(s1);
    const std::int64_t mx = gb.virt("row_max", rows, ElemType::F32);
    gb.reduction("max", RedMode::Max, s2, mx);
    const std::int64_t s3 = gb.virt("scores-max", sl, ElemType::F32);
    gb.pointwise("sub_max", PwMode::Sub, {s2, mx}, s3);
    const std::int64_t e = gb.virt("exp", sl, ElemType::F32);
    gb.pointwise("exp", PwMode::Exp, {s3}, e);
    const std::int64_t sum = gb.virt("row_sum", rows, ElemType::F32);
    gb.reduction("sum", RedMode::Add, e, sum);
    const std::int64_t lg = gb.virt("log_sum", rows, ElemType::F32);
    gb.pointwise("log", PwMode::Log, {sum}, lg);
    gb.pointwise("lse=max+log", PwMode::Add, {mx, lg}, uid::kStats);
    const std::int64_t p = gb.virt("probs", sl, io);  // bmm2's A operand in the I/O type
    gb.pointwise("div_sum", PwMode::Div, {e, sum}, p);
    gb.matmul("p@v", p, uid::kV, uid::kO);
    return gb.take();
  }

  gb.real(uid::kV, "v^T", swap_last_two(kl),
          io);  // bound to v, described as V^T
  gb.real(uid::kO, "out", ql, io);
  gb.real(uid::kStats, "lse", rows, ElemType::F32);
  gb.real(uid::kDO, "dout", ql, io);
  gb.real(uid::kDQ, "dq", ql, io);
  gb.real(uid::kDK, "dk", kl, io);
  gb.real(uid::kDV, "dv", kl, io);
  gb.scalar(uid::kOne, "one", ElemType::F32);

  // softmax_sum = rowsum(dO * O): the Di term, in an f32 buffer of ours.
  const std::int64_t t0 = gb.virt("dout*out", ql, ElemType::F32);
  gb.pointwise("mul_dout_out", PwMode::Mul, {uid::kDO, uid::kO}, t0);
  const std::int64_t t1 = gb.virt("rowsum_dout_out", rows, ElemType::F32);
  gb.reduction("sum_dout_out", RedMode::Add, t0, t1);
  gb.real(uid::kSoftmaxSum, "softmax_sum", rows, ElemType::F32);
  gb.pointwise("*1", PwMode::Mul, {t1, uid::kOne}, uid::kSoftmaxSum);

  // P = exp(scale * q k^T - lse), masked.
  const std::int64_t s = gb.virt("scores", sl, ElemType::F32);
  gb.matmul("q@k^T", uid::kQ, uid::kK, s);
  const std::int64_t s1 = gb.virt("scaled_scores", sl, ElemType::F32);
  gb.pointwise("*scale", PwMode::Mul, {s, uid::kScale}, s1);
  const std::int64_t s2 = gb.virt("scores-lse", sl, ElemType::F32);
  gb.pointwise("sub_lse", PwMode::Sub, {s1, uid::kStats}, s2);
  const std::int64_t s3 = gb.causal_mask(s2);
  const std::int64_t p = gb.virt("probs", sl, ElemType::F32);
  gb.pointwise("exp", PwMode::Exp, {s3}, p);

  // dV = P^T dO (per query head, then summed over the group under GQA).
  const bool gqa = key.Hq != key.Hkv;
  const std::int64_t pt = gb.virt("probs^T", st, io);
  gb.reshape("transpose_probs", p, pt);
  if (!gqa) {
    gb.matmul("p^T@dout", pt, uid::kDO, uid::kDV);
  } else {
    const std::int64_t dvf = gb.virt("dv_per_q_head", per_q_head, io);
    gb.matmul("p^T@dout", pt, uid::kDO, dvf);
    gb.reduction("sum_group_dv", RedMode::Add, dvf, uid::kDV);
  }

  // dS = scale * P * (dO v^T - softmax_sum).
  const std::int64_t dp = gb.virt("dout@v^T", sl, ElemType::F32);
  gb.matmul("dout@v^T", uid::kDO, uid::kV, dp);
  const std::int64_t d1 = gb.virt("dp-softmax_sum", sl, ElemType::F32);
  gb.pointwise("sub_softmax_sum", PwMode::Sub, {dp, uid::kSoftmaxSum}, d1);
  const std::int64_t d2 = gb.virt("p*(dp-softmax_sum)", sl, ElemType::F32);
  gb.pointwise("mul_probs", PwMode::Mul, {d1, p}, d2);
  const std::int64_t ds = gb.virt("dS", sl, ElemType::F32);
  gb.pointwise("*scale_ds", PwMode::Mul, {d2, uid::kScale}, ds);

  // dK = dS^T q.
  const std::int64_t dst = gb.virt("dS^T", st, io);
  gb.reshape("transpose_dS", ds, dst);
  if (!gqa) {
    gb.matmul("dS^T@q", dst, uid::kQ, uid::kDK);
  } else {
    const std::int64_t dkf = gb.virt("dk_per_q_head", per_q_head, io);
    gb.matmul("dS^T@q", dst, uid::kQ, dkf);
    gb.reduction("sum_group_dk", RedMode::Add, dkf, uid::kDK);
  }

  // dQ = dS k, accumulated in f32 (B, Hq, Tq, D) dense, then converted into dq. The reshape turns
  // the K^T description back into K; cudnn-frontend leaves this view in the intermediate (f32)
  // type, and so do we.
  const std::int64_t kr = gb.virt("k", kl, ElemType::F32);
  gb.reshape("transpose_k", uid::kK, kr);
  gb.real(uid::kDQAccum, "dq_accum",
          {{key.B, key.Hq, key.Tq, key.D}, {key.Hq * key.Tq * key.D, key.Tq * key.D, key.D, 1}},
          ElemType::F32);
  gb.matmul("dS@k", ds, kr, uid::kDQAccum);
  gb.pointwise("dq=dq_accum", PwMode::Identity, {uid::kDQAccum}, uid::kDQ);
  return gb.take();
}

}  // namespace kiln::cuda::cudnn_sdpa
