#!/usr/bin/env bash
# Set up, build (build/, all cores) and run the whole test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")"

scripts/setup.sh
scripts/get_data.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

# ctest prints "N% tests passed, M tests failed out of K" at the end; keep its exit status.
ctest --test-dir build --output-on-failure -j2
