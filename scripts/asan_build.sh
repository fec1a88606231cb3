#!/usr/bin/env bash
# One build for CI's sanitizer and fuzz jobs (sourced by scripts/sanitize.sh and scripts/fuzz.sh):
# build-asan/, clang 14, AddressSanitizer + UndefinedBehaviorSanitizer on every library, libFuzzer's
# coverage on the loaders (KILN_FUZZ; kiln_fuzz_coverage in the top-level CMakeLists). CUDA as in
# the main build: on when CMake finds nvcc (-UKILN_CUDA drops a cached choice, so the top-level
# default decides), so the CUDA build's host code (kernels/cuda/*.cpp: the copy plans, cuDNN's
# graphs built without a device; the CUDA glue's KILN_CUDA sections) runs under the sanitizers
# too. nvcc compiles the .cu files without them: device code, and launch stubs with no logic. It
# compiles them to PTX only (sm_90 "virtual"): no GPU runs them in CI, a GPU's driver would
# JIT-compile the PTX, and skipping ptxas took the CUDA library's build from 230 s to 153 s on
# 2 cores.
# Both jobs configure it the same way, so the second finds its libraries built: one compile of
# the libraries instead of two (gcc for the tests, clang for the fuzz targets).
#
# -O1 -gline-tables-only: the libraries at a usable speed, with stacks that name the line; asserts
# stay on. The test binaries (test_kernels aside) and kiln itself at -O0
# (KILN_DRIVER_COMPILE_OPTIONS; the top-level CMakeLists.txt has the figures): they are test logic
# and the command line, which compile 2.4x faster at -O0; the libraries, where the tests' time
# goes, stay at -O1.
#
#   asan_build TARGET...   configures build-asan/ and builds the targets (log: build-asan/build.log)

asan_cc=${KILN_FUZZ_CC:-clang-14}
asan_cxx=${KILN_FUZZ_CXX:-clang++-14}

asan_build() {
  command -v "$asan_cxx" >/dev/null ||
    { echo "asan_build: $asan_cxx not found (scripts/setup.sh installs it)" >&2; return 1; }
  mkdir -p build-asan
  : >build-asan/build.log  # this call's log only, so a failure shows its own output
  cmake -S . -B build-asan -DKILN_SANITIZE=ON -DKILN_FUZZ=ON -UKILN_CUDA \
    -DCMAKE_CUDA_ARCHITECTURES=90-virtual -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_COMPILER="$asan_cc" -DCMAKE_CXX_COMPILER="$asan_cxx" \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
    -DCMAKE_C_FLAGS_DEBUG="-O1 -gline-tables-only" \
    -DKILN_DRIVER_COMPILE_OPTIONS=-O0 >>build-asan/build.log 2>&1 ||
    { cat build-asan/build.log; return 1; }
  cmake --build build-asan -j"$(nproc)" --target "$@" >>build-asan/build.log 2>&1 ||
    { tail -50 build-asan/build.log; return 1; }
}
