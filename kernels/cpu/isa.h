// Runtime CPU ISA levels for the CPU kernels.
//
// Detected once (CPUID plus the OS's XCR0 state, and Linux's AMX tile permission), then read by
// every kernel that has more than one implementation. Levels are ordered: a kernel written for a
// level runs on every higher one.
//
//   Scalar      plain C++ (the compiler may still auto-vectorize to the build's baseline)
//   Avx2        AVX2 + FMA + F16C (every AVX2 CPU shipped has F16C; a VM can still hide it)
//   Avx512      AVX-512 F/BW/VL
//   Avx512Bf16  Avx512 + AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16)
//   Amx         Avx512Bf16 + AMX-TILE/AMX-BF16, with the kernel's XTILEDATA permission granted
//
// KILN_CPU_ISA=scalar|avx2|avx512|avx512bf16|amx caps the level (for checking the fallbacks).
// Asking for a level above what the machine has is an error, not a silent downgrade.
#pragma once

#include <string>
#include <string_view>

// Per-function ISA targets for the kernels' run-time dispatched variants: each level's target
// includes the ones below it, as the levels do. KILN_CPU_X86 says whether they exist at all.
#if defined(__x86_64__) || defined(__i386__)
#define KILN_CPU_X86 1
#define KILN_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KILN_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define KILN_TARGET_AVX512BF16 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")))
#define KILN_TARGET_AVX512VNNI \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define KILN_TARGET_AMX \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
#else
#define KILN_CPU_X86 0
#endif

namespace kiln::cpu {

enum class CpuIsa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3, Amx = 4 };

// The highest level this machine and OS support (AMX counts only if the tile permission was
// granted). Computed once.
CpuIsa cpu_isa_detected();

// Whether the CPU has AVX512-VNNI (vpdpbusd), which is not a level of its own: the int8 kernels
// use it at Avx512Bf16 and above when it is there (kernels/cpu/gemv_quant.h).
bool avx512_vnni_detected();

// The level kernels use: detected, capped by KILN_CPU_ISA, or by a ScopedCpuIsa in tests.
CpuIsa cpu_isa();

inline bool cpu_has(CpuIsa level) { return static_cast<int>(cpu_isa()) >= static_cast<int>(level); }

// "scalar", "avx2", "avx512", "avx512bf16", "amx".
std::string_view cpu_isa_name(CpuIsa level);

// Parses a KILN_CPU_ISA value; throws kiln::Error naming the value and the accepted ones.
CpuIsa parse_cpu_isa(std::string_view name);

// One line for headers and --version: "amx (detected amx; capped by KILN_CPU_ISA)" etc.
std::string cpu_isa_summary();

// Caps the level for the lifetime of the object (tests run each bf16 kernel at every level the
// machine supports). Levels above the detected one are refused. Not thread-safe against kernels
// running concurrently; use it around single-threaded test bodies.
class ScopedCpuIsa {
 public:
  explicit ScopedCpuIsa(CpuIsa level);
  ~ScopedCpuIsa();
  ScopedCpuIsa(const ScopedCpuIsa&) = delete;
  ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;

 private:
  int previous_;
};

}  // namespace kiln::cpu
