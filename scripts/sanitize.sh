#!/usr/bin/env bash
# CI's sanitizer job: an AddressSanitizer + UndefinedBehaviorSanitizer build (clang 14, in
# build-asan/, which scripts/fuzz.sh shares: scripts/asan_build.sh) of every test binary (kernels,
# tensor, autograd, nn, models/io, models, serve with its live loopback server, apps with the kiln
# binary it runs, and dist as a world of one: the multi-rank runs need mpirun, which the
# sanitizers do not cover), and a run of each. Any sanitizer report fails its test binary, and
# this script with it. Where nvcc is installed the build has CUDA, as the main build does, so the
# CUDA build's host code runs sanitized too: the tests that need no GPU (CudaBasicPlan's copy
# plans, CudnnAttentionHost's deviceless cuDNN graphs, CudaErrors, CudaDevices) run, and the GPU
# tests skip with their message.
#
#   scripts/sanitize.sh            (docs/fuzzing.md)
set -euo pipefail
cd "$(dirname "$0")/.."

tests=(test_kernels test_tensor test_autograd test_nn test_models_io test_models test_serve test_apps test_dist)
# test_dist without mpirun runs the world-of-one tests only (as ctest's dist.world_of_one does).
declare -A filter=([test_dist]="--gtest_filter=Dist.*:DataParallel.OneStep*")
# shellcheck source=scripts/asan_build.sh
source scripts/asan_build.sh
asan_build "${tests[@]}" kiln || exit 1
cuda=$(sed -n 's/^KILN_CUDA:BOOL=//p' build-asan/CMakeCache.txt)
if [ "$cuda" = ON ]; then
  echo "sanitize: CUDA on: the CUDA build's host code is sanitized too (GPU tests skip here)"
else
  echo "sanitize: CUDA off (no nvcc found): only the CPU build's code is sanitized"
fi

# halt_on_error / abort_on_error: the first report ends the binary with a non-zero status.
# allocator_may_return_null: a huge malloc returns null as glibc's does (kiln and libhdf5 handle
# that: CheckpointProbeCli.HugeHdf5AllocationRefusedInTheChild expects HDF5's "memory allocation
# failed"), instead of ASan reporting it as an error.
# detect_leaks stays on and needs no suppressions: LLVM's libomp (which also serves OpenMP
# OpenBLAS's libgomp calls) reports no leaks with 2 threads (checked; docs/fuzzing.md). Two
# threads run the kernels' parallel paths.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

failed=()
for t in "${tests[@]}"; do
  start=$(date +%s)
  # shellcheck disable=SC2086  # the filter is one word or none
  if build-asan/tests/"$t" --gtest_brief=1 ${filter[$t]:-} >"build-asan/$t.log" 2>&1; then
    echo "sanitize: $t clean ($(grep -oE '[0-9]+ tests? from [0-9]+ test suites? ran' "build-asan/$t.log" | tail -1), $(($(date +%s) - start)) s)"
  else
    echo "sanitize: $t FAILED; build-asan/$t.log:"
    grep -E '^==[0-9]+==ERROR|SUMMARY|runtime error|\[  FAILED  \]' "build-asan/$t.log" | head -20 | sed 's/^/    /'
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "sanitize: ${failed[*]} failed"
  exit 1
fi
echo "sanitize: ${#tests[@]} test binaries clean under ASan + UBSan"
