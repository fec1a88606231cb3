// CPU kernels of the quant family (GGML blocks, kernels/common/quant.h): dequantize, and linear
// on quantized weights (the int8 GEMV of kernels/cpu/gemv_quant.h for decode, dequantized
// slices through the float Linear kernel for prefill). Registered beside them.
#include <algorithm>
#include <type_traits>

#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/gemv_quant.h"
#include "tensor/kernels_cpu.h"
#include "tensor/op_args.h"

namespace kiln::ops {
namespace cpu_glue {
namespace {

// out[0, nblocks * block_size) = the weights of nblocks blocks: each exact in f32, rounded once.
template <class T>
void dequantize_blocks(quant::QuantType type, const std::uint8_t* blocks, std::int64_t nblocks,
                       T* out) {
  if (type == quant::QuantType::Q8_0) return kiln::cpu::dequantize_q8_0<T>(blocks, nblocks, out);
  if (type == quant::QuantType::Q4_K) {
    // q4_k_weight's arithmetic, with each sub-block's scale and min unpacked once.
#pragma omp parallel for schedule(static)
    for (std::int64_t k = 0; k < nblocks; ++k) {
      const std::uint8_t* b = blocks + k * 144;
      T* o = out + k * 256;
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        quant::q4_k_scale_min(b, s, sc, m);
        const float d1 = quant::f16_at(b) * static_cast<float>(sc);
        const float m1 = quant::f16_at(b + 2) * static_cast<float>(m);
        const std::uint8_t* qs = b + 16 + 32 * (s / 2);
        for (int l = 0; l < 32; ++l) {
          const int nibble = (s & 1) ? qs[l] >> 4 : qs[l] & 0xF;
          o[32 * s + l] = kiln::cpu::from_compute<T>(d1 * static_cast<float>(nibble) - m1);
        }
      }
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < nblocks; ++k)
    for (int j = 0; j < 256; ++j)
      out[k * 256 + j] = kiln::cpu::from_compute<T>(quant::q6_k_weight(blocks + k * 210, j));
}

template <class T>
struct DequantizeCpu {
  static void run(DequantizeArgs& a) {
    dequantize_blocks<T>(a.type, a.blocks.template data<std::uint8_t>(),
                         a.out.numel() / quant::quant_info(a.type).block_size,
                         a.out.template data<T>());
  }
};

struct QuantShape {
  std::int64_t n, k, rows, slice;  // slice: W rows dequantized at a time (prefill)
};

QuantShape quant_shape(const LinearQuantArgs& a, std::int64_t elem_bytes) {
  QuantShape s;
  s.n = a.out.size(-1);
  s.k = a.x.size(-1);
  s.rows = a.out.numel() / s.n;
  s.slice =
      std::clamp<std::int64_t>(kiln::cpu::kQuantPrefillSliceBytes / (s.k * elem_bytes), 1, s.n);
  return s;
}

bool runs_gemv(const LinearQuantArgs& a, const QuantShape& s) {
  return s.rows <= kiln::cpu::quant_gemv_max_rows(a.type);
}

Tensor scratch_tensor(const Shape& shape, DType dtype) {
  MemoryScope scratch(MemCategory::Temporaries);
  return Tensor::empty(shape, dtype, Device::cpu());
}

template <class T>
struct LinearQuantCpu {
  static void run(LinearQuantArgs& a) {
    const QuantShape s = quant_shape(a, sizeof(T));
    const quant::QuantInfo& q = quant::quant_info(a.type);
    const std::uint8_t* w = a.blocks.template data<std::uint8_t>();
    const T* bias = a.bias.defined() ? a.bias.template data<T>() : nullptr;
    if (runs_gemv(a, s)) {
      Tensor xq =
          scratch_tensor({kiln::cpu::gemv_quant_scratch_bytes(a.type, s.rows, s.k)}, DType::Bool);
      kiln::cpu::gemv_quant<T, T>(a.type, s.rows, s.n, s.k, a.x.template data<T>(), s.k, w, bias,
                                  a.out.template data<T>(), s.n, xq.raw_data());
      return;
    }
    // Prefill: W a slice of rows at a time in T, through the float Linear kernel.
    const Kernel<LinearArgs>* linear = find_kernel<LinearArgs>(DeviceType::CPU, dtype_of<T>());
    KILN_CHECK(linear != nullptr, "[linear_quant] no CPU linear kernel for {}",
               dtype_name(dtype_of<T>()));
    const Tensor x = a.x.reshape({s.rows, s.k});
    Tensor out = a.out.reshape({s.rows, s.n});
    const std::int64_t row_bytes = s.k / q.block_size * q.block_bytes;
    for (std::int64_t n0 = 0; n0 < s.n; n0 += s.slice) {
      const std::int64_t nc = std::min(s.slice, s.n - n0);
      Tensor wc = scratch_tensor({nc, s.k}, dtype_of<T>());
      dequantize_blocks<T>(a.type, w + n0 * row_bytes, nc * s.k / q.block_size,
                           wc.template data<T>());
      LinearArgs la{x, wc, a.bias.defined() ? a.bias.narrow(0, n0, nc) : Tensor(),
                    nc == s.n ? out : scratch_tensor({s.rows, nc}, dtype_of<T>())};
      linear->run(la);
      if (nc != s.n) out.narrow(1, n0, nc).copy_(la.out);
    }
  }

  static ScratchList scratch(const LinearQuantArgs& a, DType) {
    const QuantShape s = quant_shape(a, sizeof(T));
    if (runs_gemv(a, s)) return {kiln::cpu::gemv_quant_scratch_bytes(a.type, s.rows, s.k)};
    const std::int64_t elem = static_cast<std::int64_t>(sizeof(T));
    // The bf16 Linear kernel run on each slice takes its GEMM scratch too (oneDNN's scratchpad),
    // alive with the slice: declared here, the largest of a full and the last slice's.
    std::int64_t gemm = 0;
    if constexpr (std::is_same_v<T, bf16>) {
      const std::int64_t last = s.n - (s.n - 1) / s.slice * s.slice;
      for (std::int64_t nc : {s.slice, last})
        gemm = std::max(gemm, linear_bf16_dense_scratch_bytes(s.rows, nc, s.k, a.bias.defined()));
    }
    ScratchList list = {s.slice * s.k * elem};
    if (s.slice != s.n) list.push_back(s.rows * s.slice * elem);
    if (gemm > 0) list.push_back(gemm);
    return list;
  }
};

}  // namespace
}  // namespace cpu_glue

void DequantizeArgs::register_cpu() {
  cpu_glue::register_float_storage<DequantizeArgs, cpu_glue::DequantizeCpu>();
}

void LinearQuantArgs::register_cpu() {
  // f16 (and f64, refused by the front end) run through the f32 kernel.
  register_kernel<LinearQuantArgs>(DeviceType::CPU, DType::F32,
                                   {.run = &cpu_glue::LinearQuantCpu<float>::run,
                                    .scratch = &cpu_glue::LinearQuantCpu<float>::scratch});
  register_kernel<LinearQuantArgs>(DeviceType::CPU, DType::BF16,
                                   {.run = &cpu_glue::LinearQuantCpu<bf16>::run,
                                    .scratch = &cpu_glue::LinearQuantCpu<bf16>::scratch});
}

}  // namespace kiln::ops
