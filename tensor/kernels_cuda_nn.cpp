// CUDA glue, nn family: softmax, embedding, norms, RoPE, activations, SwiGLU and dropout, on the
// launchers of kernels/cuda/{softmax,embedding,norm,rope,activation,dropout}.h, as typed entries
// registered beside their bodies (tensor/kernels_cuda_glue.h). The front end
// (tensor/ops_nn.cpp) has checked shapes and sizes and allocated contiguous outputs; the
// dispatcher has put every tensor on the op's device and converted inputs to T.
//
// Inputs the kernels cannot read in place get a contiguous copy in the kernel's dtype, charged
// to Temporaries; row kernels (softmax, norms) read any input whose leading dims collapse into
// one evenly strided row dim with a dense last dim (e.g. a narrow() along the last dim) without
// a copy, and RoPE reads and writes through arbitrary strides. Scratch that some ops need
// (embedding backward's sort buffers, the norms' f32 dw/db partial sums) is Temporaries too,
// and the norms' partials are declared to the table (the dry run charges them).
#include "kernels/cuda/norm.h"
#include "tensor/kernels_cuda_glue.h"
#include "tensor/op_args.h"

#if defined(KILN_CUDA)
#include "kernels/cuda/activation.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/softmax.h"
#include "tensor/memory.h"
#endif

namespace kiln::ops {
namespace cuda_glue {
namespace {

template <class T>
struct SoftmaxCuda {
  static void run(SoftmaxArgs& a);
};
template <class T>
struct SoftmaxBackwardCuda {
  static void run(SoftmaxBackwardArgs& a);
};
template <class T>
struct EmbeddingCuda {
  static void run(EmbeddingArgs& a);
};
template <class T>
struct EmbeddingBackwardCuda {
  static void run(EmbeddingBackwardArgs& a);
};
template <class T>
struct RmsNormCuda {
  static void run(RmsNormArgs& a);
};
template <class T>
struct RmsNormBackwardCuda {
  static void run(RmsNormBackwardArgs& a);
};
template <class T>
struct AddRmsNormCuda {
  static void run(AddRmsNormArgs& a);
};
template <class T>
struct LayerNormCuda {
  static void run(LayerNormArgs& a);
};
template <class T>
struct LayerNormBackwardCuda {
  static void run(LayerNormBackwardArgs& a);
};
template <class T>
struct RopeTablesCuda {
  static void run(RopeTablesArgs& a);
};
template <class T>
struct RopeCuda {
  static void run(RopeArgs& a);
};
// The pointwise activations of kActivations: one entry pair per activation op O.
template <Op O>
struct ActivationCuda {
  template <class T>
  struct Forward {
    static void run(ActivationArgs<O>& a);
  };
  template <class T>
  struct Backward {
    static void run(ActivationBackwardArgs<O>& a);
  };
};
template <class T>
struct SwiGluCuda {
  static void run(SwiGluArgs& a);
};
template <class T>
struct SwiGluBackwardCuda {
  static void run(SwiGluBackwardArgs& a);
};
template <class T>
struct DropoutCuda {
  static void run(DropoutArgs& a);
};
template <class T>
struct DropoutBackwardCuda {
  static void run(DropoutBackwardArgs& a);
};

// The norm backward kernels sum dw (and db) over row chunks into f32 partials.
std::int64_t norm_partials_bytes(const Tensor& x, const Tensor& w) {
  const std::int64_t rows = x.dim() == 0 ? 1 : x.numel() / std::max<std::int64_t>(x.size(-1), 1);
  return cuda::norm_backward_scratch_floats(rows, w.size(0), false) * 4;
}
ScratchList rmsnorm_backward_scratch(const RmsNormBackwardArgs& a, DType) {
  if (!a.dw.defined()) return {};
  return {norm_partials_bytes(a.x, a.w)};
}
ScratchList layernorm_backward_scratch(const LayerNormBackwardArgs& a, DType) {
  const std::int64_t n = norm_partials_bytes(a.x, a.w);
  return {a.dw.defined() ? n : 0, a.db.defined() ? n : 0};
}

#if defined(KILN_CUDA)

constexpr cuda::StreamHandle kStream = nullptr;  // the legacy default stream

// t contiguous in dtype dt: t itself, or a Temporaries copy. Undefined stays undefined.
Tensor dense_as(const Tensor& t, DType dt) {
  if (!t.defined() || (t.dtype() == dt && t.is_contiguous())) return t;
  MemoryScope scratch(MemCategory::Temporaries);
  return t.to(dt).contiguous();
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

// dst (any float dtype the kernels support, contiguous: the front end checked) += sum of the
// chunk partials.
void add_partials(const char* op, const Tensor& part, std::int64_t chunks, std::int64_t dim,
                  Tensor& dst) {
  dispatch_float(dst.dtype(), op, [&](auto tag) {
    using U = typename decltype(tag)::type;
    cuda::reduce_partials<U>(chunks, dim, part.data<float>(), dst.data<U>(), kStream);
  });
}

// Fails like the CPU kernel when an id is outside [0, vocab). Synchronizes (see embedding.h).
void check_ids(const Tensor& ids, std::int64_t vocab) {
  const std::int64_t bad =
      cuda::embedding_first_bad_token(ids.numel(), vocab, ids.data<std::int32_t>(), kStream);
  if (bad < 0) return;
  std::int32_t id = 0;
  cuda::memcpy_d2h(&id, ids.data<std::int32_t>() + bad, sizeof(id), kStream);
  fail("[embedding] token id {} out of range [0, {})", id, vocab);
}

// ---- softmax ----------------------------------------------------------------------------------

template <class T>
void SoftmaxCuda<T>::run(SoftmaxArgs& a) {
  const Rows r = row_view(a.x, a.x.dtype());
  cuda::softmax_forward<T>(r.rows, r.cols, r.t.template data<T>(), r.stride, a.log,
                           a.y.template data<T>(), kStream);
}

template <class T>
void SoftmaxBackwardCuda<T>::run(SoftmaxBackwardArgs& a) {
  const Rows ry = row_view(a.y, a.y.dtype()), rd = row_view(a.dy, a.y.dtype());
  cuda::softmax_backward<T>(ry.rows, ry.cols, ry.t.template data<T>(), ry.stride,
                            rd.t.template data<T>(), rd.stride, a.log, a.dx.template data<T>(),
                            kStream);
}

// ---- embedding --------------------------------------------------------------------------------

template <class T>
void EmbeddingCuda<T>::run(EmbeddingArgs& a) {
  const std::int64_t vocab = a.table.size(0), dim = a.table.size(1);
  const Tensor ids = dense_as(a.ids, DType::I32), table = dense_as(a.table, a.table.dtype());
  check_ids(ids, vocab);
  cuda::embedding_forward<T>(ids.numel(), vocab, dim, ids.data<std::int32_t>(),
                             table.template data<T>(), a.out.template data<T>(), kStream);
}

// dtable (T) += scatter(dout), dout in any float dtype; deterministic (no float atomics in a
// data-dependent order).
template <class T>
void EmbeddingBackwardCuda<T>::run(EmbeddingBackwardArgs& a) {
  const std::int64_t vocab = a.dtable.size(0), dim = a.dtable.size(1), n = a.ids.numel();
  if (n == 0 || dim == 0) return;
  const Tensor ids = dense_as(a.ids, DType::I32);
  check_ids(ids, vocab);
  Tensor workspace;
  {
    MemoryScope scratch(MemCategory::Temporaries);
    const auto bytes = static_cast<std::int64_t>(cuda::embedding_backward_workspace_bytes(n));
    workspace = Tensor::empty({bytes}, DType::Bool, a.dtable.device());
  }
  dispatch_float(a.dout.dtype(), "embedding_backward", [&](auto otag) {
    using O = typename decltype(otag)::type;
    const Tensor dout = dense_as(a.dout, a.dout.dtype());
    cuda::embedding_backward<T, O>(n, vocab, dim, ids.data<std::int32_t>(), dout.data<O>(),
                                   a.dtable.template data<T>(), workspace.raw_data(),
                                   static_cast<std::size_t>(workspace.numel()), kStream);
  });
}

// ---- norms ------------------------------------------------------------------------------------

template <class T>
void RmsNormCuda<T>::run(RmsNormArgs& a) {
  const Rows r = row_view(a.x, a.x.dtype());
  const Tensor w = dense_as(a.w, a.x.dtype());
  cuda::rmsnorm_forward<T>(r.rows, r.cols, static_cast<float>(a.eps), r.t.template data<T>(),
                           r.stride, w.template data<T>(), a.y.template data<T>(),
                           a.rstd.template data<float>(), kStream);
}

template <class T>
void AddRmsNormCuda<T>::run(AddRmsNormArgs& a) {
  const Rows rx = row_view(a.x, a.x.dtype()), rr = row_view(a.r, a.x.dtype());
  const Tensor w = dense_as(a.w, a.x.dtype());
  cuda::add_rmsnorm_forward<T>(rx.rows, rx.cols, static_cast<float>(a.eps), rx.t.template data<T>(),
                               rx.stride, rr.t.template data<T>(), rr.stride, w.template data<T>(),
                               a.s.template data<T>(), a.y.template data<T>(),
                               a.rstd.template data<float>(), kStream);
}

// dx =; dw += when defined (any float dtype), through f32 chunk partials.
template <class T>
void RmsNormBackwardCuda<T>::run(RmsNormBackwardArgs& a) {
  const char* op = "rmsnorm_backward";
  const Rows rx = row_view(a.x, a.x.dtype()), rd = row_view(a.dy, a.x.dtype());
  const Tensor rstd = dense_as(a.rstd, DType::F32), w = dense_as(a.w, a.x.dtype());
  const cuda::NormChunks ch = cuda::norm_chunks(rx.rows);
  const Tensor part = a.dw.defined() ? scratch_f32(ch.count * rx.cols, a.x.device()) : Tensor();
  cuda::rmsnorm_backward<T>(rx.rows, rx.cols, rx.t.template data<T>(), rx.stride,
                            w.template data<T>(), rstd.template data<float>(),
                            rd.t.template data<T>(), rd.stride, a.dx.template data<T>(),
                            ptr_or_null<float>(part), kStream);
  if (part.defined()) add_partials(op, part, ch.count, rx.cols, a.dw);
}

template <class T>
void LayerNormCuda<T>::run(LayerNormArgs& a) {
  const Rows r = row_view(a.x, a.x.dtype());
  const Tensor w = dense_as(a.w, a.x.dtype()), b = dense_as(a.b, a.x.dtype());
  cuda::layernorm_forward<T>(r.rows, r.cols, static_cast<float>(a.eps), r.t.template data<T>(),
                             r.stride, w.template data<T>(), ptr_or_null<T>(b),
                             a.y.template data<T>(), a.mean.template data<float>(),
                             a.rstd.template data<float>(), kStream);
}

// dx =; dw, db += when defined.
template <class T>
void LayerNormBackwardCuda<T>::run(LayerNormBackwardArgs& a) {
  const char* op = "layernorm_backward";
  const Rows rx = row_view(a.x, a.x.dtype()), rd = row_view(a.dy, a.x.dtype());
  const Tensor mean = dense_as(a.mean, DType::F32), rstd = dense_as(a.rstd, DType::F32);
  const Tensor w = dense_as(a.w, a.x.dtype());
  const cuda::NormChunks ch = cuda::norm_chunks(rx.rows);
  const std::int64_t n = ch.count * rx.cols;
  const Tensor pw = a.dw.defined() ? scratch_f32(n, a.x.device()) : Tensor();
  const Tensor pb = a.db.defined() ? scratch_f32(n, a.x.device()) : Tensor();
  cuda::layernorm_backward<T>(
      rx.rows, rx.cols, rx.t.template data<T>(), rx.stride, w.template data<T>(),
      mean.template data<float>(), rstd.template data<float>(), rd.t.template data<T>(), rd.stride,
      a.dx.template data<T>(), ptr_or_null<float>(pw), ptr_or_null<float>(pb), kStream);
  if (pw.defined()) add_partials(op, pw, ch.count, rx.cols, a.dw);
  if (pb.defined()) add_partials(op, pb, ch.count, rx.cols, a.db);
}

// ---- RoPE -------------------------------------------------------------------------------------

// cos/sin (max_pos, D/2) f32: the tables stay f32 on CUDA whatever the model dtype.
template <class T>
void RopeTablesCuda<T>::run(RopeTablesArgs& a) {
  cuda::rope_tables(a.max_pos, a.head_dim, a.theta, a.cos.template data<float>(),
                    a.sin.template data<float>(), kStream);
}

// x: (B, T, H, D); out may be x itself (in place).
template <class T>
void RopeCuda<T>::run(RopeArgs& a) {
  const Tensor& x = a.x;
  const std::int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), D = x.size(3);
  // In place only as the very same view; otherwise out must not overlap x (it is fresh).
  const bool in_place = a.out.same_storage(x) && a.out.offset() == x.offset();
  KILN_CHECK(!a.out.same_storage(x) || (in_place && a.out.strides() == x.strides()),
             "[rope] output overlaps the input without being it");
  const Tensor cos = dense_as(a.cos, DType::F32), sin = dense_as(a.sin, DType::F32);
  auto strides = [](const Tensor& t) {
    return cuda::Strides4{{t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
  };
  const auto style = a.style == RopeStyle::Interleaved ? cuda::RopeStyle::Interleaved
                                                       : cuda::RopeStyle::RotateHalf;
  cuda::rope_apply<T>(style, a.backward, B, Tn, H, D, cos.template data<float>(),
                      sin.template data<float>(), a.pos_offset, x.template data<T>(), strides(x),
                      a.out.template data<T>(), strides(a.out), kStream);
}

// ---- activations ------------------------------------------------------------------------------

template <Op O>
template <class T>
void ActivationCuda<O>::Forward<T>::run(ActivationArgs<O>& a) {
  const Tensor x = dense_as(a.x, a.x.dtype());
  cuda::activation_forward<T>(O, x.numel(), x.template data<T>(), a.y.template data<T>(), kStream);
}

template <Op O>
template <class T>
void ActivationCuda<O>::Backward<T>::run(ActivationBackwardArgs<O>& a) {
  const Tensor x = dense_as(a.x, a.x.dtype()), dy = dense_as(a.dy, a.x.dtype());
  cuda::activation_backward<T>(O, x.numel(), x.template data<T>(), dy.template data<T>(),
                               a.dx.template data<T>(), kStream);
}

template <class T>
void SwiGluCuda<T>::run(SwiGluArgs& a) {
  const Tensor gate = dense_as(a.gate, a.gate.dtype()), up = dense_as(a.up, a.gate.dtype());
  cuda::swiglu_forward<T>(gate.numel(), gate.template data<T>(), up.template data<T>(),
                          a.out.template data<T>(), kStream);
}

template <class T>
void SwiGluBackwardCuda<T>::run(SwiGluBackwardArgs& a) {
  const Tensor gate = dense_as(a.gate, a.gate.dtype()), up = dense_as(a.up, a.gate.dtype());
  const Tensor dout = dense_as(a.dout, a.gate.dtype());
  cuda::swiglu_backward<T>(gate.numel(), gate.template data<T>(), up.template data<T>(),
                           dout.template data<T>(), a.dgate.template data<T>(),
                           a.dup.template data<T>(), kStream);
}

// ---- dropout ----------------------------------------------------------------------------------

// The same Philox mask as the CPU kernel for the same (seed, offset).
template <class T>
void DropoutCuda<T>::run(DropoutArgs& a) {
  const Tensor x = dense_as(a.x, a.x.dtype());
  cuda::dropout_forward<T>(x.numel(), static_cast<float>(a.p), a.seed, a.offset,
                           x.template data<T>(), a.y.template data<T>(),
                           a.mask.template data<std::uint8_t>(), kStream);
}

template <class T>
void DropoutBackwardCuda<T>::run(DropoutBackwardArgs& a) {
  const Tensor dy = dense_as(a.dy, a.dy.dtype()), mask = dense_as(a.mask, DType::Bool);
  cuda::dropout_backward<T>(dy.numel(), static_cast<float>(a.p), mask.template data<std::uint8_t>(),
                            dy.template data<T>(), a.dx.template data<T>(), kStream);
}

#endif  // KILN_CUDA

}  // namespace

// The glue reads strided inputs itself (copying only what a kernel cannot read), so the entries
// are Layout::Strided.
void register_nn() {
  constexpr Layout S = Layout::Strided;
  register_cuda<SoftmaxArgs, SoftmaxCuda, float, bf16, f16>({.layout = S});
  register_cuda<SoftmaxBackwardArgs, SoftmaxBackwardCuda, float, bf16, f16>({.layout = S});
  register_cuda<EmbeddingArgs, EmbeddingCuda, float, bf16, f16>({.layout = S});
  // dout is read in its own float dtype, widened in registers.
  register_cuda<EmbeddingBackwardArgs, EmbeddingBackwardCuda, float, bf16, f16>(
      {.layout = S, .mixed_inputs = true});
  register_cuda<RmsNormArgs, RmsNormCuda, float, bf16, f16>({.layout = S});
  register_cuda<AddRmsNormArgs, AddRmsNormCuda, float, bf16, f16>({.layout = S});
  register_cuda<RmsNormBackwardArgs, RmsNormBackwardCuda, float, bf16, f16>(
      {.layout = S, .scratch = &rmsnorm_backward_scratch});
  register_cuda<LayerNormArgs, LayerNormCuda, float, bf16, f16>({.layout = S});
  register_cuda<LayerNormBackwardArgs, LayerNormBackwardCuda, float, bf16, f16>(
      {.layout = S, .scratch = &layernorm_backward_scratch});
  register_cuda<RopeTablesArgs, RopeTablesCuda, float>({.layout = S});
  register_cuda<RopeArgs, RopeCuda, float, bf16, f16>({.layout = S});
  for_each_activation([&]<Op O>() {
    register_cuda<ActivationArgs<O>, ActivationCuda<O>::template Forward, float, bf16, f16>(
        {.layout = S});
    register_cuda<ActivationBackwardArgs<O>, ActivationCuda<O>::template Backward, float, bf16,
                  f16>({.layout = S});
  });
  register_cuda<SwiGluArgs, SwiGluCuda, float, bf16, f16>({.layout = S});
  register_cuda<SwiGluBackwardArgs, SwiGluBackwardCuda, float, bf16, f16>({.layout = S});
  register_cuda<DropoutArgs, DropoutCuda, float, bf16, f16>({.layout = S});
  register_cuda<DropoutBackwardArgs, DropoutBackwardCuda, float, bf16, f16>({.layout = S});
}

}  // namespace cuda_glue
}  // namespace kiln::ops
