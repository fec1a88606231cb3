// Runtime ISA detection (kernels/cpu/isa.h) checked against what /proc/cpuinfo says.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "kernels/common/error.h"
#include "kernels/cpu/isa.h"

namespace kiln::cpu {
namespace {

// The flags of the first processor in /proc/cpuinfo (empty when it cannot be read).
std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuIsa, DetectedLevelAgreesWithProcCpuinfo) {
  const auto flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line on this machine";
  const CpuIsa got = cpu_isa_detected();
  const bool avx2 = flags.count("avx2") && flags.count("fma");
  const bool avx512 =
      avx2 && flags.count("avx512f") && flags.count("avx512bw") && flags.count("avx512vl");
  const bool bf16 = avx512 && flags.count("avx512_bf16");
  const bool amx = bf16 && flags.count("amx_tile") && flags.count("amx_bf16");
  // The kernel lists a flag only when it also saves the state, so cpuinfo is a fair reference.
  // AMX may still be refused (arch_prctl), which lands one level lower.
  CpuIsa want = amx      ? CpuIsa::Amx
                : bf16   ? CpuIsa::Avx512Bf16
                : avx512 ? CpuIsa::Avx512
                : avx2   ? CpuIsa::Avx2
                         : CpuIsa::Scalar;
  if (want == CpuIsa::Amx && got == CpuIsa::Avx512Bf16) want = CpuIsa::Avx512Bf16;
  EXPECT_EQ(cpu_isa_name(got), cpu_isa_name(want));
}

TEST(CpuIsa, NamesRoundTripAndUnknownIsRefused) {
  for (CpuIsa l : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx})
    EXPECT_EQ(parse_cpu_isa(cpu_isa_name(l)), l);
  try {
    parse_cpu_isa("sse9");
    FAIL() << "sse9 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown ISA level 'sse9'"), std::string::npos)
        << e.what();
  }
}

TEST(CpuIsa, ScopedCapLowersAndRestores) {
  const CpuIsa before = cpu_isa();
  {
    ScopedCpuIsa cap(CpuIsa::Scalar);
    EXPECT_EQ(cpu_isa(), CpuIsa::Scalar);
    EXPECT_FALSE(cpu_has(CpuIsa::Avx2));
    EXPECT_NE(cpu_isa_summary().find("detected"), std::string::npos) << cpu_isa_summary();
  }
  EXPECT_EQ(cpu_isa(), before);
  if (cpu_isa_detected() != CpuIsa::Amx) {
    EXPECT_THROW(ScopedCpuIsa over(CpuIsa::Amx), Error);
  }
}

}  // namespace
}  // namespace kiln::cpu
