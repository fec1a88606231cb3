// The analytic budget: closed-form bytes per category, derived from what
// kiln's autograd nodes save (autograd/ops_*.cpp) and what the op front end
// allocates (tensor/ops_*.cpp). docs/memory.md writes the formulas out.
//
// Notation: B batch, T (training) or S (prompt) tokens, N = B*T rows, C dim,
// L layers, Hq/Hk query/key-value heads, D head_dim, F intermediate, V vocab,
// e = bytes of the model dtype, f = 4 (f32: norm statistics, attention lse).
// The dry run, and so this model, follow the CUDA path: bf16/f16 are computed
// natively, with no f32 conversion scratch and no GEMM library scratch (the CPU's
// bf16 GEMMs charge oneDNN's scratchpad: gemm_scratch_unmodelled; see
// docs/memory.md). r(x) rounds one allocation of x bytes up
// to the allocator's block (64 B on the CPU, 512 B for CUDA).
//
// The static rows are sums over parameter tensors and are exact. The peak is
// the largest of a few candidate moments, each the list of tensors alive then:
//   training:  the LM head + loss, in chunks in forward (both of its
//              gradients made there) or, with the logits whole, the
//              cross-entropy's and the LM head's backward; and the backward of
//              the last (with --recompute, recomputed) layer's MLP;
//   inference: the prefill's attention and MLP of one layer, and the last
//              decode step's attention over the full cache.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "budget/budget.h"
#include "distributed/shard.h"
#include "kernels/cpu/gemv_quant.h"
#include "kernels/cuda/quant.h"
#include "models/decoder.h"
#include "models/param_count.h"

namespace kiln::models {

namespace {

struct Moment {
  RowBytes rows{};
  Phase phase = Phase::Idle;
  const char* label = "";
  std::int64_t total() const {
    std::int64_t t = 0;
    for (std::size_t i = 0; i + 1 < kNumBudgetRows; ++i) t += rows[i];
    return t;
  }
  std::int64_t& operator[](BudgetRow r) { return rows[static_cast<std::size_t>(r)]; }
};

class Bytes {
 public:
  explicit Bytes(DeviceType d) : align_(d == DeviceType::CUDA ? 512 : 64) {}
  // One allocation of n elements of `size` bytes, as the allocator charges it.
  std::int64_t operator()(std::int64_t n, std::int64_t size) const {
    std::int64_t b = n * size;
    return (b + align_ - 1) / align_ * align_;
  }

 private:
  std::int64_t align_;
};

// The row length (GGML's k) of a parameter a GGUF scheme may store in blocks, by its row key
// (models/param_count.h): every Linear weight and the token embedding, as load_gguf_model keeps
// them; nullopt for the rest (norms, biases, a learned position table), which stay in dtype.
std::optional<std::int64_t> stored_row_len(const ModelConfig& c, const std::string& key) {
  if (key == "model.embed_tokens.weight" || key == "lm_head.weight") return c.dim;
  if (!key.starts_with("layers.*.")) return std::nullopt;
  for (const char* name : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "fc"})
    if (key.ends_with(std::string(name) + ".weight")) return c.dim;
  if (key.ends_with("o_proj.weight")) return c.n_heads * c.head_dim;
  if (key.ends_with("down_proj.weight") || key.ends_with("mlp.proj.weight")) return c.hidden_dim;
  return std::nullopt;
}

// The scratch of one Linear on quantized weights (ops::linear_quant) for `rows` rows of x
// against an n x k weight of type q, as each backend's kernel allocates it: on the CPU the int8
// GEMV's quantized copy of x up to quant_gemv_max_rows(q) rows, else a dequantized slice of the
// weights and, when the slice is not all of n, the GEMM's (rows, slice) output (oneDNN's own
// scratchpad beside them is left out, as for every bf16 GEMM: gemm_scratch_unmodelled); on CUDA
// nothing up to cuda::kQuantGemvMaxRows rows (its GEMV reads the blocks in place), else the
// whole weight dequantized in the compute dtype.
std::int64_t linear_quant_scratch(const Bytes& r, DeviceType simulate, quant::QuantType q,
                                  std::int64_t rows, std::int64_t n, std::int64_t k,
                                  std::int64_t e) {
  if (simulate == DeviceType::CUDA) return rows <= cuda::kQuantGemvMaxRows ? 0 : r(n * k, e);
  if (rows <= cpu::quant_gemv_max_rows(q)) return r(cpu::gemv_quant_scratch_bytes(q, rows, k), 1);
  const std::int64_t slice = std::clamp<std::int64_t>(cpu::kQuantPrefillSliceBytes / (k * e), 1, n);
  return r(slice * k, e) + (slice < n ? r(rows * slice, e) : 0);
}

}  // namespace

std::int64_t stored_weight_bytes(const ModelConfig& c, GgufScheme scheme, DType dtype,
                                 DeviceType simulate) {
  const Bytes r(simulate);
  const std::int64_t e = dtype_size(dtype);
  std::int64_t total = 0;
  for (const ParamRow& p : count_params(c).rows) {
    if (p.tied || p.per_layer == 0) continue;
    const std::int64_t n = p.per_layer;
    const std::optional<std::int64_t> k =
        scheme == GgufScheme::F32 ? std::nullopt : stored_row_len(c, p.key);
    if (!k) {
      total += p.layers * r(n, e);
      continue;
    }
    // Q4_K_M's type depends on the layer (llama.cpp's rule, gguf_tensor_type).
    for (std::int64_t i = 0; i < p.layers; ++i) {
      const std::string name = p.key.starts_with("layers.*.")
                                   ? fmt::format("model.layers.{}.{}", i, p.key.substr(9))
                                   : p.key;
      const std::optional<quant::QuantType> q =
          gguf_tensor_type(scheme, name, {n / *k, *k}, c.n_layers);
      total += q ? r(quantized_bytes(*q, n / *k, *k), 1) : r(n, e);
    }
  }
  return total;
}

BudgetFigures analytic_budget(const BudgetSpec& s) {
  s.validate();
  const ModelConfig& c = s.cfg;
  const Bytes r(s.simulate);
  const std::int64_t e = dtype_size(s.dtype), f = 4;
  const std::int64_t C = c.dim, L = c.n_layers, Hq = c.n_heads, Hk = c.n_kv_heads;
  const std::int64_t D = c.head_dim > 0 ? c.head_dim : c.dim / c.n_heads, F = c.hidden_dim;
  const std::int64_t V = c.vocab_size, B = s.local_batch();
  const bool train = s.mode == BudgetMode::Train;
  const bool lowp = s.dtype != DType::F32;  // bf16/f16: f32 master weights when training
  const bool plain_mlp = c.mlp_kind == MlpKind::Plain;
  // A gated MLP is fused SwiGLU with silu; with another activation it is act(gate) * up.
  const bool swiglu = !plain_mlp && c.hidden_act == MlpActivation::Silu;

  // ---- static rows: one allocation per parameter tensor, or per shard under ZeRO ----
  // n: the parameter's elements; k: rank s.rank's shard of them (distributed/shard.h).
  Moment base;
  std::int64_t largest_param = 0, layer_unit = 0, largest_unit = 0;
  for (const ParamRow& p : count_params(c).rows) {
    if (p.tied || p.per_layer == 0) continue;
    const std::int64_t n = p.per_layer, k = dist::shard_range(n, s.rank, s.nproc).size();
    largest_param = std::max(largest_param, n);
    if (p.key.starts_with("layers.*."))
      layer_unit += n;
    else
      largest_unit = std::max(largest_unit, n);
    if (!train) continue;  // inference: stored_weight_bytes below
    base[BudgetRow::Weights] += p.layers * r(s.zero >= 3 ? k : n, e);
    base[BudgetRow::Gradients] += p.layers * r(s.zero >= 2 ? k : n, e);
    const std::int64_t state = s.zero >= 1 ? k : n;
    if (lowp) base[BudgetRow::MasterWeights] += p.layers * r(state, 4);
    base[BudgetRow::OptimizerState] += p.layers * r(state, 4) * (s.adamw ? 2 : 1);
  }
  if (!train) base[BudgetRow::Weights] = stored_weight_bytes(c, s.weights, s.dtype, s.simulate);
  // ZeRO-2: one full-gradient bucket, the largest parameter's; ZeRO-3: one gathered unit, the
  // largest of a decoder layer and each parameter outside the layers, as one flat buffer.
  if (train && s.zero >= 2) base[BudgetRow::Gradients] += r(largest_param, e);
  if (train && s.zero >= 3) base[BudgetRow::Weights] += r(std::max(layer_unit, largest_unit), e);
  // RoPE cos and sin tables: (max_seq_len, D/2) in the compute dtype. A learned
  // position table (GPT-2) is a parameter instead, in the rows above.
  base[BudgetRow::Runtime] = c.uses_rope() ? 2 * r(c.max_seq_len * (D / 2), f) : 0;

  std::vector<Moment> moments;
  if (train) {
    const std::int64_t T = s.seq, N = B * T;
    base[BudgetRow::Inputs] = 2 * r(N, 4);                                  // ids and targets, i32
    const std::int64_t nstat = c.norm_kind == NormKind::LayerNorm ? 2 : 1;  // rstd (and mean)
    // What one layer saves for backward (bytes): the norms' inputs are the
    // residual stream, counted once as the layer's output.
    std::int64_t layer = 0;
    layer += nstat * r(N, f) + r(N * C, e);  // input norm: stats; output (saved by q/k/v)
    layer += r(N * Hk * D, e);               // v (saved by attention)
    if (c.qk_norm)                           // raw q, k saved by q_norm/k_norm, + rstd
      layer += r(N * Hq * D, e) + r(N * Hk * D, e) + r(N * Hq, f) + r(N * Hk, f);
    layer += r(N * Hq * D, e) + r(N * Hk * D, e);  // q, k after RoPE (saved by attention)
    layer += r(N * Hq * D, e) + r(B * Hq * T, f);  // attention out (saved by o_proj) and lse
    layer += r(N * C, e);                          // h = x + attn (saved by the second norm)
    layer += nstat * r(N, f) + r(N * C, e);        // second norm: stats, output
    // The MLP (N, F) tensors: plain, fc out (saved by act) and act out (proj);
    // SwiGLU, gate and up (swiglu) and its output (down); another gated
    // activation, gate (act), act out and up (mul) and the product (down).
    layer += (plain_mlp ? 2 : swiglu ? 3 : 4) * r(N * F, e);
    layer += r(N * C, e);                    // the layer's output x'
    const std::int64_t embed = r(N * C, e);  // embedding output = layer 0's input
    // The final norm's statistics and output (the LM head + loss's input, alive until it ends).
    const std::int64_t fin = c.final_norm ? nstat * r(N, f) + r(N * C, e) : 0;
    const std::int64_t all_saved =
        s.recompute ? embed + L * r(N * C, e) + fin  // checkpoints keep only each layer's input
                    : embed + L * layer + fin;
    const std::int64_t loss = r(1, e);

    // The LM head and the loss (ag::linear_cross_entropy, DecoderModel::loss): chunks of n rows,
    // both gradients computed in forward. A chunk of m rows holds its logits (overwritten by
    // their gradient), dloss (m), the whole dh (N, C), its own dh (m, C) until it is copied into
    // dh, the loss, and from the first chunk's dW on, dW (V, C) beside the gradients. The
    // candidates: the first chunk before and after its dW, a later full chunk, and the last,
    // shorter one. Where chunks would hold more (chunked_loss_rows: 0), the logits whole.
    const std::int64_t n = chunked_loss_rows(N, V, C, s.loss_chunk_rows);
    auto head = [&](std::int64_t m, bool chunk_dh, bool dw) {
      Moment h = base;
      h.phase = Phase::Forward, h.label = "linear_cross_entropy";
      h[BudgetRow::Activations] = all_saved;
      h[BudgetRow::Logits] =
          r(m * V, e) + r(m, f) + r(N * C, e) + (chunk_dh ? r(m * C, e) : 0) + loss;
      if (dw) h[BudgetRow::Gradients] += r(V * C, e);
      moments.push_back(h);
    };
    if (n > 0) {
      head(n, false, true);
      head(n, true, false);
      if (N >= 2 * n) head(n, true, true);
      if (N % n != 0) head(N % n, true, true);
    } else {
      // The logits whole (where chunks would hold more): the cross-entropy backward writes the
      // gradient over the logits (in place, in their dtype); then the LM head's backward holds
      // dlogits and allocates dx = dlogits W.
      const std::int64_t logits = r(N * V, e);
      Moment ce = base;
      ce.phase = Phase::Backward, ce.label = "cross_entropy";
      ce[BudgetRow::Activations] = all_saved;
      ce[BudgetRow::Logits] = logits + r(N, f) /* lse */ + r(N, f) /* dloss */ + loss;
      ce[BudgetRow::Temporaries] = loss /* the seed gradient, ones */;
      moments.push_back(ce);
      Moment lm = base;
      lm.phase = Phase::Backward, lm.label = "linear";
      lm[BudgetRow::Activations] = all_saved;
      lm[BudgetRow::Logits] = logits + loss;
      lm[BudgetRow::Temporaries] = r(N * C, e);
      moments.push_back(lm);
    }

    // The last layer's MLP backward (the first layer backward reaches, holding the most), after
    // its recomputation with --recompute: the saved set less the SwiGLU output that down_proj's
    // backward has released; temporaries: the incoming gradient (N, C), d(swiglu out), dgate,
    // dup. Another gated activation peaks the same way in the product's backward (mul, a
    // "binary" node): the product released, d(product), d(act out) and dup alive. With
    // --recompute the saved set is the inputs of the other L - 1 checkpoints and the layer's full
    // saved set again (its recomputed output held until the layer's backward ends); without, all
    // of it less the final norm's output (the LM head + loss does not save it) and the last
    // layer's output (the final norm's saved input, released by its backward).
    const std::int64_t held =
        s.recompute ? embed + (L - 1) * r(N * C, e) + layer : all_saved - fin - r(N * C, e);
    Moment mb = base;
    mb.phase = Phase::Backward, mb.label = swiglu ? "swiglu" : "binary";
    mb[BudgetRow::Activations] = held - r(N * F, e);
    mb[BudgetRow::Temporaries] = r(N * C, e) + 3 * r(N * F, e);
    if (plain_mlp) {
      // A plain MLP peaks one op earlier, in proj's backward: the full saved set (the
      // activation's output not yet released); temporaries: the incoming gradient (N, C),
      // d(act out) (N, F) and, with a bias, its gradient (C). The activation's backward after it
      // holds the same bytes less the bias gradient (d(act out) freed as dfc (N, F) is made).
      mb.label = "linear";
      mb[BudgetRow::Activations] = held;
      mb[BudgetRow::Temporaries] = r(N * C, e) + r(N * F, e) + (c.bias ? r(C, e) : 0);
    }
    mb[BudgetRow::Logits] = loss;
    moments.push_back(mb);
  } else {
    const std::int64_t S = s.seq, N = B * S, ctx = s.kv_capacity();
    base[BudgetRow::KVCache] = 2 * L * r(B * ctx * Hk * D, e);
    base[BudgetRow::Inputs] = r(N, 4);
    // Prefill, inside one layer (no grad: nothing is saved, only the
    // expression's live tensors): the layer input x, the residual h, the second
    // norm's output, gate/up/act (N, F), then down_proj's output. (A gated
    // MLP with another activation holds act out, up and the product: the gate
    // is freed once activated.)
    Moment mlp = base;
    mlp.phase = Phase::Prefill, mlp.label = "mlp";
    const std::int64_t nf = plain_mlp ? 2 * r(N * F, e) : 3 * r(N * F, e);
    mlp[BudgetRow::Activations] = 4 * r(N * C, e) + nf;
    moments.push_back(mlp);
    // Prefill attention: x, the first norm's output, q and k after RoPE, v,
    // the output and lse.
    Moment att = base;
    att.phase = Phase::Prefill, att.label = "attention";
    att[BudgetRow::Activations] =
        2 * r(N * C, e) + 2 * r(N * Hq * D, e) + 2 * r(N * Hk * D, e) + r(B * Hq * S, f);
    moments.push_back(att);
    if (s.weights != GgufScheme::F32) {
      // Quantized Linear weights add their kernel's scratch to the op running at each moment:
      // down_proj (or proj) at the MLP's, o_proj after the attention (a smaller scratch than
      // down_proj's on the CPU, the same rows), and the LM head on the last row of each step,
      // which on CUDA dequantizes the whole (V, C) table.
      const std::string down = plain_mlp ? "mlp.proj.weight" : "mlp.down_proj.weight";
      std::int64_t mlp_temp = 0;
      for (std::int64_t i = 0; i < L; ++i) {
        const auto q =
            gguf_tensor_type(s.weights, fmt::format("model.layers.{}.{}", i, down), {C, F}, L);
        if (q) mlp_temp = std::max(mlp_temp, linear_quant_scratch(r, s.simulate, *q, N, C, F, e));
      }
      moments[moments.size() - 2][BudgetRow::Temporaries] = mlp_temp;
      const std::string head = c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
      if (const auto q = gguf_tensor_type(s.weights, head, {V, C}, L)) {
        Moment lm = base;
        lm.phase = Phase::Prefill, lm.label = "lm_head";
        // The last position of each row: a copy when B > 1; with one row a view that keeps
        // the prefill's whole (1, S, C) hidden state alive.
        lm[BudgetRow::Activations] = B == 1 ? r(N * C, e) : r(B * C, e);
        lm[BudgetRow::Logits] = r(B * V, e);
        lm[BudgetRow::Temporaries] = linear_quant_scratch(r, s.simulate, *q, B, V, C, e);
        moments.push_back(lm);
      }
    }
  }

  const Moment* best = &moments.front();
  for (const auto& m : moments)
    if (m.total() > best->total()) best = &m;
  BudgetFigures out;
  out.at_peak = best->rows;
  out.total_peak = best->total();
  out.peak_phase = best->phase;
  out.peak_label = best->label;
  for (const auto& m : moments)
    for (std::size_t i = 0; i < kNumBudgetRows; ++i) out.peak[i] = std::max(out.peak[i], m.rows[i]);
  return out;
}

}  // namespace kiln::models
