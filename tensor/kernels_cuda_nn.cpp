// CUDA front end, nn family (contract in tensor/kernels_cuda.h): softmax, embedding, norms, RoPE,
// activations, dropout. The launchers are in kernels/cuda/{softmax,embedding,norm,rope,
// activation,dropout}.h.
//
// Inputs the kernels cannot read in place get a contiguous copy in the kernel's dtype, charged
// to Temporaries; row kernels (softmax, norms) read any input whose leading dims collapse into
// one evenly strided row dim with a dense last dim (e.g. a narrow() along the last dim) without
// a copy, and RoPE reads and writes through arbitrary strides. Scratch that some ops need
// (embedding backward's sort buffers, the norms' f32 dw/db partial sums) is Temporaries too.
// Note for the meta dry run: these temporaries are allocated only on the CUDA path.
#include "tensor/kernels_cuda.h"

#if defined(KILN_CUDA)

#include <initializer_list>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/softmax.h"
#include "tensor/dispatch.h"
#include "tensor/memory.h"

namespace kiln::ops::cuda_ops {
namespace {

constexpr cuda::StreamHandle kStream = nullptr;  // the legacy default stream (kernels_cuda.h)

void check_cuda(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    KILN_CHECK(t->device().is_cuda(), "[{}] expected a CUDA tensor, got one on {}", op,
               t->device().str());
    if (!first) first = t;
    KILN_CHECK(t->device() == first->device(), "[{}] tensors on different devices: {} and {}", op,
               first->device().str(), t->device().str());
  }
}

// t contiguous in dtype dt: t itself, or a Temporaries copy. Undefined stays undefined.
Tensor dense_as(const Tensor& t, DType dt) {
  if (!t.defined() || (t.dtype() == dt && t.is_contiguous())) return t;
  MemoryScope scratch(MemCategory::Temporaries);
  return t.to(dt).contiguous();
}

// Outputs come from the front end contiguous; a kernel relies on it.
void check_out(const char* op, const Tensor& out, DType dt, std::int64_t numel) {
  KILN_CHECK(out.defined() && out.is_contiguous() && out.dtype() == dt && out.numel() == numel,
             "[{}] output must be a contiguous {} tensor of {} elements", op, dtype_name(dt),
             numel);
}

void check_stats(const char* op, const Tensor& s, std::int64_t rows) {
  KILN_CHECK(s.defined() && s.dtype() == DType::F32 && s.is_contiguous() && s.numel() == rows,
             "[{}] row statistics must be a contiguous f32 tensor of {} elements", op, rows);
}

// ---- row views ------------------------------------------------------------------------------

// x seen as (rows, cols = last dim): the row stride when the last dim is dense and the leading
// dims collapse into one evenly strided dim with rows that do not overlap; -1 otherwise.
std::int64_t row_stride(const Tensor& x) {
  if (x.dim() == 0) return 1;
  const std::int64_t cols = x.size(-1);
  if (cols > 1 && x.stride(-1) != 1) return -1;
  std::int64_t rs = -1, expect = 0;
  for (int d = x.dim() - 2; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (rs < 0) {
      rs = x.stride(d);
      expect = rs * x.size(d);
    } else {
      if (x.stride(d) != expect) return -1;
      expect *= x.size(d);
    }
  }
  if (rs < 0) return cols;  // a single row
  return rs >= cols ? rs : -1;
}

struct Rows {
  Tensor t;  // x itself or a contiguous copy in dtype dt
  std::int64_t rows = 0, cols = 0, stride = 0;
};
Rows row_view(const Tensor& x, DType dt) {
  Rows r;
  r.cols = x.dim() == 0 ? 1 : x.size(-1);
  r.rows = r.cols == 0 ? 0 : x.numel() / r.cols;
  const std::int64_t s = x.dtype() == dt ? row_stride(x) : -1;
  if (s >= 0) {
    r.t = x;
    r.stride = s;
  } else {
    r.t = dense_as(x, dt);
    r.stride = r.cols;
  }
  return r;
}

// A Temporaries f32 scratch tensor of n elements (undefined when n == 0).
Tensor scratch_f32(std::int64_t n, Device device) {
  if (n <= 0) return Tensor();
  MemoryScope scratch(MemCategory::Temporaries);
  return Tensor::empty({n}, DType::F32, device);
}

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// dst (any float dtype the kernels support, contiguous) += sum of the chunk partials.
void add_partials(const char* op, const Tensor& part, std::int64_t chunks, std::int64_t dim,
                  Tensor& dst) {
  KILN_CHECK(dst.is_contiguous() && dst.numel() == dim,
             "[{}] weight gradient must be contiguous with {} elements", op, dim);
  dispatch_float(dst.dtype(), op, [&](auto tag) {
    using U = typename decltype(tag)::type;
    cuda::reduce_partials<U>(chunks, dim, part.data<float>(), dst.data<U>(), kStream);
  });
}

}  // namespace

// ---- softmax ----------------------------------------------------------------------------------

void softmax(const Tensor& x, bool log, Tensor& y) {
  const char* op = log ? "log_softmax" : "softmax";
  check_cuda(op, {&x, &y});
  check_out(op, y, x.dtype(), x.numel());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Rows r = row_view(x, x.dtype());
    cuda::softmax_forward<T>(r.rows, r.cols, r.t.data<T>(), r.stride, log, y.data<T>(), kStream);
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, bool log, Tensor& dx) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_cuda(op, {&y, &dy, &dx});
  KILN_CHECK(y.shape() == dy.shape(), "[{}] y and dy shapes differ", op);
  check_out(op, dx, y.dtype(), y.numel());
  dispatch_float(y.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Rows ry = row_view(y, y.dtype()), rd = row_view(dy, y.dtype());
    cuda::softmax_backward<T>(ry.rows, ry.cols, ry.t.data<T>(), ry.stride, rd.t.data<T>(),
                              rd.stride, log, dx.data<T>(), kStream);
  });
}

// ---- embedding --------------------------------------------------------------------------------

namespace {
// Fails like the CPU kernel when an id is outside [0, vocab). Synchronizes (see embedding.h).
void check_ids(const Tensor& ids, std::int64_t vocab) {
  const std::int64_t bad =
      cuda::embedding_first_bad_token(ids.numel(), vocab, ids.data<std::int32_t>(), kStream);
  if (bad < 0) return;
  std::int32_t id = 0;
  cuda::memcpy_d2h(&id, ids.data<std::int32_t>() + bad, sizeof(id), kStream);
  fail("[embedding] token id {} out of range [0, {})", id, vocab);
}
}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  check_cuda("embedding", {&ids, &table, &out});
  KILN_CHECK(ids.dtype() == DType::I32 && table.dim() == 2,
             "[embedding] needs i32 ids and a 2-d table");
  const std::int64_t vocab = table.size(0), dim = table.size(1);
  check_out("embedding", out, table.dtype(), ids.numel() * dim);
  const Tensor cids = dense_as(ids, DType::I32);
  check_ids(cids, vocab);
  dispatch_float(table.dtype(), "embedding", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tensor ct = dense_as(table, table.dtype());
    cuda::embedding_forward<T>(cids.numel(), vocab, dim, cids.data<std::int32_t>(), ct.data<T>(),
                               out.data<T>(), kStream);
  });
}

void embedding_backward(Tensor& dtable, const Tensor& ids, const Tensor& dout) {
  const char* op = "embedding_backward";
  check_cuda(op, {&dtable, &ids, &dout});
  KILN_CHECK(ids.dtype() == DType::I32 && dtable.dim() == 2 && dtable.is_contiguous(),
             "[{}] needs i32 ids and a contiguous 2-d gradient table", op);
  const std::int64_t vocab = dtable.size(0), dim = dtable.size(1), n = ids.numel();
  KILN_CHECK(dout.numel() == n * dim, "[{}] dout has {} elements, expected {} x {}", op,
             dout.numel(), n, dim);
  if (n == 0 || dim == 0) return;
  const Tensor cids = dense_as(ids, DType::I32);
  check_ids(cids, vocab);
  Tensor workspace;
  {
    MemoryScope scratch(MemCategory::Temporaries);
    const auto bytes = static_cast<std::int64_t>(cuda::embedding_backward_workspace_bytes(n));
    workspace = Tensor::empty({bytes}, DType::Bool, dtable.device());
  }
  dispatch_float(dtable.dtype(), op, [&](auto gtag) {
    using G = typename decltype(gtag)::type;
    dispatch_float(dout.dtype(), op, [&](auto otag) {
      using O = typename decltype(otag)::type;
      const Tensor cd = dense_as(dout, dout.dtype());
      cuda::embedding_backward<G, O>(n, vocab, dim, cids.data<std::int32_t>(), cd.data<O>(),
                                     dtable.data<G>(), workspace.raw_data(),
                                     static_cast<std::size_t>(workspace.numel()), kStream);
    });
  });
}

// ---- norms ------------------------------------------------------------------------------------

void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd) {
  check_cuda("rmsnorm", {&x, &w, &y, &rstd});
  check_out("rmsnorm", y, x.dtype(), x.numel());
  dispatch_float(x.dtype(), "rmsnorm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Rows r = row_view(x, x.dtype());
    KILN_CHECK(w.numel() == r.cols, "[rmsnorm] weight of {} for rows of {}", w.numel(), r.cols);
    check_stats("rmsnorm", rstd, r.rows);
    const Tensor cw = dense_as(w, x.dtype());
    cuda::rmsnorm_forward<T>(r.rows, r.cols, static_cast<float>(eps), r.t.data<T>(), r.stride,
                             cw.data<T>(), y.data<T>(), rstd.data<float>(), kStream);
  });
}

void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      Tensor& dx, Tensor* dw) {
  const char* op = "rmsnorm_backward";
  const bool want_dw = dw && dw->defined();
  check_cuda(op, {&x, &w, &rstd, &dy, &dx, want_dw ? dw : nullptr});
  KILN_CHECK(x.shape() == dy.shape(), "[{}] x and dy shapes differ", op);
  check_out(op, dx, x.dtype(), x.numel());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Rows rx = row_view(x, x.dtype()), rd = row_view(dy, x.dtype());
    KILN_CHECK(w.numel() == rx.cols, "[{}] weight of {} for rows of {}", op, w.numel(), rx.cols);
    const Tensor crstd = dense_as(rstd, DType::F32);
    check_stats(op, crstd, rx.rows);
    const Tensor cw = dense_as(w, x.dtype());
    const cuda::NormChunks ch = cuda::norm_chunks(rx.rows);
    const Tensor part = want_dw ? scratch_f32(ch.count * rx.cols, x.device()) : Tensor();
    cuda::rmsnorm_backward<T>(rx.rows, rx.cols, rx.t.data<T>(), rx.stride, cw.data<T>(),
                              crstd.data<float>(), rd.t.data<T>(), rd.stride, dx.data<T>(),
                              ptr_or_null<float>(part), kStream);
    if (part.defined()) add_partials(op, part, ch.count, rx.cols, *dw);
  });
}

void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
               Tensor& mean, Tensor& rstd) {
  check_cuda("layernorm", {&x, &w, &b, &y, &mean, &rstd});
  check_out("layernorm", y, x.dtype(), x.numel());
  dispatch_float(x.dtype(), "layernorm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Rows r = row_view(x, x.dtype());
    KILN_CHECK(w.numel() == r.cols && (!b.defined() || b.numel() == r.cols),
               "[layernorm] weight/bias of {}/{} for rows of {}", w.numel(),
               b.defined() ? b.numel() : 0, r.cols);
    check_stats("layernorm", mean, r.rows);
    check_stats("layernorm", rstd, r.rows);
    const Tensor cw = dense_as(w, x.dtype()), cb = dense_as(b, x.dtype());
    cuda::layernorm_forward<T>(r.rows, r.cols, static_cast<float>(eps), r.t.data<T>(), r.stride,
                               cw.data<T>(), ptr_or_null<T>(cb), y.data<T>(), mean.data<float>(),
                               rstd.data<float>(), kStream);
  });
}

void layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, Tensor& dx, Tensor* dw, Tensor* db) {
  const char* op = "layernorm_backward";
  const bool want_dw = dw && dw->defined(), want_db = db && db->defined();
  check_cuda(op, {&x, &w, &mean, &rstd, &dy, &dx, want_dw ? dw : nullptr, want_db ? db : nullptr});
  KILN_CHECK(x.shape() == dy.shape(), "[{}] x and dy shapes differ", op);
  check_out(op, dx, x.dtype(), x.numel());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Rows rx = row_view(x, x.dtype()), rd = row_view(dy, x.dtype());
    KILN_CHECK(w.numel() == rx.cols, "[{}] weight of {} for rows of {}", op, w.numel(), rx.cols);
    const Tensor cmean = dense_as(mean, DType::F32), crstd = dense_as(rstd, DType::F32);
    check_stats(op, cmean, rx.rows);
    check_stats(op, crstd, rx.rows);
    const Tensor cw = dense_as(w, x.dtype());
    const cuda::NormChunks ch = cuda::norm_chunks(rx.rows);
    const std::int64_t n = ch.count * rx.cols;
    const Tensor pw = want_dw ? scratch_f32(n, x.device()) : Tensor();
    const Tensor pb = want_db ? scratch_f32(n, x.device()) : Tensor();
    cuda::layernorm_backward<T>(rx.rows, rx.cols, rx.t.data<T>(), rx.stride, cw.data<T>(),
                                cmean.data<float>(), crstd.data<float>(), rd.t.data<T>(), rd.stride,
                                dx.data<T>(), ptr_or_null<float>(pw), ptr_or_null<float>(pb),
                                kStream);
    if (pw.defined()) add_partials(op, pw, ch.count, rx.cols, *dw);
    if (pb.defined()) add_partials(op, pb, ch.count, rx.cols, *db);
  });
}

// ---- RoPE -------------------------------------------------------------------------------------

void rope_tables(std::int64_t max_pos, std::int64_t head_dim, double theta, Tensor& cos,
                 Tensor& sin) {
  check_cuda("rope_tables", {&cos, &sin});
  KILN_CHECK(cos.dtype() == sin.dtype(), "[rope] cos and sin tables differ in dtype");
  if (cos.dtype() != DType::F32)
    fail("[rope] {} is not supported on CUDA", dtype_name(cos.dtype()));
  check_out("rope", cos, DType::F32, max_pos * (head_dim / 2));
  check_out("rope", sin, DType::F32, max_pos * (head_dim / 2));
  cuda::rope_tables(max_pos, head_dim, theta, cos.data<float>(), sin.data<float>(), kStream);
}

void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style,
          std::int64_t pos_offset, bool backward, Tensor& out) {
  check_cuda("rope", {&x, &cos, &sin, &out});
  KILN_CHECK(x.dim() == 4, "[rope] x must be (B, T, H, D), got {}", shape_str(x.shape()));
  KILN_CHECK(out.shape() == x.shape() && out.dtype() == x.dtype(),
             "[rope] output {} does not match x {}", shape_str(out.shape()), shape_str(x.shape()));
  const std::int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  KILN_CHECK(cos.dim() == 2 && sin.shape() == cos.shape() && cos.size(1) * 2 == D &&
                 pos_offset >= 0 && pos_offset + T <= cos.size(0),
             "[rope] positions [{}, {}) exceed the table {} (head_dim {})", pos_offset,
             pos_offset + T, shape_str(cos.shape()), D);
  // In place only as the very same view; otherwise out must not overlap x (it is fresh).
  const bool in_place = out.same_storage(x) && out.offset() == x.offset();
  KILN_CHECK(!out.same_storage(x) || (in_place && out.strides() == x.strides()),
             "[rope] output overlaps the input without being it");
  const Tensor ccos = dense_as(cos, DType::F32), csin = dense_as(sin, DType::F32);
  auto strides = [](const Tensor& t) {
    return cuda::Strides4{{t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
  };
  const auto cstyle =
      style == RopeStyle::Interleaved ? cuda::RopeStyle::Interleaved : cuda::RopeStyle::RotateHalf;
  dispatch_float(x.dtype(), "rope", [&](auto tag) {
    using Tp = typename decltype(tag)::type;
    cuda::rope_apply<Tp>(cstyle, backward, B, T, H, D, ccos.data<float>(), csin.data<float>(),
                         pos_offset, x.data<Tp>(), strides(x), out.data<Tp>(), strides(out),
                         kStream);
  });
}

// ---- activations ------------------------------------------------------------------------------

void activation(Op op, const Tensor& x, Tensor& y) {
  const char* name = op_name(op).data();
  check_cuda(name, {&x, &y});
  check_out(name, y, x.dtype(), x.numel());
  dispatch_float(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tensor cx = dense_as(x, x.dtype());
    cuda::activation_forward<T>(op, x.numel(), cx.data<T>(), y.data<T>(), kStream);
  });
}

void activation_backward(Op op, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const char* name = op_backward_name(op).data();
  check_cuda(name, {&x, &dy, &dx});
  KILN_CHECK(x.shape() == dy.shape(), "[{}] x and dy shapes differ", name);
  check_out(name, dx, x.dtype(), x.numel());
  dispatch_float(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tensor cx = dense_as(x, x.dtype()), cdy = dense_as(dy, x.dtype());
    cuda::activation_backward<T>(op, x.numel(), cx.data<T>(), cdy.data<T>(), dx.data<T>(), kStream);
  });
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  check_cuda("swiglu", {&gate, &up, &out});
  KILN_CHECK(gate.shape() == up.shape(), "[swiglu] gate and up shapes differ");
  check_out("swiglu", out, gate.dtype(), gate.numel());
  dispatch_float(gate.dtype(), "swiglu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tensor cg = dense_as(gate, gate.dtype()), cu = dense_as(up, gate.dtype());
    cuda::swiglu_forward<T>(gate.numel(), cg.data<T>(), cu.data<T>(), out.data<T>(), kStream);
  });
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                     Tensor& dup) {
  const char* op = "swiglu_backward";
  check_cuda(op, {&gate, &up, &dout, &dgate, &dup});
  KILN_CHECK(gate.shape() == up.shape() && gate.shape() == dout.shape(),
             "[{}] gate, up and dout shapes differ", op);
  check_out(op, dgate, gate.dtype(), gate.numel());
  check_out(op, dup, gate.dtype(), gate.numel());
  dispatch_float(gate.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tensor cg = dense_as(gate, gate.dtype()), cu = dense_as(up, gate.dtype());
    const Tensor cd = dense_as(dout, gate.dtype());
    cuda::swiglu_backward<T>(gate.numel(), cg.data<T>(), cu.data<T>(), cd.data<T>(),
                             dgate.data<T>(), dup.data<T>(), kStream);
  });
}

// ---- dropout ----------------------------------------------------------------------------------

void dropout(const Tensor& x, double p, std::uint64_t seed, std::uint64_t offset, Tensor& y,
             Tensor& mask) {
  check_cuda("dropout", {&x, &y, &mask});
  check_out("dropout", y, x.dtype(), x.numel());
  check_out("dropout", mask, DType::Bool, x.numel());
  dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tensor cx = dense_as(x, x.dtype());
    cuda::dropout_forward<T>(x.numel(), static_cast<float>(p), seed, offset, cx.data<T>(),
                             y.data<T>(), mask.data<std::uint8_t>(), kStream);
  });
}

void dropout_backward(const Tensor& dy, const Tensor& mask, double p, Tensor& dx) {
  check_cuda("dropout_backward", {&dy, &mask, &dx});
  KILN_CHECK(mask.numel() == dy.numel() && mask.dtype() == DType::Bool,
             "[dropout_backward] mask must be a bool tensor of dy's size");
  check_out("dropout_backward", dx, dy.dtype(), dy.numel());
  dispatch_float(dy.dtype(), "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tensor cdy = dense_as(dy, dy.dtype()), cm = dense_as(mask, DType::Bool);
    cuda::dropout_backward<T>(dy.numel(), static_cast<float>(p), cm.data<std::uint8_t>(),
                              cdy.data<T>(), dx.data<T>(), kStream);
  });
}

}  // namespace kiln::ops::cuda_ops

#endif  // KILN_CUDA
