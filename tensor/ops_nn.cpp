// Front end for the nn kernels: softmax, embedding, norms, RoPE, activations,
// attention, cross-entropy, dropout and the optimizer steps.
#include <cmath>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/norm.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops_util.h"

namespace kiln::ops {

namespace {

std::int64_t rows_of(const Tensor& x) {
  return x.dim() == 0 ? 1 : x.numel() / std::max<std::int64_t>(x.size(-1), 1);
}

// Runs a kernel that maps same-shape inputs to one same-shape output, in the
// compute dtype, converting bf16/f16 in and out.
template <typename F>
Tensor map_kernel(const char* op, const Tensor& like, F&& f) {
  Tensor out = empty_like(like);
  if (skip_kernel(out, op)) return out;
  Tensor co = compute_out(out);
  dispatch_compute(co.dtype(), op, [&](auto tag) { f(tag, co); });
  finish_out(out, co);
  return out;
}

// A dry run that simulates CUDA (meta, --simulate cuda) also charges the f32 scratch the CUDA
// launchers allocate inside an op, from their own size functions: it is alive together, then
// freed, as there.
bool simulates_cuda(const Tensor& out) {
  return out.device().is_meta() && meta_simulates() == DeviceType::CUDA && out.numel() > 0;
}
void charge_cuda_scratch(std::initializer_list<std::int64_t> floats) {
  MemoryScope scratch(MemCategory::Temporaries);
  std::vector<Tensor> alive;
  for (std::int64_t n : floats)
    if (n > 0) alive.push_back(Tensor::empty({n}, DType::F32, Device::meta()));
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.shape() == b.shape(), "[{}] shapes {} and {} differ", op, shape_str(a.shape()),
             shape_str(b.shape()));
}

}  // namespace

// ---- softmax --------------------------------------------------------------------

Tensor softmax(const Tensor& x) {
  if (device_path(x)) {
    Tensor y = empty_like(x);
    if (run_cuda(y)) cuda_ops::softmax(x, false, y);
    return y;
  }
  Computed cx(x, true);
  return map_kernel("softmax", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::softmax_forward<T>(rows_of(x), x.size(-1), cx.t.data<T>(), o.data<T>());
  });
}
Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  check_same_shape(y, dy, "softmax");
  if (device_path(y)) {
    Tensor dx = empty_like(y);
    if (run_cuda(dx)) cuda_ops::softmax_backward(y, dy, false, dx);
    return dx;
  }
  Computed cy(y, true), cdy(dy, true);
  return map_kernel("softmax", y, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::softmax_backward<T>(rows_of(y), y.size(-1), cy.t.data<T>(), cdy.t.data<T>(),
                             o.data<T>());
  });
}
Tensor log_softmax(const Tensor& x) {
  if (device_path(x)) {
    Tensor y = empty_like(x);
    if (run_cuda(y)) cuda_ops::softmax(x, true, y);
    return y;
  }
  Computed cx(x, true);
  return map_kernel("log_softmax", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::log_softmax_forward<T>(rows_of(x), x.size(-1), cx.t.data<T>(), o.data<T>());
  });
}
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) {
  check_same_shape(y, dy, "log_softmax");
  if (device_path(y)) {
    Tensor dx = empty_like(y);
    if (run_cuda(dx)) cuda_ops::softmax_backward(y, dy, true, dx);
    return dx;
  }
  Computed cy(y, true), cdy(dy, true);
  return map_kernel("log_softmax", y, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::log_softmax_backward<T>(rows_of(y), y.size(-1), cy.t.data<T>(), cdy.t.data<T>(),
                                 o.data<T>());
  });
}

// ---- embedding --------------------------------------------------------------------

Tensor embedding(const Tensor& ids, const Tensor& table) {
  KILN_CHECK(ids.dtype() == DType::I32, "[embedding] token ids must be i32, got {}",
             dtype_name(ids.dtype()));
  KILN_CHECK(table.dim() == 2, "[embedding] table must be 2-d, got {}", shape_str(table.shape()));
  check_same_device(ids, table, "embedding");
  Shape shape = ids.shape();
  shape.push_back(table.size(1));
  Tensor out = Tensor::empty(shape, table.dtype(), table.device());
  if (skip_kernel(out, "embedding")) return out;
  if (out.device().is_cuda()) {
    cuda_ops::embedding(ids, table, out);
    return out;
  }
  Tensor cids = ids.contiguous();
  Computed ct(table, true);
  Tensor co = compute_out(out);
  dispatch_compute(co.dtype(), "embedding", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::embedding_forward<T>(ids.numel(), table.size(0), table.size(1),
                              cids.data<std::int32_t>(), ct.t.data<T>(), co.data<T>());
  });
  finish_out(out, co);
  return out;
}

void embedding_backward_(Tensor& dtable, const Tensor& ids, const Tensor& dout) {
  KILN_CHECK(dtable.is_contiguous() && dtable.dim() == 2, "[embedding] bad gradient buffer");
  KILN_CHECK(dout.numel() == ids.numel() * dtable.size(1), "[embedding] dout {} vs ids {}",
             shape_str(dout.shape()), shape_str(ids.shape()));
  if (skip_kernel(dtable, "embedding")) return;
  if (dtable.device().is_cuda()) return cuda_ops::embedding_backward(dtable, ids, dout);
  KILN_CHECK(dtable.dtype() == DType::F32 || dtable.dtype() == DType::F64,
             "[embedding] backward accumulates into f32/f64");
  Tensor cids = ids.contiguous();
  Computed cd(dout.dtype() == dtable.dtype() ? dout : dout.to(dtable.dtype()), true);
  dispatch_compute(dtable.dtype(), "embedding", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::embedding_backward<T>(ids.numel(), dtable.size(0), dtable.size(1),
                               cids.data<std::int32_t>(), cd.t.data<T>(), dtable.data<T>());
  });
}

// ---- norms ----------------------------------------------------------------------

std::tuple<Tensor, Tensor> rmsnorm(const Tensor& x, const Tensor& w, double eps) {
  KILN_CHECK(w.dim() == 1 && x.dim() >= 1 && x.size(-1) == w.size(0),
             "[rmsnorm] input {} does not match weight {}", shape_str(x.shape()),
             shape_str(w.shape()));
  std::int64_t rows = rows_of(x);
  Tensor rstd = Tensor::empty({rows}, compute_dtype(x.dtype()), x.device());
  if (device_path(x)) {
    Tensor y = empty_like(x);
    if (run_cuda(y)) cuda_ops::rmsnorm(x, w, eps, y, rstd);
    return {y, rstd};
  }
  Computed cx(x, true), cw(w, true);
  Tensor y = map_kernel("rmsnorm", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::rmsnorm_forward<T>(rows, w.size(0), eps, cx.t.data<T>(), cw.t.data<T>(), o.data<T>(),
                            rstd.data<T>());
  });
  return {y, rstd};
}

Tensor rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                        Tensor* dw) {
  check_same_shape(x, dy, "rmsnorm");
  std::int64_t rows = rows_of(x);
  if (device_path(x)) {
    Tensor dx = empty_like(x);
    if (run_cuda(dx)) cuda_ops::rmsnorm_backward(x, w, rstd, dy, dx, dw);
    if (simulates_cuda(dx) && dw && dw->defined())  // the kernel's f32 dw partial sums
      charge_cuda_scratch({cuda::norm_backward_scratch_floats(rows, w.size(0), false)});
    return dx;
  }
  Computed cx(x, true), cw(w, true), cdy(dy, true);
  return map_kernel("rmsnorm", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    Tensor dw_buf;
    if (dw && dw->defined() && dw->dtype() == o.dtype()) {
      dw_buf = *dw;
    } else {
      MemoryScope scratch(MemCategory::Temporaries);
      dw_buf = zeros(w.shape(), o.dtype(), w.device());
    }
    cpu::rmsnorm_backward<T>(rows, w.size(0), cx.t.data<T>(), cw.t.data<T>(), rstd.data<T>(),
                             cdy.t.data<T>(), o.data<T>(), dw_buf.data<T>());
    if (dw && dw->defined() && dw_buf.impl() != dw->impl()) axpy_(*dw, 1.0, dw_buf);
  });
}

std::tuple<Tensor, Tensor, Tensor> layernorm(const Tensor& x, const Tensor& w, const Tensor& b,
                                             double eps) {
  KILN_CHECK(w.dim() == 1 && (!b.defined() || b.shape() == w.shape()) &&
                 x.size(-1) == w.size(0),
             "[layernorm] input {} does not match weight {} / bias {}", shape_str(x.shape()),
             shape_str(w.shape()), b.defined() ? shape_str(b.shape()) : "none");
  std::int64_t rows = rows_of(x);
  Tensor mean = Tensor::empty({rows}, compute_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({rows}, compute_dtype(x.dtype()), x.device());
  if (device_path(x)) {
    Tensor y = empty_like(x);
    if (run_cuda(y)) cuda_ops::layernorm(x, w, b, eps, y, mean, rstd);
    return {y, mean, rstd};
  }
  Computed cx(x, true), cw(w, true), cb(b, true);
  Tensor y = map_kernel("layernorm", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::layernorm_forward<T>(rows, w.size(0), eps, cx.t.data<T>(), cw.t.data<T>(),
                              cb.t.defined() ? cb.t.data<T>() : nullptr, o.data<T>(),
                              mean.data<T>(), rstd.data<T>());
  });
  return {y, mean, rstd};
}

Tensor layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dy, Tensor* dw, Tensor* db) {
  check_same_shape(x, dy, "layernorm");
  std::int64_t rows = rows_of(x);
  if (device_path(x)) {
    Tensor dx = empty_like(x);
    if (run_cuda(dx)) cuda_ops::layernorm_backward(x, w, mean, rstd, dy, dx, dw, db);
    if (simulates_cuda(dx)) {  // the kernel's f32 dw and db partial sums, one buffer each
      const std::int64_t n = cuda::norm_backward_scratch_floats(rows, w.size(0), false);
      charge_cuda_scratch({dw && dw->defined() ? n : 0, db && db->defined() ? n : 0});
    }
    return dx;
  }
  Computed cx(x, true), cw(w, true), cdy(dy, true);
  return map_kernel("layernorm", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    MemoryScope scratch(MemCategory::Temporaries);
    Tensor dw_buf = zeros(w.shape(), o.dtype(), w.device());
    Tensor db_buf = zeros(w.shape(), o.dtype(), w.device());
    cpu::layernorm_backward<T>(rows, w.size(0), cx.t.data<T>(), cw.t.data<T>(), mean.data<T>(),
                               rstd.data<T>(), cdy.t.data<T>(), o.data<T>(), dw_buf.data<T>(),
                               db_buf.data<T>());
    if (dw && dw->defined()) axpy_(*dw, 1.0, dw_buf);
    if (db && db->defined()) axpy_(*db, 1.0, db_buf);
  });
}

// ---- RoPE -----------------------------------------------------------------------

std::tuple<Tensor, Tensor> rope_tables(std::int64_t max_pos, std::int64_t head_dim, double theta,
                                       DType dtype, Device device) {
  KILN_CHECK(head_dim > 0 && head_dim % 2 == 0, "[rope] head_dim {} must be even", head_dim);
  DType cd = compute_dtype(dtype);
  Tensor cos = Tensor::empty({max_pos, head_dim / 2}, cd, device);
  Tensor sin = Tensor::empty({max_pos, head_dim / 2}, cd, device);
  if (skip_kernel(cos, "rope")) return {cos, sin};
  if (cos.device().is_cuda()) {
    cuda_ops::rope_tables(max_pos, head_dim, theta, cos, sin);
    return {cos, sin};
  }
  dispatch_compute(cd, "rope", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::rope_tables<T>(max_pos, head_dim, theta, cos.data<T>(), sin.data<T>());
  });
  return {cos, sin};
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style,
            std::int64_t pos_offset, bool backward) {
  KILN_CHECK(x.dim() == 4, "[rope] x must be (B, T, H, D), got {}", shape_str(x.shape()));
  std::int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  KILN_CHECK(cos.dim() == 2 && cos.size(1) * 2 == D && pos_offset >= 0 &&
                 pos_offset + T <= cos.size(0),
             "[rope] positions [{}, {}) exceed the table of {} positions (head_dim {})", pos_offset,
             pos_offset + T, cos.size(0), D);
  if (device_path(x)) {
    Tensor out = empty_like(x);
    if (run_cuda(out)) cuda_ops::rope(x, cos, sin, style, pos_offset, backward, out);
    return out;
  }
  Computed cx(x, true);
  return map_kernel("rope", x, [&](auto tag, Tensor& o) {
    using Tp = typename decltype(tag)::type;
    KILN_CHECK(cos.dtype() == o.dtype(), "[rope] table dtype {} vs compute dtype {}",
               dtype_name(cos.dtype()), dtype_name(o.dtype()));
    auto s = static_cast<cpu::RopeStyle>(style);
    if (backward)
      cpu::rope_backward<Tp>(s, B, T, H, D, cos.data<Tp>(), sin.data<Tp>(), nullptr, pos_offset,
                             cx.t.data<Tp>(), o.data<Tp>());
    else
      cpu::rope_forward<Tp>(s, B, T, H, D, cos.data<Tp>(), sin.data<Tp>(), nullptr, pos_offset,
                            cx.t.data<Tp>(), o.data<Tp>());
  });
}

// ---- activations ----------------------------------------------------------------

Tensor silu(const Tensor& x) {
  if (device_path(x)) {
    Tensor y = empty_like(x);
    if (run_cuda(y)) cuda_ops::silu(x, y);
    return y;
  }
  Computed cx(x, true);
  return map_kernel("silu", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::silu_forward<T>(x.numel(), cx.t.data<T>(), o.data<T>());
  });
}
Tensor silu_backward(const Tensor& x, const Tensor& dy) {
  check_same_shape(x, dy, "silu");
  if (device_path(x)) {
    Tensor dx = empty_like(x);
    if (run_cuda(dx)) cuda_ops::silu_backward(x, dy, dx);
    return dx;
  }
  Computed cx(x, true), cdy(dy, true);
  return map_kernel("silu", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::silu_backward<T>(x.numel(), cx.t.data<T>(), cdy.t.data<T>(), o.data<T>());
  });
}
Tensor gelu(const Tensor& x) {
  if (device_path(x)) {
    Tensor y = empty_like(x);
    if (run_cuda(y)) cuda_ops::gelu(x, y);
    return y;
  }
  Computed cx(x, true);
  return map_kernel("gelu", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::gelu_tanh_forward<T>(x.numel(), cx.t.data<T>(), o.data<T>());
  });
}
Tensor gelu_backward(const Tensor& x, const Tensor& dy) {
  check_same_shape(x, dy, "gelu");
  if (device_path(x)) {
    Tensor dx = empty_like(x);
    if (run_cuda(dx)) cuda_ops::gelu_backward(x, dy, dx);
    return dx;
  }
  Computed cx(x, true), cdy(dy, true);
  return map_kernel("gelu", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::gelu_tanh_backward<T>(x.numel(), cx.t.data<T>(), cdy.t.data<T>(), o.data<T>());
  });
}
Tensor swiglu(const Tensor& gate, const Tensor& up) {
  check_same_shape(gate, up, "swiglu");
  if (device_path(gate)) {
    Tensor out = empty_like(gate);
    if (run_cuda(out)) cuda_ops::swiglu(gate, up, out);
    return out;
  }
  Computed cg(gate, true), cu(up, true);
  return map_kernel("swiglu", gate, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::swiglu_forward<T>(gate.numel(), cg.t.data<T>(), cu.t.data<T>(), o.data<T>());
  });
}
std::tuple<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up,
                                           const Tensor& dout) {
  check_same_shape(gate, dout, "swiglu");
  if (device_path(gate)) {
    Tensor dgate = empty_like(gate), dup = empty_like(up);
    if (run_cuda(dgate)) cuda_ops::swiglu_backward(gate, up, dout, dgate, dup);
    return {dgate, dup};
  }
  Computed cg(gate, true), cu(up, true), cd(dout, true);
  Tensor dup = empty_like(up);
  Tensor dgate = map_kernel("swiglu", gate, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    Tensor cdup = compute_out(dup);
    cpu::swiglu_backward<T>(gate.numel(), cg.t.data<T>(), cu.t.data<T>(), cd.t.data<T>(),
                            o.data<T>(), cdup.data<T>());
    finish_out(dup, cdup);
  });
  return {dgate, dup};
}

// ---- attention ------------------------------------------------------------------

static void check_attention_layout(const Tensor& t, const char* what) {
  // Inner (T, H, D) dims must be dense; the batch stride may be larger (KV cache).
  KILN_CHECK(t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3) &&
                 t.stride(1) == t.size(2) * t.size(3),
             "[attention] {} must be (B, T, H, D) with dense T/H/D, got shape {} strides {}", what,
             shape_str(t.shape()), shape_str(t.strides()));
}

std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                     double scale, std::int64_t q_offset) {
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape(),
             "[attention] q {} k {} v {}: expected (B, T, H, D) with k and v alike",
             shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  std::int64_t B = q.size(0), Tq = q.size(1), Hq = q.size(2), D = q.size(3);
  std::int64_t Tk = k.size(1), Hkv = k.size(2);
  KILN_CHECK(k.size(0) == B && k.size(3) == D, "[attention] q {} and k {} disagree",
             shape_str(q.shape()), shape_str(k.shape()));
  KILN_CHECK(Hkv > 0 && Hq % Hkv == 0, "[attention] {} query heads not divisible by {} kv heads",
             Hq, Hkv);
  KILN_CHECK(q_offset >= 0 && q_offset + Tq <= Tk,
             "[attention] queries at [{}, {}) need keys up to {}, have {}", q_offset,
             q_offset + Tq, q_offset + Tq, Tk);
  KILN_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), "[attention] dtype mismatch");
  KILN_CHECK(k.stride(0) == v.stride(0), "[attention] k and v batch strides differ");
  Tensor lse = Tensor::empty({B, Hq, Tq}, compute_dtype(q.dtype()), q.device());
  if (device_path(q)) {
    check_attention_layout(k, "k");
    check_attention_layout(v, "v");
    Tensor out = empty_like(q);
    if (run_cuda(out)) {
      Tensor cq = q.contiguous();
      if (attention_impl() == AttentionImpl::Cudnn)
        cuda_ops::attention_cudnn(cq, k, v, scale, q_offset, out, lse);
      else
        cuda_ops::attention(cq, k, v, scale, q_offset, out, lse);
    }
    return {out, lse};
  }
  Computed cq(q, true);
  // Keep a KV-cache view as is when it already has the compute dtype.
  Tensor ck = k, cv = v;
  if (k.dtype() != compute_dtype(k.dtype()) || !(k.stride(3) == 1 && k.stride(2) == D &&
                                                 k.stride(1) == Hkv * D)) {
    MemoryScope scratch(MemCategory::Temporaries);
    ck = Computed(k, true).t;
    cv = Computed(v, true).t;
  }
  check_attention_layout(ck, "k");
  check_attention_layout(cv, "v");
  Tensor out = map_kernel("attention", q, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::attention_forward<T>(B, Tq, Tk, Hq, Hkv, D, q_offset, scale, cq.t.data<T>(),
                              ck.data<T>(), cv.data<T>(), ck.stride(0), o.data<T>(),
                              lse.data<T>());
  });
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> attention_backward(const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& out,
                                                      const Tensor& lse, const Tensor& dout,
                                                      double scale) {
  check_same_shape(q, out, "attention");
  check_same_shape(out, dout, "attention");
  KILN_CHECK(q.size(1) == k.size(1), "[attention] backward needs Tq == Tk (training)");
  std::int64_t B = q.size(0), T = q.size(1), Hq = q.size(2), D = q.size(3), Hkv = k.size(2);
  if (device_path(q)) {
    Tensor dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
    if (simulates_cuda(dq)) {
      // A dry run simulating CUDA charges the scratch its launcher makes: Di (B, Hq, T) f32
      // and, on the bf16 tensor-core path, the f32 dQ accumulator (B, T, Hq, D).
      const auto plan = cuda::plan_attention_backward(
          cuda::training_attention_shape(B, T, Hq, Hkv, D), q.dtype() == DType::BF16, true);
      charge_cuda_scratch({plan.scratch_floats});
    }
    if (run_cuda(dq)) {
      Tensor cq = q.contiguous(), ck = k.contiguous(), cv = v.contiguous();
      Tensor co = out.contiguous(), cdo = dout.contiguous();
      if (attention_impl() == AttentionImpl::Cudnn)
        cuda_ops::attention_backward_cudnn(cq, ck, cv, co, lse, cdo, scale, dq, dk, dv);
      else
        cuda_ops::attention_backward(cq, ck, cv, co, lse, cdo, scale, dq, dk, dv);
    }
    return {dq, dk, dv};
  }
  Computed cq(q, true), ck(k, true), cv(v, true), co(out, true), cdo(dout, true);
  Tensor dk = empty_like(k), dv = empty_like(v);
  Tensor dq = map_kernel("attention", q, [&](auto tag, Tensor& o) {
    using Tp = typename decltype(tag)::type;
    Tensor cdk = compute_out(dk), cdv = compute_out(dv);
    cpu::attention_backward<Tp>(B, T, Hq, Hkv, D, scale, cq.t.data<Tp>(), ck.t.data<Tp>(),
                                cv.t.data<Tp>(), co.t.data<Tp>(), lse.data<Tp>(),
                                cdo.t.data<Tp>(), o.data<Tp>(), cdk.data<Tp>(), cdv.data<Tp>());
    finish_out(dk, cdk);
    finish_out(dv, cdv);
  });
  return {dq, dk, dv};
}

// ---- cross-entropy --------------------------------------------------------------

std::tuple<Tensor, Tensor> cross_entropy(const Tensor& logits, const Tensor& targets,
                                         std::int32_t ignore_index) {
  KILN_CHECK(logits.dim() == 2, "[cross_entropy] logits must be (N, V), got {}",
             shape_str(logits.shape()));
  KILN_CHECK(targets.dtype() == DType::I32 && targets.numel() == logits.size(0),
             "[cross_entropy] targets must be i32 with {} elements, got {} {}", logits.size(0),
             dtype_name(targets.dtype()), shape_str(targets.shape()));
  std::int64_t N = logits.size(0), V = logits.size(1);
  DType cd = compute_dtype(logits.dtype());
  Tensor loss = Tensor::empty({N}, cd, logits.device());
  Tensor lse = Tensor::empty({N}, cd, logits.device());
  if (skip_kernel(loss, "cross_entropy")) return {loss, lse};
  if (loss.device().is_cuda()) {
    cuda_ops::cross_entropy(logits, targets, ignore_index, loss, lse);
    return {loss, lse};
  }
  Computed cl(logits, true);
  Tensor ct = targets.contiguous();
  dispatch_compute(cd, "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::cross_entropy_forward<T>(N, V, cl.t.data<T>(), ct.data<std::int32_t>(), ignore_index,
                                  loss.data<T>(), lse.data<T>());
  });
  return {loss, lse};
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                              const Tensor& dloss, std::int32_t ignore_index, bool in_place) {
  std::int64_t N = logits.size(0), V = logits.size(1);
  KILN_CHECK(dloss.numel() == N, "[cross_entropy] dloss has {} elements, want {}", dloss.numel(),
             N);
  if (device_path(logits)) {
    // CUDA writes dlogits in the logits' own dtype, so in place works for bf16 too.
    Tensor d = in_place && logits.is_contiguous() ? logits.detach() : empty_like(logits);
    if (run_cuda(d)) cuda_ops::cross_entropy_backward(logits, lse, targets, dloss, ignore_index, d);
    return d;
  }
  Computed cdl(dloss, true);
  Tensor ct = targets.contiguous();
  if (in_place && logits.is_contiguous() && logits.dtype() == compute_dtype(logits.dtype())) {
    // The kernel reads each row's target logit before overwriting the row, so it may alias.
    Tensor d = logits.detach();
    if (skip_kernel(d, "cross_entropy")) return d;
    dispatch_compute(d.dtype(), "cross_entropy", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cpu::cross_entropy_backward<T>(N, V, d.data<T>(), lse.data<T>(), ct.data<std::int32_t>(),
                                     ignore_index, cdl.t.data<T>(), d.data<T>());
    });
    return d;
  }
  Computed cl(logits, true);
  return map_kernel("cross_entropy", logits, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::cross_entropy_backward<T>(N, V, cl.t.data<T>(), lse.data<T>(), ct.data<std::int32_t>(),
                                   ignore_index, cdl.t.data<T>(), o.data<T>());
  });
}

// ---- dropout --------------------------------------------------------------------

std::tuple<Tensor, Tensor> dropout(const Tensor& x, double p, Generator& gen) {
  KILN_CHECK(p >= 0.0 && p < 1.0, "[dropout] p = {} must be in [0, 1)", p);
  Tensor mask = Tensor::empty(x.shape(), DType::Bool, x.device());
  std::uint64_t offset = gen.take(static_cast<std::uint64_t>(x.numel()));
  if (device_path(x)) {
    Tensor y = empty_like(x);
    if (run_cuda(y)) cuda_ops::dropout(x, p, gen.seed, offset, y, mask);
    return {y, mask};
  }
  Computed cx(x, true);
  Tensor y = map_kernel("dropout", x, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::dropout_forward<T>(x.numel(), static_cast<float>(p), gen.seed, offset, cx.t.data<T>(),
                            o.data<T>(), mask.data<std::uint8_t>());
  });
  return {y, mask};
}

Tensor dropout_backward(const Tensor& dy, const Tensor& mask, double p) {
  check_same_shape(dy, mask, "dropout");
  if (device_path(dy)) {
    Tensor dx = empty_like(dy);
    if (run_cuda(dx)) cuda_ops::dropout_backward(dy, mask, p, dx);
    return dx;
  }
  Computed cdy(dy, true);
  return map_kernel("dropout", dy, [&](auto tag, Tensor& o) {
    using T = typename decltype(tag)::type;
    cpu::dropout_backward<T>(dy.numel(), static_cast<float>(p), mask.data<std::uint8_t>(),
                             cdy.t.data<T>(), o.data<T>());
  });
}

// ---- optimizers -----------------------------------------------------------------

static void check_opt(const Tensor& p, const Tensor& g, const char* op) {
  KILN_CHECK(p.dtype() == DType::F32 && g.dtype() == DType::F32 && p.is_contiguous() &&
                 g.is_contiguous() && p.shape() == g.shape(),
             "[{}] needs contiguous f32 param and grad of one shape ({} vs {})", op,
             shape_str(p.shape()), shape_str(g.shape()));
}

void adamw_step_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, double lr,
                 double beta1, double beta2, double eps, double weight_decay, std::int64_t step) {
  check_opt(param, grad, "adamw");
  check_opt(m, v, "adamw");
  check_opt(param, m, "adamw");
  if (skip_kernel(param, "adamw")) return;
  if (param.device().is_cuda())
    return cuda_ops::adamw_step(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step);
  cpu::adamw_step(param.numel(), param.data<float>(), grad.data<float>(), m.data<float>(),
                  v.data<float>(), static_cast<float>(lr), static_cast<float>(beta1),
                  static_cast<float>(beta2), static_cast<float>(eps),
                  static_cast<float>(weight_decay), step);
}

void sgd_step_(Tensor& param, const Tensor& grad, Tensor& momentum_buf, double lr,
               double momentum, double dampening, double weight_decay, bool nesterov,
               std::int64_t step) {
  check_opt(param, grad, "sgd");
  if (skip_kernel(param, "sgd")) return;
  if (param.device().is_cuda())
    return cuda_ops::sgd_step(param, grad, momentum_buf, lr, momentum, dampening, weight_decay,
                              nesterov, step);
  cpu::sgd_step(param.numel(), param.data<float>(), grad.data<float>(),
                momentum_buf.defined() ? momentum_buf.data<float>() : nullptr,
                static_cast<float>(lr), static_cast<float>(momentum),
                static_cast<float>(dampening), static_cast<float>(weight_decay), nesterov, step);
}

void adamw_multi_step_(std::span<AdamWTensors> items, double lr, double beta1, double beta2,
                       double eps, std::int64_t step) {
  if (items.empty()) return;
  for (auto& it : items) {
    const Tensor& w = it.master.defined() ? it.master : it.param;
    check_opt(w, it.m, "adamw");
    check_opt(it.m, it.v, "adamw");
    KILN_CHECK(it.grad.shape() == w.shape() && it.grad.is_contiguous() &&
                   it.param.device() == items[0].param.device(),
               "[adamw] gradient {} does not match parameter {}", shape_str(it.grad.shape()),
               shape_str(w.shape()));
  }
  Device d = items[0].param.device();
  if (d.is_meta()) return;
  if (d.is_cuda()) return cuda_ops::adamw_multi_step(items, lr, beta1, beta2, eps, step);
  for (auto& it : items) {
    if (!it.master.defined()) {
      adamw_step_(it.param, it.grad, it.m, it.v, lr, beta1, beta2, eps, it.weight_decay, step);
      continue;
    }
    MemoryScope scratch(MemCategory::Temporaries);
    Tensor g32 = it.grad.to(DType::F32);
    adamw_step_(it.master, g32, it.m, it.v, lr, beta1, beta2, eps, it.weight_decay, step);
    it.param.copy_(it.master);  // round the updated master into bf16/f16
  }
}

static AttentionImpl g_attention_impl = AttentionImpl::Kiln;
void set_attention_impl(AttentionImpl impl) { g_attention_impl = impl; }
AttentionImpl attention_impl() { return g_attention_impl; }

}  // namespace kiln::ops
