// HDF5 training checkpoints: see checkpoint_h5.h for the file layout.
#include "models/io/checkpoint_h5.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "kernels/common/error.h"
#include "models/io/h5_util.h"

namespace kiln::io {

using namespace h5;  // this file's HDF5 helpers, split out into h5_util for its length

namespace {

constexpr const char* kVersionAttr = "kiln_checkpoint_version";
constexpr int64_t kVersion = 1;
constexpr const char* kDtypeAttr = "dtype";
constexpr const char* kHashAttr = "fnv1a64";
constexpr int kMaxRank = 32;
// Attributes live in the object header, which HDF5 caps at 64 KiB; big text goes to add_bytes.
constexpr size_t kMaxStringAttr = 60000;

struct DtypeDesc {
  const char* name;  // kiln name
  const char* attr;  // value of the dtype attribute
  size_t size;
  H5T_class_t cls;
  bool is_signed;
};

constexpr DtypeDesc kDtypes[] = {
    {"F32", "f32", 4, H5T_FLOAT, true},      {"F64", "f64", 8, H5T_FLOAT, true},
    {"BF16", "bf16", 2, H5T_INTEGER, false}, {"F16", "f16", 2, H5T_INTEGER, false},
    {"I32", "i32", 4, H5T_INTEGER, true},    {"I64", "i64", 8, H5T_INTEGER, true},
    {"U8", "u8", 1, H5T_INTEGER, false},
};

const DtypeDesc* find_dtype(const std::string& name, bool by_attr) {
  for (const auto& d : kDtypes)
    if (name == (by_attr ? d.attr : d.name)) return &d;
  return nullptr;
}

// Little-endian type in the file; the native type of the same layout for memory.
hid_t file_type(const DtypeDesc& d) {
  if (d.cls == H5T_FLOAT) return d.size == 4 ? H5T_IEEE_F32LE : H5T_IEEE_F64LE;
  switch (d.size) {
    case 1:
      return H5T_STD_U8LE;
    case 2:
      return H5T_STD_U16LE;
    case 4:
      return H5T_STD_I32LE;
    default:
      return H5T_STD_I64LE;
  }
}
hid_t mem_type(const DtypeDesc& d) {
  if (d.cls == H5T_FLOAT) return d.size == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
  switch (d.size) {
    case 1:
      return H5T_NATIVE_UINT8;
    case 2:
      return H5T_NATIVE_UINT16;
    case 4:
      return H5T_NATIVE_INT32;
    default:
      return H5T_NATIVE_INT64;
  }
}

// numel * elem_size with overflow checks; dims must be >= 0.
size_t checked_nbytes(const std::vector<int64_t>& shape, size_t elem, const std::string& what) {
  size_t n = elem;
  for (int64_t d : shape) {
    KILN_CHECK(d >= 0, "[checkpoint] {}: negative dimension {}", what, d);
    if (d != 0 && n > std::numeric_limits<size_t>::max() / static_cast<size_t>(d))
      fail("[checkpoint] {}: shape too large (size overflows)", what);
    n *= static_cast<size_t>(d);
  }
  return n;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    parts.push_back(
        path.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return parts;
}

// "<section>/<name...>": at least two components, none empty, "." or "..".
void validate_tensor_path(const std::string& path) {
  auto parts = split_path(path);
  KILN_CHECK(parts.size() >= 2,
             "[checkpoint] tensor path '{}' needs a section, e.g. 'model/<name>'", path);
  for (const auto& p : parts)
    KILN_CHECK(!p.empty() && p != "." && p != "..",
               "[checkpoint] bad tensor path '{}' (empty, '.' or '..' component)", path);
}

std::string blob_path(const std::string& name) {
  return name.find('/') == std::string::npos ? "meta/" + name : name;
}

// True if every prefix of `path` is a link under loc (H5Lexists needs that, component by
// component). Soft and external links are refused: a checkpoint is one self-contained file.
bool path_exists(hid_t loc, const std::string& path) {
  std::string prefix;
  for (const auto& part : split_path(path)) {
    prefix += prefix.empty() ? part : "/" + part;
    htri_t e = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
    if (e < 0) h5_fail("cannot look up '{}'", prefix);
    if (e == 0) return false;
    H5L_info_t info;
    if (H5Lget_info(loc, prefix.c_str(), &info, H5P_DEFAULT) < 0)
      h5_fail("cannot look up '{}'", prefix);
    if (info.type != H5L_TYPE_HARD) fail("[checkpoint] '{}' is a soft or external link", prefix);
  }
  return true;
}

// ---- datasets ----------------------------------------------------------------------------

struct OpenTensor {
  Id dset;
  const DtypeDesc* dt = nullptr;
  TensorInfo info;
};

OpenTensor open_tensor(hid_t file, const std::string& path) {
  validate_tensor_path(path);
  KILN_CHECK(path_exists(file, path), "[checkpoint] no tensor '{}' in the file", path);
  OpenTensor t;
  t.dset = checked(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose,
                   "'{}' is not a readable dataset", path);
  const std::string where = fmt::format("tensor '{}'", path);
  std::string dname = read_string_attr(t.dset, kDtypeAttr, where);
  t.dt = find_dtype(dname, true);
  KILN_CHECK(t.dt, "[checkpoint] tensor '{}' has unknown dtype '{}'", path, dname);
  t.info.dtype = t.dt->name;

  // The stored element type must match the dtype attribute.
  Id type = checked(H5Dget_type(t.dset), H5Tclose, "tensor '{}' type", path);
  H5T_class_t cls = H5Tget_class(type);
  size_t tsize = H5Tget_size(type);
  bool sign_ok = true;
  if (cls == H5T_INTEGER) sign_ok = (H5Tget_sign(type) == H5T_SGN_2) == t.dt->is_signed;
  KILN_CHECK(cls == t.dt->cls && tsize == t.dt->size && sign_ok,
             "[checkpoint] tensor '{}': stored element type does not match dtype '{}'", path,
             dname);
  check_standard_number_type(type, where);

  Id space = checked(H5Dget_space(t.dset), H5Sclose, "tensor '{}' dataspace", path);
  H5S_class_t sc = H5Sget_simple_extent_type(space);
  KILN_CHECK(sc == H5S_SCALAR || sc == H5S_SIMPLE, "[checkpoint] tensor '{}' has no dataspace",
             path);
  if (sc == H5S_SIMPLE) {
    int rank = H5Sget_simple_extent_ndims(space);
    KILN_CHECK(rank >= 0 && rank <= kMaxRank, "[checkpoint] tensor '{}' has bad rank {}", path,
               rank);
    hsize_t dims[kMaxRank];
    KILN_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr) == rank,
               "[checkpoint] tensor '{}': cannot read dims", path);
    for (int i = 0; i < rank; ++i) {
      KILN_CHECK(dims[i] <= static_cast<hsize_t>(std::numeric_limits<int64_t>::max()),
                 "[checkpoint] tensor '{}': dimension {} too large", path, i);
      t.info.shape.push_back(static_cast<int64_t>(dims[i]));
    }
  }
  t.info.nbytes = checked_nbytes(t.info.shape, t.dt->size, where);

  // For the contiguous layout we write, the stored bytes must be exactly the tensor and lie
  // inside the file (catches an inconsistent header before we read anything).
  Id dcpl = checked(H5Dget_create_plist(t.dset), H5Pclose, "tensor '{}' properties", path);
  // kiln writes contiguous datasets with no filters, so a tensor never holds more bytes than the
  // file. A chunked or compact dataset may declare any shape; refuse one larger than the file
  // before anything is allocated for it (a 3 MB file must not ask for 16 GiB).
  if (H5Pget_layout(dcpl) != H5D_CONTIGUOUS) {
    hsize_t fsize = 0;
    check(H5Fget_filesize(file, &fsize), "file size");
    KILN_CHECK(t.info.nbytes <= fsize,
               "[checkpoint] tensor '{}' declares shape {} ({} bytes), more than the whole file "
               "({} bytes): corrupt",
               path, fmt::join(t.info.shape, "x"), t.info.nbytes, fsize);
  }
  if (H5Pget_layout(dcpl) == H5D_CONTIGUOUS && t.info.nbytes > 0) {
    hsize_t stored = H5Dget_storage_size(t.dset);
    KILN_CHECK(stored == t.info.nbytes,
               "[checkpoint] tensor '{}': {} bytes stored, shape needs {}: file is corrupt", path,
               stored, t.info.nbytes);
    haddr_t off = H5Dget_offset(t.dset);
    hsize_t fsize = 0;
    check(H5Fget_filesize(file, &fsize), "file size");
    KILN_CHECK(off != HADDR_UNDEF && off <= fsize && t.info.nbytes <= fsize - off,
               "[checkpoint] tensor '{}' data lies past the end of the file (truncated?)", path);
  }
  return t;
}

// hash: verify the checksum (the probe reads the attribute but leaves the hashing, which is
// kiln's own arithmetic on a buffer and most of the time, to the load).
void read_into(const std::string& path, OpenTensor& t, void* dst, size_t nbytes, bool hash = true) {
  KILN_CHECK(nbytes == t.info.nbytes, "[checkpoint] tensor '{}' has {} bytes, buffer has {}", path,
             t.info.nbytes, nbytes);
  if (nbytes > 0) {
    KILN_CHECK(dst, "[checkpoint] null buffer for tensor '{}'", path);
    check(H5Dread(t.dset, mem_type(*t.dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst),
          "cannot read tensor '{}'", path);
  }
  uint64_t want = read_u64_attr(t.dset, kHashAttr, fmt::format("tensor '{}'", path));
  if (!hash) return;
  KILN_CHECK(fnv1a64(dst, nbytes) == want,
             "[checkpoint] tensor {} checksum mismatch: file is corrupt", path);
}

void fsync_path(const std::string& p, bool dir) {
  int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail("[checkpoint] cannot open '{}' to fsync: {}", p, std::strerror(errno));
  int r = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (r != 0) fail("[checkpoint] fsync of '{}' failed: {}", p, std::strerror(err));
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t nbytes, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < nbytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

size_t checkpoint_dtype_size(const std::string& dtype) {
  const DtypeDesc* d = find_dtype(dtype, false);
  KILN_CHECK(d, "[checkpoint] unknown dtype '{}' (F32, F64, BF16, F16, I32, I64, U8)", dtype);
  return d->size;
}

// ---- CheckpointWriter --------------------------------------------------------------------

void CheckpointWriter::add_tensor(const std::string& path, const std::string& dtype,
                                  const std::vector<int64_t>& shape, const void* data) {
  validate_tensor_path(path);
  KILN_CHECK(static_cast<int>(shape.size()) <= kMaxRank, "[checkpoint] tensor '{}': rank {} > {}",
             path, shape.size(), kMaxRank);
  Entry e;
  e.path = path;
  e.dtype = dtype;
  e.shape = shape;
  e.data = data;
  e.nbytes = checked_nbytes(shape, checkpoint_dtype_size(dtype), "tensor '" + path + "'");
  KILN_CHECK(data || e.nbytes == 0, "[checkpoint] tensor '{}': null data", path);
  entries_.push_back(std::move(e));
}

void CheckpointWriter::set_attr(Attr a) {
  KILN_CHECK(!a.name.empty() && a.name != kVersionAttr, "[checkpoint] bad attribute name '{}'",
             a.name);
  for (auto& old : attrs_)
    if (old.name == a.name) {
      old = std::move(a);
      return;
    }
  attrs_.push_back(std::move(a));
}

void CheckpointWriter::set_attr_i64(const std::string& name, int64_t value) {
  set_attr(Attr{name, 0, value, 0.0, {}});
}
void CheckpointWriter::set_attr_f64(const std::string& name, double value) {
  set_attr(Attr{name, 1, 0, value, {}});
}
void CheckpointWriter::set_attr_string(const std::string& name, const std::string& value) {
  KILN_CHECK(value.size() <= kMaxStringAttr,
             "[checkpoint] attribute '{}' is {} bytes; store text over {} bytes with add_bytes",
             name, value.size(), kMaxStringAttr);
  set_attr(Attr{name, 2, 0, 0.0, value});
}

void CheckpointWriter::add_bytes(const std::string& name, std::vector<uint8_t> data) {
  std::string path = blob_path(name);
  validate_tensor_path(path);
  blobs_.push_back(std::move(data));
  Entry e;
  e.path = path;
  e.dtype = "U8";
  e.shape = {static_cast<int64_t>(blobs_.back().size())};
  e.nbytes = blobs_.back().size();
  e.blob = static_cast<int>(blobs_.size()) - 1;
  entries_.push_back(std::move(e));
}

void CheckpointWriter::write(const std::string& path) const {
  h5_quiet();
  KILN_CHECK(!path.empty(), "[checkpoint] empty output path");
  const std::string tmp = path + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
    fail("[checkpoint] cannot remove stale '{}': {}", tmp, std::strerror(errno));
  try {
    // CLOSE_STRONG: closing the file closes every object in it, so an exception part-way
    // through cannot leave the temp file open.
    Id fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
    check(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), "fclose degree");
    Id file = checked(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose,
                      "cannot create '{}'", tmp);
    write_attr(file, kVersionAttr, H5T_STD_I64LE, H5T_NATIVE_INT64, &kVersion);
    for (const auto& a : attrs_) {
      if (a.kind == 0) write_attr(file, a.name, H5T_STD_I64LE, H5T_NATIVE_INT64, &a.i);
      if (a.kind == 1) write_attr(file, a.name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &a.f);
      if (a.kind == 2) write_string_attr(file, a.name, a.s);
    }
    for (const char* g : {"model", "meta"}) {
      Id grp = checked(H5Gcreate2(file, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                       "cannot create group '{}'", g);
    }
    Id lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "link properties");
    check(H5Pset_create_intermediate_group(lcpl, 1), "intermediate groups");
    for (const auto& e : entries_) {
      const DtypeDesc& d = *find_dtype(e.dtype, false);
      const void* data = e.blob >= 0 ? blobs_[e.blob].data() : e.data;
      Id space;
      if (e.shape.empty()) {
        space = checked(H5Screate(H5S_SCALAR), H5Sclose, "dataspace for '{}'", e.path);
      } else {
        std::vector<hsize_t> dims(e.shape.begin(), e.shape.end());
        space = checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                        H5Sclose, "dataspace for '{}'", e.path);
      }
      Id dset = checked(
          H5Dcreate2(file, e.path.c_str(), file_type(d), space, lcpl, H5P_DEFAULT, H5P_DEFAULT),
          H5Dclose, "cannot create dataset '{}'", e.path);
      if (e.nbytes > 0)
        check(H5Dwrite(dset, mem_type(d), H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
              "cannot write dataset '{}'", e.path);
      write_string_attr(dset, kDtypeAttr, d.attr);
      uint64_t h = fnv1a64(data, e.nbytes);
      write_attr(dset, kHashAttr, H5T_STD_U64LE, H5T_NATIVE_UINT64, &h);
    }
    if (file.close() < 0) h5_fail("cannot close (flush) '{}'", tmp);
    fsync_path(tmp, false);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("[checkpoint] cannot rename '{}' to '{}': {}", tmp, path, std::strerror(err));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_path(dir.empty() ? "." : dir, true);
}

// ---- CheckpointReader --------------------------------------------------------------------

CheckpointReader::~CheckpointReader() { close(); }

void CheckpointReader::close() {
  if (file_ >= 0) H5Fclose(static_cast<hid_t>(file_));
  file_ = -1;
  path_.clear();
}

namespace {
// Exists and is a regular file (a FIFO or device is refused before anything opens it).
void check_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    struct stat tst {};
    if (::stat((path + ".tmp").c_str(), &tst) == 0)
      fail(
          "[checkpoint] '{}' does not exist; only a half-written '{}.tmp' (an interrupted "
          "save) is there",
          path, path);
    fail("[checkpoint] '{}' does not exist", path);
  }
  KILN_CHECK(S_ISREG(st.st_mode), "[checkpoint] '{}' is not a regular file", path);
}
}  // namespace

void CheckpointReader::open(const std::string& path) {
  close();
  check_regular_file(path);
  const FileIdentity probed = probe_checkpoint(path);
  // The probe read this exact file; one swapped in or rewritten since is refused, not trusted.
  if (!(open_unprobed(path) == probed)) {
    close();
    fail("[checkpoint] {}: the file changed while it was being checked; try again", path);
  }
  (void)walk_metadata();  // the child's first steps again, from the same state (see there)
}

FileIdentity CheckpointReader::open_unprobed(const std::string& path) {
  h5_quiet();
  close();
  check_regular_file(path);
#if H5_VERSION_GE(1, 12, 0)
  htri_t is_h5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
  htri_t is_h5 = H5Fis_hdf5(path.c_str());
#endif
  H5Eclear2(H5E_DEFAULT);
  KILN_CHECK(is_h5 > 0, "[checkpoint] '{}' is not an HDF5 file", path);
  Id fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
  check(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), "fclose degree");
  Id file = checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose,
                    "cannot open '{}' (truncated or corrupt?)", path);
  const std::string where = fmt::format("'{}'", path);
  htri_t has_v = H5Aexists(file, kVersionAttr);
  if (has_v < 0) h5_fail("cannot read the root of '{}' (corrupt?)", path);
  KILN_CHECK(has_v > 0, "[checkpoint] '{}' is HDF5 but not a kiln checkpoint (no {})", path,
             kVersionAttr);
  int64_t v = read_i64_attr(file, kVersionAttr, where);
  KILN_CHECK(v == kVersion, "[checkpoint] '{}' has {} {}, this build reads {}", path, kVersionAttr,
             v, kVersion);
  for (const char* g : {"model", "meta"}) {
    bool ok = path_exists(file, g);
    if (ok) {
      Id o = checked(H5Oopen(file, g, H5P_DEFAULT), H5Oclose, "cannot open '{}'", g);
      ok = H5Iget_type(o) == H5I_GROUP;
    }
    KILN_CHECK(ok, "[checkpoint] '{}' is missing the required group '{}'", path, g);
  }
  // The identity of what HDF5 opened (its own descriptor), for the probe's same-file checks.
  void* handle = nullptr;
  check(H5Fget_vfd_handle(file, fapl, &handle), "file handle of '{}'", path);
  KILN_CHECK(handle, "[checkpoint] no file handle for '{}'", path);
  FileIdentity id = file_identity(*static_cast<int*>(handle), path);
  file_ = file.release();  // the reader's close() closes it from now on
  path_ = path;
  return id;
}

bool CheckpointReader::has_group(const std::string& group) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  if (group.empty() || !path_exists(file_, group)) return false;
  Id o = checked(H5Oopen(file_, group.c_str(), H5P_DEFAULT), H5Oclose, "cannot open '{}'", group);
  return H5Iget_type(o) == H5I_GROUP;
}

namespace {
herr_t visit_link(hid_t g, const char* name, const H5L_info_t* info, void* p) {
  if (info->type != H5L_TYPE_HARD) return 0;
  hid_t o = H5Oopen(g, name, H5P_DEFAULT);
  if (o < 0) return -1;
  bool is_dset = H5Iget_type(o) == H5I_DATASET;
  H5Oclose(o);
  if (is_dset) static_cast<std::vector<std::string>*>(p)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> CheckpointReader::list_tensors(const std::string& group) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  KILN_CHECK(has_group(group), "[checkpoint] '{}' has no group '{}'", path_, group);
  Id g = checked(H5Gopen2(file_, group.c_str(), H5P_DEFAULT), H5Gclose, "cannot open '{}'", group);
  std::vector<std::string> names;
  check(H5Lvisit(g, H5_INDEX_NAME, H5_ITER_INC, visit_link, &names),
        "cannot list group '{}' (corrupt?)", group);
  std::sort(names.begin(), names.end());
  return names;
}

bool CheckpointReader::has_tensor(const std::string& path) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  if (!path_exists(file_, path)) return false;
  Id o = checked(H5Oopen(file_, path.c_str(), H5P_DEFAULT), H5Oclose, "cannot open '{}'", path);
  return H5Iget_type(o) == H5I_DATASET;
}

TensorInfo CheckpointReader::tensor_info(const std::string& path) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  return open_tensor(file_, path).info;
}

TensorData CheckpointReader::read_tensor(const std::string& path) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  OpenTensor t = open_tensor(file_, path);
  TensorData out;
  out.dtype = t.info.dtype;
  out.shape = t.info.shape;
  out.bytes.resize(t.info.nbytes);
  read_into(path, t, out.bytes.data(), out.bytes.size());
  return out;
}

void CheckpointReader::read_tensor_into(const std::string& path, void* dst, size_t nbytes) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  OpenTensor t = open_tensor(file_, path);
  read_into(path, t, dst, nbytes);
}

std::vector<uint8_t> CheckpointReader::read_bytes(const std::string& name) const {
  TensorData t = read_tensor(blob_path(name));
  KILN_CHECK(t.dtype == "U8" && t.shape.size() == 1, "[checkpoint] '{}' is not a byte blob", name);
  return std::move(t.bytes);
}

std::vector<std::string> CheckpointReader::list_groups() const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  std::vector<std::string> links;
  auto collect = [](hid_t, const char* name, const H5L_info_t* info, void* p) -> herr_t {
    if (info->type == H5L_TYPE_HARD) static_cast<std::vector<std::string>*>(p)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  check(H5Literate(file_, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &links),
        "cannot list the root of '{}' (corrupt?)", path_);
  std::vector<std::string> groups;
  for (const std::string& l : links)
    if (has_group(l)) groups.push_back(l);
  std::sort(groups.begin(), groups.end());
  return groups;
}

std::vector<std::string> CheckpointReader::list_attrs() const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* p) -> herr_t {
    static_cast<std::vector<std::string>*>(p)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  check(H5Aiterate2(file_, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names),
        "cannot list the attributes of '{}' (corrupt?)", path_);
  std::sort(names.begin(), names.end());
  return names;
}

char CheckpointReader::attr_kind(const std::string& name) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  Id a = open_attr(file_, name, "'" + path_ + "'");
  Id type = checked(H5Aget_type(a), H5Tclose, "attribute '{}' type", name);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return 'i';
    case H5T_FLOAT:
      return 'f';
    case H5T_STRING:
      return 's';
    default:
      return '?';
  }
}

bool CheckpointReader::has_attr(const std::string& name) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  htri_t e = H5Aexists(file_, name.c_str());
  if (e < 0) h5_fail("cannot look up attribute '{}'", name);
  return e > 0;
}

int64_t CheckpointReader::get_attr_i64(const std::string& name) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  return read_i64_attr(file_, name, "'" + path_ + "'");
}
double CheckpointReader::get_attr_f64(const std::string& name) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  return read_f64_attr(file_, name, "'" + path_ + "'");
}
std::string CheckpointReader::get_attr_string(const std::string& name) const {
  KILN_CHECK(is_open(), "[checkpoint] no file open");
  return read_string_attr(file_, name, "'" + path_ + "'");
}

namespace {
// Runs one read of the probe. kiln's own refusal of one tensor or attribute (a bad dtype, a
// checksum mismatch, a declared shape larger than the file) is left to the load, which makes the
// same check before HDF5 goes further; an error HDF5 reports ends the probe.
template <typename F>
void probe_step(F&& f) {
  try {
    f();
  } catch (const HdfError&) {  // the whole file is refused (run_probe names it)
    throw;
  } catch (const Error&) {
  }
}
}  // namespace

// The root attributes and groups kiln's loaders ask for by name (models/checkpoint.cpp), present or
// not: a lookup of a name that is absent takes its own path through libhdf5, so the probe makes it.
constexpr const char* kLoadAttrs[] = {"config",        "args",           "step",
                                      "data_seed",     "data_position",  "model_seed",
                                      "best_val_loss", "tokenizer_spec", "optimizer_step"};
constexpr const char* kLoadGroups[] = {"model", "meta", "optim_m", "optim_v"};

// The metadata half of the probe, run first by the child and then, in the same order from the
// same state (the child is a fork), by open() in this process: every root attribute and every
// name the loaders ask for, through the calls they make (has_attr, the getter of its kind); for
// every dataset under every root group the calls load_checkpoint makes (has_tensor, tensor_info:
// path lookup, dtype, shape, storage checks) and its checksum attribute. libhdf5 parses and
// caches each object here as the child did, so the reads kiln makes afterwards meet structures
// that already parsed without harm. Returns the datasets' paths.
std::vector<std::string> CheckpointReader::walk_metadata() {
  std::vector<std::string> attrs = list_attrs();
  for (const char* a : kLoadAttrs)
    if (std::find(attrs.begin(), attrs.end(), a) == attrs.end()) attrs.push_back(a);
  for (const std::string& a : attrs) {
    probe_step([&] {
      if (!has_attr(a)) return;
      const char kind = attr_kind(a);
      if (kind == 'i') (void)get_attr_i64(a);
      if (kind == 'i' || kind == 'f') (void)get_attr_f64(a);
      if (kind == 's') (void)get_attr_string(a);
    });
  }
  for (const char* g : kLoadGroups) probe_step([&] { (void)has_group(g); });
  probe_step([&] { (void)has_tensor(blob_path("tokenizer")); });
  std::vector<std::string> tensors;
  for (const std::string& g : list_groups()) {
    std::vector<std::string> names;
    probe_step([&] { names = list_tensors(g); });
    for (const std::string& name : names) {
      const std::string p = g + "/" + name;
      probe_step([&] {
        if (!has_tensor(p)) return;
        (void)tensor_info(p);
        OpenTensor t = open_tensor(file_, p);
        (void)read_u64_attr(t.dset, kHashAttr, "tensor '" + p + "'");
        tensors.push_back(p);
      });
    }
  }
  return tensors;
}

namespace detail {

// Everything a load reads: the format checks of open() and walk_metadata(), then the data of
// every dataset. Extra objects kiln would not read are read too: a file is probed whole.
void probe_read_all(const std::string& path, const FileIdentity& expect) {
  CheckpointReader r;
  KILN_CHECK(r.open_unprobed(path) == expect,
             "[checkpoint] {}: the file changed while it was being checked; try again", path);
  std::vector<uint8_t> buf;
  for (const std::string& p : r.walk_metadata()) {
    probe_step([&] {
      OpenTensor t = open_tensor(r.file_, p);
      buf.resize(t.info.nbytes);
      read_into(p, t, buf.data(), buf.size(), /*hash=*/false);
    });
  }
}

}  // namespace detail

}  // namespace kiln::io
