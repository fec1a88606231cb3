// CPU kernels of the nn families (softmax, embedding, norms, RoPE, activations, attention,
// cross-entropy, dropout, optimizers): the glue from op arguments (tensor/op_args.h) to
// kernels/cpu/, and their registrations. Tensors arrive in the kernel's storage type T (bf16/f16
// computed in f32 by the kernels; statistics in compute_dtype), contiguous unless registered
// otherwise; scratch a glue allocates itself is declared to the table, so the dry
// run charges it too.
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"
#include "tensor/kernels_cpu.h"
#include "tensor/op_args.h"

namespace kiln::ops {
namespace cpu_glue {
namespace {

namespace kc = kiln::cpu;

template <class T>
struct SoftmaxCpu {
  static void run(SoftmaxArgs& a) {
    const std::int64_t rows = rows_of(a.x), cols = a.x.dim() == 0 ? 1 : a.x.size(-1);
    if (a.log)
      kc::log_softmax_forward<T>(rows, cols, a.x.template data<T>(), a.y.template data<T>());
    else
      kc::softmax_forward<T>(rows, cols, a.x.template data<T>(), a.y.template data<T>());
  }
};

template <class T>
struct SoftmaxBackwardCpu {
  static void run(SoftmaxBackwardArgs& a) {
    const std::int64_t rows = rows_of(a.y), cols = a.y.dim() == 0 ? 1 : a.y.size(-1);
    if (a.log)
      kc::log_softmax_backward<T>(rows, cols, a.y.template data<T>(), a.dy.template data<T>(),
                                  a.dx.template data<T>());
    else
      kc::softmax_backward<T>(rows, cols, a.y.template data<T>(), a.dy.template data<T>(),
                              a.dx.template data<T>());
  }
};

template <class T>
struct EmbeddingCpu {
  static void run(EmbeddingArgs& a) {
    kc::embedding_forward<T>(a.ids.numel(), a.table.size(0), a.table.size(1),
                             a.ids.template data<std::int32_t>(), a.table.template data<T>(),
                             a.out.template data<T>());
  }
};

template <class T>
struct EmbeddingBackwardCpu {
  static void run(EmbeddingBackwardArgs& a) {
    kc::embedding_backward<T>(a.ids.numel(), a.dtable.size(0), a.dtable.size(1),
                              a.ids.template data<std::int32_t>(), a.dout.template data<T>(),
                              a.dtable.template data<T>());
  }
};

template <class T>
struct RmsNormCpu {
  static void run(RmsNormArgs& a) {
    kc::rmsnorm_forward<T>(rows_of(a.x), a.w.size(0), a.eps, a.x.template data<T>(),
                           a.w.template data<T>(), a.y.template data<T>(),
                           a.rstd.template data<kc::compute_t<T>>());
  }
};

// The add and the norm are the kernels add() and rmsnorm() run (so the bits are theirs); for
// decode's one row, s is still in L1 when the norm reads it.
template <class T>
struct AddRmsNormCpu {
  static void run(AddRmsNormArgs& a) {
    const std::int64_t n = a.s.numel(), unit = 1;
    kc::binary<T>(kc::BinaryOp::Add, 1, &n, a.x.template data<T>(), &unit, a.r.template data<T>(),
                  &unit, a.s.template data<T>());
    kc::rmsnorm_forward<T>(rows_of(a.s), a.w.size(0), a.eps, a.s.template data<T>(),
                           a.w.template data<T>(), a.y.template data<T>(),
                           a.rstd.template data<kc::compute_t<T>>());
  }
};

// The kernel accumulates dw in its compute dtype (f32 for bf16/f16): straight into dw when it
// has that dtype, else into a zeroed buffer added to dw after (or dropped when no dw is wanted).
bool rmsnorm_dw_direct(const RmsNormBackwardArgs& a, DType t) {
  return a.dw.defined() && a.dw.dtype() == compute_dtype(t);
}
ScratchList rmsnorm_backward_scratch(const RmsNormBackwardArgs& a, DType t) {
  if (rmsnorm_dw_direct(a, t)) return {};
  return {a.w.size(0) * static_cast<std::int64_t>(dtype_size(compute_dtype(t)))};
}

template <class T>
struct RmsNormBackwardCpu {
  static void run(RmsNormBackwardArgs& a) {
    using C = kc::compute_t<T>;
    const DType t = a.dx.dtype();
    Tensor dw = a.dw;
    if (!rmsnorm_dw_direct(a, t)) {
      MemoryScope scratch(MemCategory::Temporaries);
      dw = zeros(a.w.shape(), compute_dtype(t), a.w.device());
    }
    kc::rmsnorm_backward<T>(rows_of(a.x), a.w.size(0), a.x.template data<T>(),
                            a.w.template data<T>(), a.rstd.template data<C>(),
                            a.dy.template data<T>(), a.dx.template data<T>(),
                            dw.template data<C>());
    if (a.dw.defined() && dw.impl() != a.dw.impl()) axpy_(a.dw, 1.0, dw);
  }
};

template <class T>
struct LayerNormCpu {
  static void run(LayerNormArgs& a) {
    kc::layernorm_forward<T>(
        rows_of(a.x), a.w.size(0), a.eps, a.x.template data<T>(), a.w.template data<T>(),
        a.b.defined() ? a.b.template data<T>() : nullptr, a.y.template data<T>(),
        a.mean.template data<kc::compute_t<T>>(), a.rstd.template data<kc::compute_t<T>>());
  }
};

// The kernel writes dw and db into zeroed buffers of its compute dtype, added to dw/db after when
// wanted.
ScratchList layernorm_backward_scratch(const LayerNormBackwardArgs& a, DType t) {
  const std::int64_t n = a.w.size(0) * static_cast<std::int64_t>(dtype_size(compute_dtype(t)));
  return {n, n};
}

template <class T>
struct LayerNormBackwardCpu {
  static void run(LayerNormBackwardArgs& a) {
    using C = kc::compute_t<T>;
    MemoryScope scratch(MemCategory::Temporaries);
    Tensor dw = zeros(a.w.shape(), compute_dtype(a.dx.dtype()), a.w.device());
    Tensor db = zeros(a.w.shape(), compute_dtype(a.dx.dtype()), a.w.device());
    kc::layernorm_backward<T>(
        rows_of(a.x), a.w.size(0), a.x.template data<T>(), a.w.template data<T>(),
        a.mean.template data<C>(), a.rstd.template data<C>(), a.dy.template data<T>(),
        a.dx.template data<T>(), dw.template data<C>(), db.template data<C>());
    if (a.dw.defined()) axpy_(a.dw, 1.0, dw);
    if (a.db.defined()) axpy_(a.db, 1.0, db);
  }
};

template <class T>
struct RopeTablesCpu {
  static void run(RopeTablesArgs& a) {
    kc::rope_tables<T>(a.max_pos, a.head_dim, a.theta, a.cos.template data<T>(),
                       a.sin.template data<T>());
  }
};

template <class T>
struct RopeCpu {
  static void run(RopeArgs& a) {
    using C = kc::compute_t<T>;
    KILN_CHECK(a.cos.dtype() == compute_dtype(a.out.dtype()) && a.sin.dtype() == a.cos.dtype(),
               "[rope] table dtype {} vs compute dtype {}", dtype_name(a.cos.dtype()),
               dtype_name(compute_dtype(a.out.dtype())));
    const auto s = static_cast<kc::RopeStyle>(a.style);
    const std::int64_t B = a.x.size(0), Tn = a.x.size(1), H = a.x.size(2), D = a.x.size(3);
    if (a.backward)
      kc::rope_backward<T>(s, B, Tn, H, D, a.cos.template data<C>(), a.sin.template data<C>(),
                           nullptr, a.pos_offset, a.x.template data<T>(), a.out.template data<T>());
    else
      kc::rope_forward<T>(s, B, Tn, H, D, a.cos.template data<C>(), a.sin.template data<C>(),
                          nullptr, a.pos_offset, a.x.template data<T>(), a.out.template data<T>());
  }
};

// The pointwise activations (kernels/op_list.h: kActivations), one glue for all.
template <Op O>
struct ActivationCpu {
  template <class T>
  struct Forward {
    static void run(ActivationArgs<O>& a) {
      kc::activation_forward<T>(O, a.x.numel(), a.x.template data<T>(), a.y.template data<T>());
    }
  };
  template <class T>
  struct Backward {
    static void run(ActivationBackwardArgs<O>& a) {
      kc::activation_backward<T>(O, a.x.numel(), a.x.template data<T>(), a.dy.template data<T>(),
                                 a.dx.template data<T>());
    }
  };
};

template <class T>
struct SwiGluCpu {
  static void run(SwiGluArgs& a) {
    kc::swiglu_forward<T>(a.gate.numel(), a.gate.template data<T>(), a.up.template data<T>(),
                          a.out.template data<T>());
  }
};

template <class T>
struct SwiGluBackwardCpu {
  static void run(SwiGluBackwardArgs& a) {
    kc::swiglu_backward<T>(a.gate.numel(), a.gate.template data<T>(), a.up.template data<T>(),
                           a.dout.template data<T>(), a.dgate.template data<T>(),
                           a.dup.template data<T>());
  }
};

// q dense; k and v need dense (T, H, D) only: a KV-cache view with a larger batch stride is
// read in place.
bool attention_accepts(int slot, const Tensor& t) {
  if (slot == 0) return t.is_contiguous();
  if (slot == 1 || slot == 2)
    return t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3) &&
           t.stride(1) == t.size(2) * t.size(3);
  return true;
}

template <class T>
struct AttentionCpu {
  static void run(AttentionArgs& a) {
    const std::int64_t B = a.q.size(0), Tq = a.q.size(1), Hq = a.q.size(2), D = a.q.size(3);
    kc::attention_forward<T>(B, Tq, a.k.size(1), Hq, a.k.size(2), D, a.q_offset, a.scale,
                             a.q.template data<T>(), a.k.template data<T>(), a.v.template data<T>(),
                             a.k.stride(0), a.out.template data<T>(),
                             a.lse.template data<kc::compute_t<T>>());
  }
};

template <class T>
struct AttentionBackwardCpu {
  static void run(AttentionBackwardArgs& a) {
    const std::int64_t B = a.q.size(0), Tn = a.q.size(1), Hq = a.q.size(2), D = a.q.size(3);
    kc::attention_backward<T>(B, Tn, Hq, a.k.size(2), D, a.scale, a.q.template data<T>(),
                              a.k.template data<T>(), a.v.template data<T>(),
                              a.out.template data<T>(), a.lse.template data<kc::compute_t<T>>(),
                              a.dout.template data<T>(), a.dq.template data<T>(),
                              a.dk.template data<T>(), a.dv.template data<T>());
  }
};

template <class T>
struct PagedAttentionCpu {
  static void run(PagedAttentionArgs& a) {
    kc::paged_attention_forward<T>(
        a.q.size(0), a.q.size(1), a.k_pool.size(2), a.q.size(2), a.k_pool.size(1),
        a.block_tables.size(1), a.scale, a.q.template data<T>(), a.k_pool.template data<T>(),
        a.v_pool.template data<T>(), a.block_tables.template data<std::int32_t>(),
        a.token_seq.template data<std::int32_t>(), a.token_pos.template data<std::int32_t>(),
        a.out.template data<T>());
  }
};

template <class T>
struct CrossEntropyCpu {
  static void run(CrossEntropyArgs& a) {
    kc::cross_entropy_forward<T>(a.logits.size(0), a.logits.size(1), a.logits.template data<T>(),
                                 a.targets.template data<std::int32_t>(), a.ignore_index,
                                 a.loss.template data<kc::compute_t<T>>(),
                                 a.lse.template data<kc::compute_t<T>>());
  }
};

// The kernel reads each row's target logit before overwriting the row, so dlogits may alias
// the logits (in place).
template <class T>
struct CrossEntropyBackwardCpu {
  static void run(CrossEntropyBackwardArgs& a) {
    using C = kc::compute_t<T>;
    kc::cross_entropy_backward<T>(a.logits.size(0), a.logits.size(1), a.logits.template data<T>(),
                                  a.lse.template data<C>(), a.targets.template data<std::int32_t>(),
                                  a.ignore_index, a.dloss.template data<C>(),
                                  a.dlogits.template data<T>());
  }
};

template <class T>
struct DropoutCpu {
  static void run(DropoutArgs& a) {
    kc::dropout_forward<T>(a.x.numel(), static_cast<float>(a.p), a.seed, a.offset,
                           a.x.template data<T>(), a.y.template data<T>(),
                           a.mask.template data<std::uint8_t>());
  }
};

template <class T>
struct DropoutBackwardCpu {
  static void run(DropoutBackwardArgs& a) {
    kc::dropout_backward<T>(a.dy.numel(), static_cast<float>(a.p),
                            a.mask.template data<std::uint8_t>(), a.dy.template data<T>(),
                            a.dx.template data<T>());
  }
};

void adamw_cpu(AdamWArgs& a) {
  kc::adamw_step(a.param.numel(), a.param.data<float>(), a.grad.data<float>(), a.m.data<float>(),
                 a.v.data<float>(), static_cast<float>(a.lr), static_cast<float>(a.beta1),
                 static_cast<float>(a.beta2), static_cast<float>(a.eps),
                 static_cast<float>(a.weight_decay), a.step);
}

void adamw_cpu_f64(AdamWArgs& a) {
  kc::adamw_step(a.param.numel(), a.param.data<double>(), a.grad.data<double>(), a.m.data<double>(),
                 a.v.data<double>(), a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step);
}

// A bf16/f16 parameter with an f32 master: the master is updated from the gradient read in
// its own dtype (widened a chunk at a time on the stack), then rounded into the parameter.
template <class P, class G>
void adamw_master_item(AdamWTensors& it, const AdamWMultiArgs& a) {
  kc::adamw_step_master<P, G>(it.param.numel(), it.param.data<P>(), it.master.data<float>(),
                              it.grad.data<G>(), it.m.data<float>(), it.v.data<float>(),
                              static_cast<float>(a.lr), static_cast<float>(a.beta1),
                              static_cast<float>(a.beta2), static_cast<float>(a.eps),
                              static_cast<float>(it.weight_decay), a.step);
}

// Item by item: f32 (and f64) parameters as adamw_step_, bf16/f16 ones through their masters.
void adamw_multi_cpu(AdamWMultiArgs& a) {
  for (auto& it : a.items) {
    if (!it.master.defined()) {
      adamw_step_(it.param, it.grad, it.m, it.v, a.lr, a.beta1, a.beta2, a.eps, it.weight_decay,
                  a.step);
      continue;
    }
    const DType p = it.param.dtype(), g = it.grad.dtype();
    KILN_CHECK(it.param.is_contiguous() && (p == DType::BF16 || p == DType::F16) &&
                   (g == p || g == DType::F32),
               "[adamw] a master's parameter must be contiguous bf16/f16 with a gradient of its "
               "dtype or f32, got {} with {}",
               dtype_name(p), dtype_name(g));
    if (p == DType::BF16)
      g == p ? adamw_master_item<bf16, bf16>(it, a) : adamw_master_item<bf16, float>(it, a);
    else
      g == p ? adamw_master_item<f16, f16>(it, a) : adamw_master_item<f16, float>(it, a);
  }
}

void sgd_cpu(SgdArgs& a) {
  kc::sgd_step(a.param.numel(), a.param.data<float>(), a.grad.data<float>(),
               a.momentum_buf.defined() ? a.momentum_buf.data<float>() : nullptr,
               static_cast<float>(a.lr), static_cast<float>(a.momentum),
               static_cast<float>(a.dampening), static_cast<float>(a.weight_decay), a.nesterov,
               a.step);
}

}  // namespace

void register_nn() {
  register_float_storage<SoftmaxArgs, SoftmaxCpu>();
  register_float_storage<SoftmaxBackwardArgs, SoftmaxBackwardCpu>();
  register_float_storage<EmbeddingArgs, EmbeddingCpu>();
  register_float_storage<EmbeddingBackwardArgs, EmbeddingBackwardCpu>();
  register_float_storage<RmsNormArgs, RmsNormCpu>();
  register_float_storage<AddRmsNormArgs, AddRmsNormCpu>();
  register_float_storage<RmsNormBackwardArgs, RmsNormBackwardCpu>(
      {.scratch = &rmsnorm_backward_scratch});
  register_float_storage<LayerNormArgs, LayerNormCpu>();
  register_float_storage<LayerNormBackwardArgs, LayerNormBackwardCpu>(
      {.scratch = &layernorm_backward_scratch});
  register_float<RopeTablesArgs, RopeTablesCpu>();
  register_float_storage<RopeArgs, RopeCpu>();
  for_each_activation([&]<Op O>() {
    register_float_storage<ActivationArgs<O>, ActivationCpu<O>::template Forward>();
    register_float_storage<ActivationBackwardArgs<O>, ActivationCpu<O>::template Backward>();
  });
  register_float_storage<SwiGluArgs, SwiGluCpu>();
  register_float_storage<SwiGluBackwardArgs, SwiGluBackwardCpu>();
  register_float<AttentionArgs, AttentionCpu>({.accepts = &attention_accepts});
  register_float<AttentionBackwardArgs, AttentionBackwardCpu>();
  register_float<CrossEntropyArgs, CrossEntropyCpu>();
  register_float<CrossEntropyBackwardArgs, CrossEntropyBackwardCpu>();
  // Native bf16 (storage bf16, math in f32; statistics f32): no f32 conversion copies.
  register_bf16<AttentionArgs, AttentionCpu>({.accepts = &attention_accepts});
  register_bf16<AttentionBackwardArgs, AttentionBackwardCpu>();
  // f16's forward too (an f16 model's prefill and decode); its backward converts.
  register_kernel<AttentionArgs>(DeviceType::CPU, DType::F16,
                                 {.run = &AttentionCpu<f16>::run, .accepts = &attention_accepts});
  register_bf16<CrossEntropyArgs, CrossEntropyCpu>();
  register_bf16<CrossEntropyBackwardArgs, CrossEntropyBackwardCpu>();
  register_float_storage<DropoutArgs, DropoutCpu>();
  register_float_storage<DropoutBackwardArgs, DropoutBackwardCpu>();
  register_kernel<AdamWArgs>(DeviceType::CPU, DType::F32, {.run = &adamw_cpu});
  register_kernel<AdamWArgs>(DeviceType::CPU, DType::F64, {.run = &adamw_cpu_f64});
  register_kernel<AdamWMultiArgs>(DeviceType::CPU, DType::F32, {.run = &adamw_multi_cpu});
  register_kernel<SgdArgs>(DeviceType::CPU, DType::F32, {.run = &sgd_cpu});
}

}  // namespace cpu_glue

void register_cpu_kernels() {
  cpu_glue::register_basic();
  cpu_glue::register_matmul_bf16();
  cpu_glue::register_nn();
}

void PagedAttentionArgs::register_cpu() {
  cpu_glue::register_float<PagedAttentionArgs, cpu_glue::PagedAttentionCpu>();
  cpu_glue::register_bf16<PagedAttentionArgs, cpu_glue::PagedAttentionCpu>();
}

}  // namespace kiln::ops
