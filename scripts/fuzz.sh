#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, one per loader) with clang, ASan and UBSan in build-asan/,
# then runs each for SECONDS (default 30) from its seed corpus (fuzz/corpus/<target>/), and
# prints per target the executions, the coverage (libFuzzer's cov/ft) and any crash. Exits non-zero
# when any target crashed; the crashing input is in build-asan/artifacts/<target>/.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     e.g. scripts/fuzz.sh 600 safetensors hf_config
#
# KILN_FUZZ_JOBS=N runs N targets at once (default 1; each is one process, -jobs is not used).
# New corpus entries go to build-asan/corpus/<target>/, never into the committed seeds.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
shift || true
all=(safetensors safetensors_index hf_config generation_config tokenizer_json vocab_merges
     llama2c_bin llama2c_tokenizer checkpoint_h5 gguf serve_request)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
jobs=${KILN_FUZZ_JOBS:-1}

# The sanitizer job's build (scripts/asan_build.sh: clang 14, ASan + UBSan, libFuzzer's coverage on
# the loaders); after scripts/sanitize.sh only the fuzz targets' own small files are left to build.
fuzz_bins=()
for t in "${targets[@]}"; do fuzz_bins+=("fuzz_$t"); done
# shellcheck source=scripts/asan_build.sh
source scripts/asan_build.sh
asan_build "${fuzz_bins[@]}" || exit 1

# The targets write each input to a file under KILN_FUZZ_SCRATCH (fuzz/fuzz_util.h): tmpfs when
# there is one. The OpenMP pool is not used by the loaders; one thread leaves the cores to others.
shm=/dev/shm
[ -d "$shm" ] && [ -w "$shm" ] || shm=${TMPDIR:-/tmp}
export KILN_FUZZ_SCRATCH="$shm/kiln_fuzz_$$"
trap 'rm -rf "$KILN_FUZZ_SCRATCH"' EXIT
export OMP_NUM_THREADS=1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# allocator_may_return_null: a C malloc() of an absurd size returns NULL, as glibc's does, instead
# of aborting under ASan. HDF5 mallocs sizes read from a corrupt file and reports NULL as an error,
# which kiln turns into "[checkpoint] ..."; C++ new still aborts, so kiln's own runaway requests
# are still crashes (as are any over -malloc_limit_mb). fuzz/lsan.supp: HDF5's error-path leaks.
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}

run_one() {
  local t=$1 dir=build-asan
  rm -rf "$dir/artifacts/$t"
  mkdir -p "$dir/corpus/$t" "$dir/artifacts/$t"
  local log="$dir/fuzz_$t.log" rc=0
  # -timeout: an input that takes 10 s is a hang; -rss_limit_mb/-malloc_limit_mb: a loader that
  # asks for more than 2 GiB on a small input is a bug (memory before validation).
  # checkpoint_h5 forks the checkpoint probe once per input (models/io/checkpoint_probe.h): a crash,
  # out-of-memory or hang of libhdf5 happens in that child and comes back as a kiln::Error, so any
  # crash libFuzzer sees, inside libhdf5 or not, fails the run like every other target's.
  # Its inputs that the probe turned into errors are kept in $dir/probe_caught/ (counted below).
  # A small ASan quarantine keeps the process small, so the probe's fork per input stays cheap.
  local env=()
  if [ "$t" = checkpoint_h5 ]; then
    rm -rf "$dir/probe_caught"
    # fuzz/asan.supp: libhdf5's own silent over-reads (the file says why).
    env=(KILN_FUZZ_PROBE_KEEP="$PWD/$dir/probe_caught"
         ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=16:suppressions=$PWD/fuzz/asan.supp")
  fi
  env "${env[@]}" "$dir/fuzz/fuzz_$t" "$dir/corpus/$t" "fuzz/corpus/$t" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/$t/" >"$log" 2>&1 || rc=$?
  if [ "$t" = checkpoint_h5 ] && [ -d "$dir/probe_caught" ]; then
    echo "fuzz $t: the probe turned $(ls "$dir/probe_caught" | wc -l) distinct inputs into errors" \
      "($(ls "$dir/probe_caught" | cut -d- -f1 | sort | uniq -c | awk '{printf "%s %s ", $1, $2}')): $dir/probe_caught/"
  fi
  local execs cov
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  [ -z "$execs" ] && execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
  cov=$(grep -E '^#[0-9]+' "$log" | grep -oE 'cov: [0-9]+ ft: [0-9]+' | tail -1 || true)
  # A crash that libFuzzer did not stop on is still one: any artifact fails the run.
  if [ "$rc" -eq 0 ] && [ -n "$(ls -A "$dir/artifacts/$t")" ]; then
    echo "fuzz $t: artifacts left in $dir/artifacts/$t: $(ls "$dir/artifacts/$t" | tr '\n' ' ')"
    rc=1
  fi
  if [ "$rc" -eq 0 ]; then
    printf 'fuzz %-18s ok     %ss  execs %-10s %s  corpus %s\n' "$t" "$seconds" "${execs:-?}" \
      "${cov:-?}" "$(ls "$dir/corpus/$t" | wc -l)"
  else
    printf 'fuzz %-18s CRASH  (exit %s) after %s execs; log %s\n' "$t" "$rc" "${execs:-?}" "$log"
    grep -E '^==[0-9]+==ERROR|SUMMARY|runtime error|uncaught|what\(\)|^artifact_prefix|Test unit written' \
      "$log" | head -8 | sed 's/^/    /'
    return 1
  fi
}

failed=0
running=0
for t in "${targets[@]}"; do
  if [ "$jobs" -le 1 ]; then
    run_one "$t" || failed=1
  else
    run_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
      wait -n || failed=1
      running=$((running - 1))
    fi
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
if [ "$failed" -ne 0 ]; then
  echo "fuzz.sh: a target crashed (inputs in build-asan/artifacts/<target>/)"
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets, ${seconds}s each, no crash"
