#!/usr/bin/env bash
# The weight / tokenizer / config loaders and the bad-input tests under AddressSanitizer and
# UndefinedBehaviorSanitizer, in a separate CPU-only build (Debug, -O1, frame pointers).
#
#   scripts/asan_check.sh [BUILD_DIR]     (default: ../build-asan next to the repo)
#
# Builds test_models_io and test_models and runs the loader tests (gtest filter below). Any
# sanitizer report aborts the test binary (halt_on_error / -fno-sanitize-recover), so a clean
# exit status means no report. Leak checking is on.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$SRC/../build-asan}"
JOBS="${JOBS:-2}"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S "$SRC" -B "$BUILD" -DKILN_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_EXE_LINKER_FLAGS="$SAN" >/dev/null
cmake --build "$BUILD" --target test_models_io test_models -j"$JOBS"

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMP_NUM_THREADS=1

# Loaders and their bad-input cases: safetensors (single, sharded, malformed), llama2.c .bin,
# HDF5 checkpoints, tokenizers, config.json / generation_config.json, the model-folder loader.
IO_FILTER='Safetensors*:*Llama2c*:*Tokenizer*:*Checkpoint*:*Qwen*'
MODELS_FILTER='WeightsTest.*:GenerateTest.*:GenerationConfig.*:GoldenQwen3.*'

status=0
echo "== test_models_io --gtest_filter=$IO_FILTER"
"$BUILD/tests/test_models_io" --gtest_filter="$IO_FILTER" --gtest_brief=1 || status=1
echo "== test_models --gtest_filter=$MODELS_FILTER"
"$BUILD/tests/test_models" --gtest_filter="$MODELS_FILTER" --gtest_brief=1 || status=1
if [ "$status" -eq 0 ]; then
  echo "asan_check: loaders clean under ASan + UBSan"
else
  echo "asan_check: FAILED (see the reports above)"
fi
exit "$status"
