// CPU ISA detection (see isa.h). CPUID says what the core implements; XCR0 (xgetbv) says which
// register state the OS saves, without which the instructions fault; Linux additionally makes a
// process ask for the 8 KiB AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM) before first use.
#include "kernels/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <dnnl.hpp>
#include <string>

#include "kernels/common/error.h"

#if KILN_CPU_X86
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kiln::cpu {
namespace {

constexpr int kNoOverride = -1;
std::atomic<int> g_scoped_cap{kNoOverride};

#if KILN_CPU_X86
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

// Linux: request permission to use AMX tile data (XFEATURE 18). Returns true when granted
// (also when it was granted before). Refused on kernels older than 5.16 or under seccomp.
bool request_amx_permission() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

CpuIsa detect() {
#if KILN_CPU_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return CpuIsa::Scalar;
  const bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, avx = (c >> 28) & 1,
             f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return CpuIsa::Scalar;
  const uint64_t xcr0 = read_xcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;            // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;          // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  if (__get_cpuid_max(0, nullptr) < 7) return CpuIsa::Scalar;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1,
             avx512vl = (b >> 31) & 1, amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  const bool avx512_bf16 = (a1 >> 5) & 1;

  if (!(os_ymm && avx2 && fma && f16c)) return CpuIsa::Scalar;
  if (!(os_zmm && avx512f && avx512bw && avx512vl)) return CpuIsa::Avx2;
  if (!avx512_bf16) return CpuIsa::Avx512;
  if (!(os_tiles && amx_tile && amx_bf16 && request_amx_permission())) return CpuIsa::Avx512Bf16;
  return CpuIsa::Amx;
#else
  return CpuIsa::Scalar;
#endif
}

// KILN_CPU_ISA, read once; kNoOverride when unset or empty.
int env_cap() {
  static const int cap = [] {
    const char* v = std::getenv("KILN_CPU_ISA");
    if (v == nullptr || *v == '\0') return kNoOverride;
    const CpuIsa want = parse_cpu_isa(v);
    KILN_CHECK(static_cast<int>(want) <= static_cast<int>(cpu_isa_detected()),
               "[cpu_isa] KILN_CPU_ISA={} asks for more than this CPU supports (detected {})", v,
               cpu_isa_name(cpu_isa_detected()));
    return static_cast<int>(want);
  }();
  return cap;
}

// oneDNN picks its kernels by its own CPU detection. Cap it once, before its first primitive, at
// the level kiln runs at (detected, or KILN_CPU_ISA), so KILN_CPU_ISA=avx512 keeps oneDNN off
// AMX and AVX512-BF16 too. oneDNN accepts the cap only before it generates code, so a later
// ScopedCpuIsa cannot lower it: tests of oneDNN's lower levels run under KILN_CPU_ISA.
bool cap_onednn(CpuIsa level) {
  dnnl::cpu_isa isa = dnnl::cpu_isa::all;
  switch (level) {
    case CpuIsa::Scalar:
      isa = dnnl::cpu_isa::sse41;
      break;
    case CpuIsa::Avx2:
      isa = dnnl::cpu_isa::avx2;
      break;
    case CpuIsa::Avx512:
      isa = dnnl::cpu_isa::avx512_core;
      break;
    case CpuIsa::Avx512Bf16:
      isa = dnnl::cpu_isa::avx512_core_bf16;
      break;
    case CpuIsa::Amx:
      isa = dnnl::cpu_isa::avx512_core_amx;
      break;
  }
  const dnnl::status st = dnnl::set_max_cpu_isa(isa);
  KILN_CHECK(st == dnnl::status::success,
             "[cpu_isa] oneDNN refused the ISA cap {} (status {}): a oneDNN primitive was "
             "created before kiln's first cpu_isa() call",
             cpu_isa_name(level), static_cast<int>(st));
  return true;
}

}  // namespace

CpuIsa cpu_isa_detected() {
  static const CpuIsa level = detect();
  return level;
}

bool avx512_vnni_detected() {
#if KILN_CPU_X86
  static const bool vnni = [] {
    if (static_cast<int>(cpu_isa_detected()) < static_cast<int>(CpuIsa::Avx512)) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    __cpuid_count(7, 0, a, b, c, d);
    return ((c >> 11) & 1) != 0;  // CPUID.(7,0):ECX[11] AVX512_VNNI
  }();
  return vnni;
#else
  return false;
#endif
}

CpuIsa cpu_isa() {
  int level = static_cast<int>(cpu_isa_detected());
  if (const int e = env_cap(); e != kNoOverride && e < level) level = e;
  [[maybe_unused]] static const bool onednn_capped = cap_onednn(static_cast<CpuIsa>(level));
  if (const int s = g_scoped_cap.load(std::memory_order_relaxed); s != kNoOverride && s < level)
    level = s;
  return static_cast<CpuIsa>(level);
}

std::string_view cpu_isa_name(CpuIsa level) {
  switch (level) {
    case CpuIsa::Scalar:
      return "scalar";
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Avx512:
      return "avx512";
    case CpuIsa::Avx512Bf16:
      return "avx512bf16";
    case CpuIsa::Amx:
      return "amx";
  }
  return "unknown";
}

CpuIsa parse_cpu_isa(std::string_view name) {
  for (CpuIsa l : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx})
    if (name == cpu_isa_name(l)) return l;
  KILN_CHECK(false,
             "[cpu_isa] unknown ISA level '{}' (expected scalar, avx2, avx512, avx512bf16 "
             "or amx)",
             name);
  return CpuIsa::Scalar;
}

std::string cpu_isa_summary() {
  std::string s(cpu_isa_name(cpu_isa()));
  if (cpu_isa() != cpu_isa_detected()) {
    s += " (detected ";
    s += cpu_isa_name(cpu_isa_detected());
    s += env_cap() != kNoOverride ? "; capped by KILN_CPU_ISA)" : "; capped)";
  }
  return s;
}

ScopedCpuIsa::ScopedCpuIsa(CpuIsa level) : previous_(g_scoped_cap.load()) {
  KILN_CHECK(static_cast<int>(level) <= static_cast<int>(cpu_isa_detected()),
             "[cpu_isa] cannot run at {}: this CPU supports up to {}", cpu_isa_name(level),
             cpu_isa_name(cpu_isa_detected()));
  g_scoped_cap.store(static_cast<int>(level));
}

ScopedCpuIsa::~ScopedCpuIsa() { g_scoped_cap.store(previous_); }

}  // namespace kiln::cpu
