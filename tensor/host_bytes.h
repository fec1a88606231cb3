// Loaders' bridge from bytes the host already holds (a file mapping, a reader's buffer) to
// tensors on any device. The one place that knows which devices address host memory: kiln's CPU
// tensors do, so a file's bytes can be a CPU tensor in place and a reader can write straight into
// a CPU tensor; any other device needs a copy, which the callers make when these say no.
#pragma once

#include <cstdint>
#include <memory>

#include "tensor/memory.h"
#include "tensor/tensor.h"

namespace kiln {

// A contiguous tensor of `shape` and `dtype` over the `nbytes` bytes at `bytes` (which `owner`
// keeps alive), read-only and counted as mapped under `category`, when `device` addresses host
// memory and `bytes` is aligned for dtype; else an undefined Tensor (the caller copies). nbytes
// must be shape's bytes in dtype.
Tensor host_bytes_in_place(const void* bytes, std::int64_t nbytes, const Shape& shape, DType dtype,
                           std::shared_ptr<const void> owner, Device device, MemCategory category);

// t's first element when t is a contiguous tensor of `dtype` in writable host memory (not file
// bytes used in place), where a reader can write its values straight in; else null (the caller
// reads into a host buffer and copies).
void* host_dense_data(const Tensor& t, DType dtype);

}  // namespace kiln
