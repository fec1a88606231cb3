// The one dispatcher: every kernel op (tensor/op_args.h) has a table of kernels per
// (device type, dtype). A backend registers each kernel with what it needs: which dtypes it
// reads natively (one registration each), whether it reads strided inputs, and the scratch it
// allocates inside, as a function of the arguments. The op front end (tensor/ops_*.cpp) checks
// shapes, allocates the outputs and calls run(args); it never tests the device itself.
//
// run() looks the kernel up for the arguments' device and key dtype. When no kernel takes that
// dtype natively (bf16/f16 on a backend with only f32 kernels), it takes the f32 kernel and
// converts: inputs into f32 copies, outputs through f32 buffers, all charged to Temporaries.
// The meta device runs no kernel but asks the same table on behalf of the backend it
// simulates (set_meta_simulates): it makes the same conversions and charges the kernel's
// declared scratch, so the dry run allocates what a real run allocates.
//
// After MLX's primitives (an op is defined once, each backend evaluates it) and ggml's
// supports_op (one table that dispatch and the coverage tests both read).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/op_list.h"
#include "tensor/memory.h"
#include "tensor/tensor.h"

namespace kiln::ops {

// How run() treats each tensor an op's arguments visit (op_args.h: `slots(f)`).
enum class Slot : std::uint8_t {
  In,      // read in the kernel's dtype: converted when it differs, made dense if the kernel asks
  Out,     // written in the kernel's dtype: through a buffer of that dtype when it differs
  InOut,   // read and written (in-place updates): converted in, and back after the kernel
  Stat,    // read, in the kernel's compute dtype (f32 for bf16/f16 kernels): row statistics
  Aux,     // read as is (token ids, masks): only made dense if the kernel asks
  AuxOut,  // written as is (statistics in their own dtype, masks, indices, accumulators)
};

// Which inputs (In, Stat, Aux) a kernel reads in place.
enum class Layout : std::uint8_t {
  Dense,    // contiguous inputs only: others get a contiguous copy (Temporaries)
  Strided,  // any strides: the kernel (or its glue) deals with them
};

// Scratch a kernel allocates inside one call, in bytes per buffer (each is a separate
// allocation, so a simulated caching allocator rounds each). Called on meta only.
using ScratchList = std::vector<std::int64_t>;

template <class A>
struct Kernel {
  void (*run)(A&) = nullptr;  // null: nothing registered
  Layout layout = Layout::Dense;
  // Per-slot override of `layout` (slot index in visiting order): false makes run() copy that
  // input to a contiguous tensor. Null: `layout` decides.
  bool (*accepts)(int slot, const Tensor& t) = nullptr;
  // The scratch the kernel allocates for these arguments, given its dtype. Null: none.
  ScratchList (*scratch)(const A& a, DType kernel_dtype) = nullptr;
  // Reads In tensors of any float dtype (converting in registers): run() converts none.
  bool mixed_inputs = false;
  // False: registered for its capabilities only (a CUDA kernel in a build without CUDA): the
  // meta device can simulate it, a real call fails.
  bool runnable = true;
};

// One row of the table, for listings and the coverage tests.
struct Registration {
  Op op;
  std::string_view kernel;  // the Args' name: "softmax", "softmax_backward", ...
  DeviceType device;
  DType dtype;
  bool runnable;
};

// Every registered kernel (the backends register theirs once, before the first lookup).
const std::vector<Registration>& registrations();

// Each backend's registrations (tensor/kernels_cpu_*.cpp, tensor/kernels_cuda_registry.cpp).
void register_cpu_kernels();
void register_cuda_kernels();

enum class AttentionImpl;  // tensor/ops.h
namespace cuda_glue {
// Puts the chosen implementation's attention entries in the CUDA table (bf16/f16; f32 always
// runs kiln's): tensor/kernels_cuda_attention.cpp. ops::set_attention_impl calls it.
void register_cuda_attention(AttentionImpl impl);
}  // namespace cuda_glue

namespace detail {

constexpr int kNumDevices = 3;  // DeviceType::CPU, CUDA, Meta (never registered)
constexpr int kNumDTypes = 7;

inline int table_index(DeviceType d, DType t) {
  return static_cast<int>(d) * kNumDTypes + static_cast<int>(t);
}

template <class A>
std::array<Kernel<A>, kNumDevices * kNumDTypes>& table() {
  static std::array<Kernel<A>, kNumDevices * kNumDTypes> t{};
  return t;
}

void note_registration(const Registration& r, bool present);
// no_kernel's message, for the tests that check it (they read this, not a copy of the text).
std::string no_kernel_message(std::string_view kernel, DeviceType dev, DType dt);
void ensure_registered();
[[noreturn]] void no_kernel(std::string_view kernel, DeviceType dev, DType dt);
[[noreturn]] void not_runnable(std::string_view kernel, DeviceType dev, DType dt);

// A tensor converted or made dense for a kernel: where it came from, to put results back.
struct Swap {
  Tensor* slot = nullptr;
  Tensor original;
  Slot kind = Slot::In;
};
Tensor prepare_input(const Tensor& t, DType want, bool dense);
void charge_scratch(const ScratchList& bytes, Device meta);

}  // namespace detail

// Registers (or replaces) the kernel of A for one device type and dtype. Returns the entry it
// replaced, so a test can put it back.
template <class A>
Kernel<A> register_kernel(DeviceType dev, DType dt, const Kernel<A>& k) {
  auto& slot = detail::table<A>()[detail::table_index(dev, dt)];
  Kernel<A> prev = slot;
  slot = k;
  detail::note_registration({A::kOp, A::kName, dev, dt, k.runnable}, k.run != nullptr);
  return prev;
}

// The kernel registered for exactly (dev, dt), or null.
template <class A>
const Kernel<A>* find_kernel(DeviceType dev, DType dt) {
  detail::ensure_registered();
  const auto& k = detail::table<A>()[detail::table_index(dev, dt)];
  return k.run ? &k : nullptr;
}

// The backend whose kernels a tensor on `d` uses: its own, or the simulated one on meta.
DeviceType kernel_device(Device d);

// The dtype a kernel computes row statistics in: f64 for f64 kernels, else f32.
inline DType compute_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// The device an op runs on and the dtype that picks its kernel: the anchor's, unless the
// arguments say otherwise (op_args.h).
template <class A>
Device args_device(const A& a) {
  if constexpr (requires { a.device(); })
    return a.device();
  else
    return a.anchor().device();
}
template <class A>
DType args_key(const A& a) {
  if constexpr (requires { a.key(); })
    return a.key();
  else
    return a.anchor().dtype();
}

template <class A>
struct Chosen {
  const Kernel<A>* kernel;
  DType dtype;  // the kernel's dtype: the key dtype, or f32 when converting
};

// The kernel run(a) would use: native for a's key dtype, else the f32 kernel for bf16/f16.
template <class A>
Chosen<A> choose_kernel(const A& a) {
  const DeviceType dev = kernel_device(args_device(a));
  const DType key = args_key(a);
  if (const Kernel<A>* k = find_kernel<A>(dev, key)) return {k, key};
  if (key == DType::BF16 || key == DType::F16)
    if (const Kernel<A>* k = find_kernel<A>(dev, DType::F32)) return {k, DType::F32};
  detail::no_kernel(A::kName, dev, key);
}

// True when a kernel on `d` takes dtype `dt` for A without conversion.
template <class A>
bool has_native_kernel(Device d, DType dt) {
  return find_kernel<A>(kernel_device(d), dt) != nullptr;
}

// Every tensor an op visits lives on the op's device, on every backend: a CPU tensor handed to
// a CUDA op is refused here with the same message on CUDA, on the CPU and on the meta device
// that simulates either, so a misplaced tensor (host token ids fed to a device model) fails a
// CPU-only test (SimulatedCuda.*) exactly as it fails on a GPU. Ops that move data between
// devices (copy) declare kCrossDevice.
template <class A>
void check_devices(A& a) {
  if constexpr (!requires { A::kCrossDevice; }) {
    const Device device = args_device(a);
    a.slots([&](Slot, Tensor& t) {
      if (t.defined() && t.device() != device)
        fail("[{}] tensors on different devices: {} and {}", A::kName, device.str(),
             t.device().str());
    });
  }
}

// Runs a chosen kernel: converts what it cannot read, runs it (or, on meta, charges its
// scratch), and puts converted outputs back. An empty anchor tensor runs nothing.
template <class A>
void run_chosen(A& a, const Chosen<A>& c) {
  const Kernel<A>& k = *c.kernel;
  const Device device = args_device(a);
  const bool meta = device.is_meta();
  check_devices(a);
  if (a.anchor().numel() == 0) return;
  std::array<detail::Swap, 12> swaps;
  int nswaps = 0, index = 0;
  a.slots([&](Slot kind, Tensor& t) {
    const int slot = index++;
    if (!t.defined()) return;
    const bool input =
        kind == Slot::In || kind == Slot::InOut || kind == Slot::Stat || kind == Slot::Aux;
    DType want = t.dtype();
    if ((kind == Slot::In && !k.mixed_inputs) || kind == Slot::Out || kind == Slot::InOut)
      want = c.dtype;
    else if (kind == Slot::Stat)
      want = compute_dtype(c.dtype);
    const bool dense =
        input && kind != Slot::InOut &&
        (k.accepts ? !k.accepts(slot, t) : k.layout == Layout::Dense && !t.is_contiguous());
    if (want == t.dtype() && !dense) return;
    Tensor replacement;
    {
      MemoryScope scratch(MemCategory::Temporaries);
      replacement = kind == Slot::Out ? Tensor::empty(t.shape(), want, t.device())
                                      : detail::prepare_input(t, want, dense);
    }
    swaps[nswaps++] = {&t, t, kind};
    t = replacement;
  });
  if (meta) {
    if (k.scratch) detail::charge_scratch(k.scratch(a, c.dtype), device);
  } else {
    if (!k.runnable) detail::not_runnable(A::kName, kernel_device(device), c.dtype);
    k.run(a);
  }
  for (int i = nswaps - 1; i >= 0; --i) {
    detail::Swap& s = swaps[i];
    Tensor used = *s.slot;
    *s.slot = s.original;
    if (s.kind == Slot::Out || s.kind == Slot::InOut) s.slot->copy_(used);
  }
}

// Looks up and runs the kernel for a's device and key dtype.
template <class A>
void run(A& a) {
  run_chosen(a, choose_kernel(a));
}

// RAII: a kernel registered for one scope (tests), the previous entry restored after.
template <class A>
class ScopedKernel {
 public:
  ScopedKernel(DeviceType dev, DType dt, const Kernel<A>& k) : dev_(dev), dt_(dt) {
    detail::ensure_registered();
    prev_ = register_kernel<A>(dev, dt, k);
  }
  ~ScopedKernel() { register_kernel<A>(dev_, dt_, prev_); }
  ScopedKernel(const ScopedKernel&) = delete;
  ScopedKernel& operator=(const ScopedKernel&) = delete;

 private:
  DeviceType dev_;
  DType dt_;
  Kernel<A> prev_;
};

}  // namespace kiln::ops
