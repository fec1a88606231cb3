#include "serve/batch_forward.h"

#include <cmath>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/cpu/gemv_quant.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/quant.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"

namespace kiln::serve {
namespace {

// A run of rows of one sequence at consecutive positions: RoPE takes one offset per call, and
// the KV write copies a run into consecutive slots.
struct Segment {
  std::int64_t start, len;
  std::int32_t seq, pos0;
};

std::vector<Segment> segments_of(const BatchRows& r) {
  std::vector<Segment> out;
  for (std::size_t i = 0; i < r.tokens.size(); ++i) {
    if (!out.empty() && out.back().seq == r.seq[i] &&
        out.back().pos0 + out.back().len == r.pos[i]) {
      ++out.back().len;
      continue;
    }
    out.push_back({static_cast<std::int64_t>(i), 1, r.seq[i], r.pos[i]});
  }
  return out;
}

// How a weight's rows are tiled (see batch_forward.h). The GEMV kernels compute every row of x on
// its own, in the same order whatever the row count up to their limit (on the CPU the int8 GEMV
// for GGML weights: quant_gemv_max_rows(type), and the bf16 GEMV: kBf16GemvRows; on CUDA the
// quantized GEMV, cuda::kQuantGemvMaxRows, and the bf16 GEMV for a Linear without bias while it is
// on, cuda::kGemvMaxRows), so they take exactly the rows there are. Anything else (f32 GEMMs,
// cuBLASLt, whose blocking may depend on M) always gets kRowTile rows, the last tile padded.
struct TilePlan {
  std::int64_t rows;
  bool pad;
};

// (The backend the kernels come from: the meta device of a dry run tiles as the device it
// simulates, so the budget's dry run charges the tiles a real run allocates.)
TilePlan tile_plan(std::optional<quant::QuantType> quant, DType weight, const Tensor& x,
                   bool bias = false) {
  const bool cpu_kernels = ops::kernel_device(x.device()) == DeviceType::CPU;
  const bool quantized = quant.has_value();
  if (cpu_kernels && quantized) return {cpu::quant_gemv_max_rows(*quant), false};
  if (cpu_kernels && (weight == DType::BF16 || weight == DType::F16) && x.dtype() == weight)
    return {kBf16GemvRows, false};  // the bf16 and f16 GEMVs take up to this many rows
  if (!cpu_kernels && quantized) return {cuda::kQuantGemvMaxRows, false};
  if (!cpu_kernels && weight == DType::BF16 && x.dtype() == DType::BF16 && !bias &&
      x.size(1) % 8 == 0 && cuda::gemv_enabled())
    return {cuda::kGemvMaxRows, false};
  return {kRowTile, true};
}

// y (N, out) = f(x (N, in)), tiled by `plan`.
template <class F>
Tensor by_tiles(const Tensor& x, TilePlan plan, F&& f) {
  const std::int64_t N = x.size(0);
  Tensor out;
  for (std::int64_t r0 = 0; r0 < N; r0 += plan.rows) {
    const std::int64_t n = std::min(plan.rows, N - r0);
    Tensor tile = x.narrow(0, r0, n);
    if (n < plan.rows && plan.pad) {
      Tensor padded = ops::zeros({plan.rows, x.size(1)}, x.dtype(), x.device());
      padded.narrow(0, 0, n).copy_(tile);
      tile = padded;
    }
    const Tensor y = f(tile);
    if (!out.defined()) out = Tensor::empty({N, y.size(1)}, y.dtype(), y.device());
    out.narrow(0, r0, n).copy_(y.narrow(0, 0, n));
  }
  return out;
}

Tensor linear_rows(const nn::Linear& l, const Tensor& x) {
  return by_tiles(x, tile_plan(l.weight_quant, l.weight.dtype(), x, l.bias.defined()),
                  [&](const Tensor& t) { return l.forward(t); });
}

Tensor mlp_rows(const nn::Mlp& mlp, const Tensor& x) {
  if (mlp.cfg.kind == nn::MlpKind::Plain)
    return linear_rows(*mlp.proj, ag::activation(mlp.cfg.act, linear_rows(*mlp.fc, x)));
  const Tensor gate = linear_rows(*mlp.gate_proj, x), up = linear_rows(*mlp.up_proj, x);
  const Tensor a = mlp.cfg.act == nn::MlpActivation::Silu
                       ? ag::swiglu(gate, up)
                       : ag::mul(ag::activation(mlp.cfg.act, gate), up);
  return linear_rows(*mlp.down_proj, a);
}

// x (N, H, D) with RoPE applied per segment at its positions.
Tensor rope_rows(const nn::Rope& rope, const Tensor& x, const std::vector<Segment>& segs) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const std::int64_t H = x.size(1), D = x.size(2);
  for (const Segment& s : segs)
    out.narrow(0, s.start, s.len)
        .copy_(rope.apply(x.narrow(0, s.start, s.len).reshape({1, s.len, H, D}), s.pos0)
                   .reshape({s.len, H, D}));
  return out;
}

// Copies each segment's keys (or values) x (N, Hkv, D) into its sequence's blocks.
void write_pool(Tensor& pool, const Tensor& x, const std::vector<Segment>& segs,
                const Tensor& tables) {
  const std::int64_t bs = pool.size(1), Hkv = pool.size(2), D = pool.size(3);
  const std::int64_t max_blocks = tables.size(1);
  const std::int32_t* tb = tables.data<std::int32_t>();
  for (const Segment& s : segs) {
    for (std::int64_t i = 0; i < s.len;) {
      const std::int64_t p = s.pos0 + i, slot = p % bs;
      const std::int64_t n = std::min(s.len - i, bs - slot);
      KILN_CHECK(p / bs < max_blocks, "[serve] position {} beyond the block table", p);
      const std::int32_t block = tb[s.seq * max_blocks + p / bs];
      KILN_CHECK(block >= 0 && block < pool.size(0), "[serve] block {} outside the pool", block);
      pool.narrow(0, block, 1)
          .narrow(1, slot, n)
          .copy_(x.narrow(0, s.start + i, n).reshape({1, n, Hkv, D}));
      i += n;
    }
  }
}

}  // namespace

Tensor forward_rows(const models::DecoderModel& m, KvPool& pool, const BatchRows& rows) {
  NoGradGuard no_grad;
  const auto N = static_cast<std::int64_t>(rows.tokens.size());
  KILN_CHECK(
      N > 0 && rows.seq.size() == rows.tokens.size() && rows.pos.size() == rows.tokens.size(),
      "[serve] a batch needs rows with a sequence and a position each");
  KILN_CHECK(m.rope && !m.model->embed_positions,
             "[serve] the model uses learned positions; kiln serve runs RoPE models only");
  const models::ModelConfig& c = m.cfg;
  const Device dev = m.device();
  const std::vector<Segment> segs = segments_of(rows);
  // The rows' sequences and positions, read on the host by paged attention: host tensors,
  // except in a dry run simulating the CPU, where the meta device charges them as the CPU would.
  const Device index_dev = ops::kernel_device(dev) == DeviceType::CPU ? dev : Device::cpu();
  const Tensor seq = ops::from_vector(rows.seq, {N}).to(index_dev);
  const Tensor pos = ops::from_vector(rows.pos, {N}).to(index_dev);
  Tensor h = m.model->embed_tokens->forward(ops::from_vector(rows.tokens, {N}).to(dev));  // (N, C)
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  for (std::size_t l = 0; l < m.model->layers->items.size(); ++l) {
    const nn::DecoderLayer& layer = *m.model->layers->items[l];
    const nn::Attention& at = *layer.self_attn;
    const Tensor x = layer.input_layernorm->forward(h);
    Tensor q = linear_rows(*at.q_proj, x).reshape({N, c.n_heads, c.head_dim});
    Tensor k = linear_rows(*at.k_proj, x).reshape({N, c.n_kv_heads, c.head_dim});
    const Tensor v = linear_rows(*at.v_proj, x).reshape({N, c.n_kv_heads, c.head_dim});
    if (at.cfg.qk_norm) {
      q = at.q_norm->forward(q);
      k = at.k_norm->forward(k);
    }
    q = rope_rows(*m.rope, q, segs);
    k = rope_rows(*m.rope, k, segs);
    write_pool(pool.k[l], k, segs, rows.tables);
    write_pool(pool.v[l], v, segs, rows.tables);
    const Tensor o = ops::paged_attention(q, pool.k[l], pool.v[l], rows.tables, seq, pos, scale);
    h = ag::add(h, linear_rows(*at.o_proj, o.reshape({N, c.n_heads * c.head_dim})));
    h = ag::add(h, mlp_rows(*layer.mlp, layer.post_attention_layernorm->forward(h)));
  }
  const auto R = static_cast<std::int64_t>(rows.logits_rows.size());
  if (R == 0) return Tensor::empty({0, c.vocab_size});
  Tensor last = Tensor::empty({R, c.dim}, h.dtype(), h.device());
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int64_t i = rows.logits_rows[r];
    KILN_CHECK(i >= 0 && i < N, "[serve] logits row {} outside the batch of {}", i, N);
    last.narrow(0, r, 1).copy_(h.narrow(0, i, 1));
  }
  if (m.model->norm) last = m.model->norm->forward(last);
  const auto& embed = *m.model->embed_tokens;
  const TilePlan head = m.lm_head
                            ? tile_plan(m.lm_head->weight_quant, m.lm_head->weight.dtype(), last)
                            : tile_plan(embed.weight_quant, embed.weight.dtype(), last);
  const Tensor logits =
      by_tiles(last, head, [&](const Tensor& t) { return m.logits(t); }).to(DType::F32);
  return dev.is_meta() ? logits : logits.to(Device::cpu());  // meta: the budget's dry run
}

}  // namespace kiln::serve
