// HDF5 helpers shared by the checkpoint reader and writer (checkpoint_h5.cpp): error handling
// (every HDF5 call is checked; HDF5's own error stack is read into kiln's message), an owning id,
// and scalar attributes, read with their type checked before HDF5 converts them.
#pragma once

#include <fmt/format.h>
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>

#include "kernels/common/error.h"

namespace kiln::io::h5 {

// Switches off HDF5's printing of error stacks to stderr (once); we read the stack ourselves.
void h5_quiet();
// The current HDF5 error stack as one line, and clear it.
std::string h5_error_text();

// An error HDF5 itself reported (not one of kiln's checks on what it returned): the probe's child
// refuses the whole file on one, since the in-process load would walk into the same structure.
struct HdfError : Error {
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void h5_fail(fmt::format_string<Args...> f, Args&&... args) {
  std::string what = fmt::format(f, std::forward<Args>(args)...);
  throw HdfError(fmt::format("[checkpoint] {} (HDF5: {})", what, h5_error_text()));
}

// Owns one HDF5 id and closes it with the matching H5*close.
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~Id() { reset(); }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  // Close now and report failure (closing a file flushes it, so this can fail for real).
  herr_t close() {
    herr_t r = (id_ >= 0 && closer_) ? closer_(id_) : 0;
    id_ = -1;
    return r;
  }
  hid_t get() const { return id_; }
  // Give up ownership without closing.
  hid_t release() { return std::exchange(id_, -1); }
  operator hid_t() const { return id_; }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

template <typename... Args>
Id checked(hid_t id, herr_t (*closer)(hid_t), fmt::format_string<Args...> f, Args&&... args) {
  if (id < 0) h5_fail(f, std::forward<Args>(args)...);
  return Id(id, closer);
}

template <typename... Args>
void check(herr_t r, fmt::format_string<Args...> f, Args&&... args) {
  if (r < 0) h5_fail(f, std::forward<Args>(args)...);
}

// ---- scalar attributes -----------------------------------------------------------------------
void write_attr(hid_t obj, const std::string& name, hid_t ftype, hid_t mtype, const void* v);
void write_string_attr(hid_t obj, const std::string& name, const std::string& value);
Id open_attr(hid_t obj, const std::string& name, const std::string& where);
// A number type read from the file must be one of HDF5's standard integer or IEEE float types;
// fails naming `what` otherwise (see h5_util.cpp for why).
void check_standard_number_type(hid_t type, const std::string& what);
int64_t read_i64_attr(hid_t obj, const std::string& name, const std::string& where);
uint64_t read_u64_attr(hid_t obj, const std::string& name, const std::string& where);
double read_f64_attr(hid_t obj, const std::string& name, const std::string& where);
std::string read_string_attr(hid_t obj, const std::string& name, const std::string& where);

}  // namespace kiln::io::h5
