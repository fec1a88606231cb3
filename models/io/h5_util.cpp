// HDF5 helpers of the checkpoint files: see h5_util.h.
#include "models/io/h5_util.h"

#include <algorithm>

namespace kiln::io::h5 {

void h5_quiet() {
  static const bool done = [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

namespace {

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* out) {
  auto* msg = static_cast<std::string*>(out);
  if (n >= 4) return 0;  // the innermost few frames say what went wrong; the rest is noise
  if (!msg->empty()) msg->append("; ");
  msg->append(e->func_name ? e->func_name : "?");
  msg->append(": ");
  msg->append(e->desc ? e->desc : "?");
  return 0;
}

}  // namespace

std::string h5_error_text() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? std::string("no HDF5 error detail") : msg;
}

void write_attr(hid_t obj, const std::string& name, hid_t ftype, hid_t mtype, const void* v) {
  if (H5Aexists(obj, name.c_str()) > 0) check(H5Adelete(obj, name.c_str()), "delete attr");
  Id space = checked(H5Screate(H5S_SCALAR), H5Sclose, "dataspace for attr '{}'", name);
  Id a = checked(H5Acreate2(obj, name.c_str(), ftype, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                 "cannot create attribute '{}'", name);
  check(H5Awrite(a, mtype, v), "cannot write attribute '{}'", name);
}

void write_string_attr(hid_t obj, const std::string& name, const std::string& value) {
  // Fixed-length, null-padded UTF-8 (size >= 1: HDF5 has no zero-length fixed strings).
  Id t = checked(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
  check(H5Tset_size(t, std::max<size_t>(1, value.size())), "string type size");
  check(H5Tset_strpad(t, H5T_STR_NULLPAD), "string type pad");
  check(H5Tset_cset(t, H5T_CSET_UTF8), "string type cset");
  std::string buf = value.empty() ? std::string(1, '\0') : value;
  write_attr(obj, name, t, t, buf.data());
}

Id open_attr(hid_t obj, const std::string& name, const std::string& where) {
  htri_t e = H5Aexists(obj, name.c_str());
  if (e < 0) h5_fail("cannot look up attribute '{}' of {}", name, where);
  if (e == 0) fail("[checkpoint] {} has no attribute '{}'", where, name);
  return checked(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose,
                 "cannot open attribute '{}' of {}", name, where);
}

// A number type read from the file must be one of HDF5's standard integer or IEEE float types
// (what kiln and h5py write). HDF5 converts to the native type on read, and its conversion trusts
// the file's precision and bit offset: a crafted "int64" with 300 bits of precision makes
// H5T__conv_i_i read and write past its buffers (a segfault the probe cannot always see first,
// since it depends on what lies next to the buffer). H5Tequal compares descriptions only.
void check_standard_number_type(hid_t type, const std::string& what) {
  static const hid_t kStandard[] = {H5T_STD_I8LE,   H5T_STD_I8BE,   H5T_STD_U8LE,   H5T_STD_U8BE,
                                    H5T_STD_I16LE,  H5T_STD_I16BE,  H5T_STD_U16LE,  H5T_STD_U16BE,
                                    H5T_STD_I32LE,  H5T_STD_I32BE,  H5T_STD_U32LE,  H5T_STD_U32BE,
                                    H5T_STD_I64LE,  H5T_STD_I64BE,  H5T_STD_U64LE,  H5T_STD_U64BE,
                                    H5T_IEEE_F32LE, H5T_IEEE_F32BE, H5T_IEEE_F64LE, H5T_IEEE_F64BE};
  for (hid_t t : kStandard) {
    htri_t eq = H5Tequal(type, t);
    if (eq < 0) h5_fail("cannot compare the type of {}", what);
    if (eq > 0) return;
  }
  fail("[checkpoint] {} has a non-standard number type (size {}, precision {}, offset {})", what,
       H5Tget_size(type), H5Tget_precision(type), H5Tget_offset(type));
}

namespace {

// Opens a one-element attribute and checks its type class.
Id open_scalar_attr(hid_t obj, const std::string& name, const std::string& where, H5T_class_t want,
                    Id* type_out) {
  Id a = open_attr(obj, name, where);
  Id space = checked(H5Aget_space(a), H5Sclose, "attribute '{}' dataspace", name);
  hssize_t n = H5Sget_simple_extent_npoints(space);
  KILN_CHECK(n == 1, "[checkpoint] attribute '{}' of {} is not a single value", name, where);
  Id type = checked(H5Aget_type(a), H5Tclose, "attribute '{}' type", name);
  H5T_class_t cls = H5Tget_class(type);
  bool ok = cls == want || (want == H5T_FLOAT && cls == H5T_INTEGER);
  KILN_CHECK(ok, "[checkpoint] attribute '{}' of {} has the wrong type", name, where);
  if (cls == H5T_INTEGER || cls == H5T_FLOAT)
    check_standard_number_type(type, fmt::format("attribute '{}' of {}", name, where));
  if (type_out) *type_out = std::move(type);
  return a;
}

}  // namespace

int64_t read_i64_attr(hid_t obj, const std::string& name, const std::string& where) {
  Id a = open_scalar_attr(obj, name, where, H5T_INTEGER, nullptr);
  int64_t v = 0;
  check(H5Aread(a, H5T_NATIVE_INT64, &v), "cannot read attribute '{}'", name);
  return v;
}

uint64_t read_u64_attr(hid_t obj, const std::string& name, const std::string& where) {
  Id a = open_scalar_attr(obj, name, where, H5T_INTEGER, nullptr);
  uint64_t v = 0;
  check(H5Aread(a, H5T_NATIVE_UINT64, &v), "cannot read attribute '{}'", name);
  return v;
}

double read_f64_attr(hid_t obj, const std::string& name, const std::string& where) {
  Id a = open_scalar_attr(obj, name, where, H5T_FLOAT, nullptr);
  double v = 0;
  check(H5Aread(a, H5T_NATIVE_DOUBLE, &v), "cannot read attribute '{}'", name);
  return v;
}

std::string read_string_attr(hid_t obj, const std::string& name, const std::string& where) {
  Id type;
  Id a = open_scalar_attr(obj, name, where, H5T_STRING, &type);
  htri_t vlen = H5Tis_variable_str(type);
  if (vlen < 0) h5_fail("attribute '{}' string type", name);
  if (vlen > 0) {  // as written by h5py for Python str
    Id mt = checked(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
    check(H5Tset_size(mt, H5T_VARIABLE), "string type size");
    char* p = nullptr;
    check(H5Aread(a, mt, &p), "cannot read attribute '{}'", name);
    std::string s = p ? std::string(p) : std::string();
    if (p) H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(type);
  KILN_CHECK(n > 0 && n <= (size_t{1} << 20), "[checkpoint] attribute '{}' has bad size {}", name,
             n);
  std::string s(n, '\0');
  check(H5Aread(a, type, s.data()), "cannot read attribute '{}'", name);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

}  // namespace kiln::io::h5
