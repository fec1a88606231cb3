#!/usr/bin/env bash
# Set up, build (build/, all cores) and run the whole test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")"

scripts/setup.sh
scripts/get_data.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

# Keep ctest's exit status, and repeat its summary line ("N% tests passed, M tests failed out of
# K") last, where the failure output cannot bury it.
status=0
ctest --test-dir build --output-on-failure --no-tests=error -j2 2>&1 | tee build/ctest.log || status=$?
echo "test.sh: $(grep -E 'tests passed|No tests were found' build/ctest.log | tail -1)"
exit "$status"
