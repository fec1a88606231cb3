#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR: the GPU check, in stages that each fit one command of a short GPU
# window (10 minutes a command; see docs/gpu_window.md for the commands of a window).
#
#   KILN_GPU_CHECK_STAGES   which stages, in this order (spaces or commas; default "smoke"):
#     smoke       (~1 min) nvidia-smi; ldd of one binary; a probe printing the loaded driver,
#                 runtime, cuBLASLt, cuDNN and NCCL versions and the library files actually
#                 mapped (/proc/self/maps); the CUDA runtime tests; a 2-step
#                 `kiln train --device cuda` and a 4-token `kiln generate --device cuda`.
#     cuda-tests  one process per CUDA suite (found by name in --gtest_list_tests, so a fault in
#                 one suite cannot poison the next), <= 120 s each. CPU-only suites are CI's.
#     sanitizer   compute-sanitizer memcheck with KILN_NO_CACHING=1 (one cudaMalloc per tensor)
#                 on the runtime, allocator and backend-ops tests and on kiln train/generate;
#                 racecheck on two attention tests. The deliberate OOM and guard-overrun tests
#                 are excluded.
#     bench       one configuration of each benchmark, 120 s per run.
#     all         all four (longer than one command: use it only without a time limit).
#   KILN_GPU_CHECK_DEADLINE seconds for the whole command (default 480): no step starts with
#                 fewer than 15 s left, a running step is stopped 10 s before it, and the
#                 results are written either way; the steps not run are listed.
#   KILN_GPU_CHECK_ONLY     a regex on step names: run only those (re-running what failed).
#   KILN_GPU_CHECK_DRY_RUN=1  print the plan of the selected stages and exit 0 (no GPU needed).
#   KILN_BUNDLE             the bundle folder (default build-gpu/bundle, unpacked from
#                 build-gpu/bundle.tar.xz or .tar.gz when absent).
#   KILN_GPU_CHECK_CUDA_HOMES  where to look for CUDA libraries before PyTorch's nvidia-* wheels
#                 (default: $CUDA_HOME $CUDA_PATH /usr/local/cuda /usr/local/cuda-*).
#
# Every step's log, exit status and gtest XML go to a work folder; after every step, OUTDIR gets
# results.json, summary.md and logs.tar.gz (logs and XML only, each log cut to its head and tail,
# the archive under 8 MiB), so whatever kills the command, what ran so far comes back. OUTDIR
# holds at most 8 files: results.json, summary.md, logs.tar.gz, gpu_check.log, nvidia-smi.txt,
# libs.txt, gpu_bench.json, gpu_bench.md.
#
# Skips: on a GPU machine a skipped CUDA test is a failure, unless its message carries
# "[expected-skip]" (a test meant to skip where a GPU is present).
# Data: the tests read $KILN_SHARED_DATA (tests/test_data.h); this script points it at the
# bundle's data.
#
# Exit status: 0 all passed; 1 something failed; 2 no NVIDIA GPU found (results still written);
# 3 no bundle; 4 the deadline stopped the stage before every step ran (and nothing failed);
# 64 bad usage.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: scripts/gpu_check.sh OUTDIR" >&2
  exit 64
fi
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/gpu_check_lib.sh
source "$repo/scripts/gpu_check_lib.sh"
stages=$(gpu_check_stages "${KILN_GPU_CHECK_STAGES:-smoke}") || exit 64
deadline_s=${KILN_GPU_CHECK_DEADLINE:-480}
case "$deadline_s" in '' | *[!0-9]*)
  echo "gpu_check: KILN_GPU_CHECK_DEADLINE must be a number of seconds" >&2
  exit 64
  ;;
esac
t0=$(date +%s)
deadline=$((t0 + deadline_s))
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$repo" || exit 1
bundle=${KILN_BUNDLE:-$repo/build-gpu/bundle}
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln_gpu_check.XXXXXX")
logs=$work/logs
mkdir -p "$logs" "$work/run"
rm -f "$out/results.json" "$out/summary.md" "$out/logs.tar.gz" "$out/libs.txt" \
  "$out/gpu_bench.json" "$out/gpu_bench.md" "$out/nvidia-smi.txt"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
gpu_found=0
status=running

say() { echo "gpu_check: $*"; }
note() {
  say "$*"
  echo "$*" >>"$work/notes.txt"
}

# results.json, summary.md and logs.tar.gz in OUTDIR from what the work folder holds now.
write_results() {
  local st=${1:-$status}
  if command -v python3 >/dev/null; then
    python3 "$repo/scripts/gpu_check_results.py" --work "$work" --out "$out" --status "$st" \
      --started "$started" --seconds $(($(date +%s) - t0)) --gpu-found "$gpu_found" \
      --stages "$stages" --commit "$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" ||
      echo "gpu_check: writing the results failed" >&2
  else
    printf '{"schema": 2, "status": "%s", "gpu_found": %s, "notes": ["python3 not found"]}\n' \
      "$st" "$([ "$gpu_found" = 1 ] && echo true || echo false)" >"$out/results.json"
    echo "# kiln gpu_check: $st (python3 missing; see gpu_check.log)" >"$out/summary.md"
    tar -C "$work" -czf "$out/logs.tar.gz" logs notes.txt 2>/dev/null
  fi
}

finish() {
  local st=$1 code=$2
  status=$st
  write_results "$st"
  say "status $st after $(($(date +%s) - t0)) s; results in $out/results.json and $out/summary.md"
  [ -f "$out/summary.md" ] && cat "$out/summary.md"
  rm -rf "$work"
  exit "$code"
}

# The window's kill (SIGTERM, or INT) still leaves results: the step in flight is recorded as
# killed. (SIGKILL cannot be caught: the results of the steps before it are in OUTDIR already.)
on_signal() {
  note "stopped by a signal during ${current_step:-setup}"
  [ -n "${current_step:-}" ] && echo "143 $(($(date +%s) - step_t0)) killed" >"$logs/$current_step.rc"
  finish interrupted 1
}

main() {
  trap on_signal TERM INT  # here: main runs in the pipeline's subshell, which resets traps
  touch "$work/notes.txt"
  say "stages: $stages; deadline ${deadline_s} s"

  # ---- the bundle ---------------------------------------------------------------------------
  if [ ! -d "$bundle" ] && [ -f "$bundle.tar.xz" ]; then
    say "unpacking $bundle.tar.xz"
    # tar -J needs the xz program; Python's lzma module does without it.
    tar -C "$(dirname "$bundle")" -xJf "$bundle.tar.xz" 2>/dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
        "$bundle.tar.xz" "$(dirname "$bundle")" || note "could not unpack $bundle.tar.xz"
  elif [ ! -d "$bundle" ] && [ -f "$bundle.tar.gz" ]; then
    say "unpacking $bundle.tar.gz"
    tar -C "$(dirname "$bundle")" -xzf "$bundle.tar.gz" || note "could not unpack $bundle.tar.gz"
  fi
  if [ ! -f "$bundle/manifest.env" ]; then
    note "no bundle at $bundle: run scripts/bundle_gpu.sh on a build machine and carry build-gpu/bundle.tar.xz"
    finish no_bundle 3
  fi
  cp "$bundle/manifest.env" "$work/manifest.env"
  # shellcheck disable=SC1091
  source "$bundle/manifest.env"
  bundle_exes=$KILN_BUNDLE_EXES
  say "bundle: commit ${KILN_BUNDLE_COMMIT:0:12} built $KILN_BUNDLE_DATE"
  here=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
  [ "$here" = "$KILN_BUNDLE_COMMIT" ] || [ "$here" = unknown ] ||
    note "checkout is at ${here:0:12} but the bundle was built from ${KILN_BUNDLE_COMMIT:0:12}"

  # ---- CUDA libraries: LD_LIBRARY_PATH decides (the binaries' RPATH is $ORIGIN/../lib only) ----
  find_cuda_libs
  {
    echo "# LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "# ldd tests/test_kernels"
    ldd "$bundle/tests/test_kernels" 2>&1
    echo "# readelf -d tests/test_kernels (RPATH/RUNPATH)"
    readelf -d "$bundle/tests/test_kernels" 2>/dev/null | grep -E 'RPATH|RUNPATH'
    # Which copies load, and their versions, even when there is no GPU (the probe needs none).
    echo "# probe before the GPU check (tests/test_kernels --gtest_filter=CudaProbe.*)"
    (cd "$bundle/tests" && timeout 30 ./test_kernels --gtest_filter='CudaProbe.*') 2>&1 | grep '^probe:'
  } >"$out/libs.txt" 2>&1

  # ---- the GPU --------------------------------------------------------------------------------
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi >"$out/nvidia-smi.txt" 2>&1
    if nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
      >"$work/gpus.csv" 2>/dev/null && [ -s "$work/gpus.csv" ]; then
      gpu_found=1
      say "GPU: $(head -1 "$work/gpus.csv")"
    fi
  else
    echo "nvidia-smi not found" >"$out/nvidia-smi.txt"
  fi
  if [ "$gpu_found" = 0 ]; then
    note "no NVIDIA GPU found (see nvidia-smi.txt): nothing run; exit status 2"
    finish no_gpu 2
  fi

  # ---- paths the tests read --------------------------------------------------------------------
  # The tests find their scripts and binaries through KILN_SOURCE_DIR / KILN_BINARY_DIR, compiled
  # in as the build machine's paths: where those do not exist here, link them to this checkout
  # and the bundle.
  local src=$KILN_BUNDLE_SOURCE_DIR bin=$KILN_BUNDLE_BINARY_DIR d
  if [ "$(realpath -m "$src")" != "$repo" ]; then
    if [ ! -e "$src" ] && mkdir -p "$(dirname "$src")" 2>/dev/null && ln -s "$repo" "$src"; then
      say "linked the compiled source path $src -> $repo"
    else
      note "compiled source path $src is not this checkout ($repo) and could not be linked"
    fi
  fi
  for d in tests apps bench examples; do
    if [ -d "$bundle/$d" ] && [ ! -e "$bin/$d" ]; then
      mkdir -p "$bin" && ln -s "$bundle/$d" "$bin/$d" && say "linked $bin/$d -> $bundle/$d"
    fi
  done
  export KILN_SOURCE_DIR="$repo" KILN_BINARY_DIR="$bin"
  export KILN_SHARED_DATA="$bundle/data"
  [ -e "$repo/data" ] || KILN_SHARED_DATA="$bundle/data" "$repo/scripts/get_data.sh" >/dev/null 2>&1 ||
    note "scripts/get_data.sh from the bundle's data failed"
  if [ -z "${KILN_PYTHON:-}" ] && command -v python3 >/dev/null; then
    KILN_PYTHON="$(command -v python3)"
    export KILN_PYTHON
  fi
  # Small inputs for kiln train / generate.
  for _ in $(seq 1 200); do echo "to be or not to be, that is the question."; done >"$work/run/t.txt"
  cat >"$work/run/config.json" <<'JSON'
{"model_type": "qwen3", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "max_position_embeddings": 64, "tie_word_embeddings": false}
JSON
  run_stages
}

# Finds the sonames the binaries need and the loader cannot: in the CUDA toolkit, else in
# PyTorch's nvidia-* wheels (site-packages/nvidia/*/lib), and puts their folders first on
# LD_LIBRARY_PATH, recorded in $work/libdirs.
find_cuda_libs() {
  local rel so d sp hit found added
  local -a candidate_dirs=() site_dirs=()
  missing_sonames() {
    for rel in $bundle_exes; do ldd "$bundle/$rel" 2>/dev/null | awk '/not found/ {print $1}'; done | sort -u
  }
  # shellcheck disable=SC2086
  for d in ${KILN_GPU_CHECK_CUDA_HOMES-${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-*}; do
    [ -n "$d" ] && for sub in lib64 lib targets/x86_64-linux/lib; do
      [ -d "$d/$sub" ] && candidate_dirs+=("$d/$sub")
    done
  done
  if command -v python3 >/dev/null; then
    while IFS= read -r d; do [ -d "$d" ] && site_dirs+=("$d"); done < <(python3 -c \
      'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null | sort -u)
  fi
  local base=${LD_LIBRARY_PATH:-} dirs=""
  for _pass in 1 2 3; do  # ldd cannot see the needs of a library it did not find
    added=0
    for so in $(missing_sonames); do
      found=""
      for d in "${candidate_dirs[@]+"${candidate_dirs[@]}"}"; do
        [ -e "$d/$so" ] && { found=$d; break; }
      done
      if [ -z "$found" ]; then
        for sp in "${site_dirs[@]+"${site_dirs[@]}"}"; do
          hit=$(find "$sp/nvidia" "$sp/torch/lib" -maxdepth 3 -name "$so" 2>/dev/null | head -1)
          [ -n "$hit" ] && { found=$(dirname "$hit"); break; }
        done
      fi
      if [ -n "$found" ]; then
        case ":$dirs:" in *":$found:"*) ;; *) dirs="${dirs:+$dirs:}$found" added=1 ;; esac
        say "$so: $found"
      fi
    done
    [ -z "$dirs" ] || export LD_LIBRARY_PATH="$dirs${base:+:$base}"
    [ "$added" = 1 ] || break
  done
  echo "$dirs" >"$work/libdirs"
  local missing
  missing=$(missing_sonames | tr '\n' ' ')
  echo "$missing" >"$work/missing_libs"
  [ -z "${missing// /}" ] || note "libraries not found anywhere: $missing"
}

# Runs one planned step (see gpu_check_lib.sh) within the deadline, then refreshes the results.
run_step() {
  local name=$1 kind=$2 limit=$3 dir=$4 envs=$5 cmd=$6
  local now t w
  now=$(date +%s)
  t=$(gpu_check_step_limit "$limit" "$now" "$deadline")
  if [ "$t" = 0 ]; then
    echo "$name" >>"$work/not_run"
    return 1
  fi
  local -a argv=()
  for w in $cmd; do
    case "$w" in
      @kiln) argv+=("$bundle/apps/kiln") ;;
      %memcheck | %racecheck)
        argv+=("$sanitizer_bin" --tool "${w#%}" --error-exitcode 99 --print-limit 20) ;;
      ^*) argv+=("$repo/${w#^}") ;;
      =work/*) mkdir -p "$work/${w#=work/}" && argv+=("$work/${w#=work/}") ;;
      =bundle/*) argv+=("$bundle/${w#=bundle/}") ;;
      *) argv+=("$w") ;;
    esac
  done
  [ "$kind" = gtest ] && argv+=("--gtest_output=xml:$logs/$name.xml")
  local rundir=$work/run
  [ "$dir" = run ] || rundir=$bundle/$dir
  say "$name (limit ${t} s)"
  current_step=$name
  step_t0=$now
  # shellcheck disable=SC2086  # envs is a list of VAR=value words
  (cd "$rundir" && env $envs timeout -k 5 "$t" "${argv[@]}") >"$logs/$name.log" 2>&1
  local rc=$? secs=$(($(date +%s) - now))
  current_step=""
  # A step stopped at its own limit timed out (a failure); one the deadline cut short did not
  # finish (the stage is incomplete, not failed).
  local how=done
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    how=timeout
    [ "$t" -lt "$limit" ] && how=deadline && echo "$name" >>"$work/not_run"
  fi
  echo "$rc $secs $how $kind $t" >"$logs/$name.rc"
  [ "$rc" = 0 ] || say "$name: exit status $rc after $secs s ($how)"
  write_results running
  return 0
}

# suites_<binary>: the CUDA suites of each test binary of the bundle (gpu_check_cuda_suites).
list_cuda_suites() {
  local rel bin
  for rel in $bundle_exes; do
    case "$rel" in tests/test_*) ;; *) continue ;; esac
    bin=${rel#tests/}
    printf -v "suites_$bin" '%s' "$(cd "$bundle/tests" 2>/dev/null && timeout 60 "./$bin" --gtest_list_tests 2>/dev/null |
      gpu_check_cuda_suites)"
  done
}

run_stages() {
  local stage name kind limit dir envs cmd
  sanitizer_bin=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for stage in $stages; do
    [ "$stage" = cuda-tests ] && list_cuda_suites
    if [ "$stage" = sanitizer ] && [ ! -x "$sanitizer_bin" ]; then
      note "compute-sanitizer not found (PATH, /usr/local/cuda/bin): the sanitizer stage did not run"
      echo "compute-sanitizer-missing" >>"$work/failed_setup"
      continue
    fi
    say "---- stage $stage"
    while IFS='|' read -r name kind limit dir envs cmd; do
      [ -n "$name" ] || continue
      if [ -n "${KILN_GPU_CHECK_ONLY:-}" ] && ! [[ "$name" =~ $KILN_GPU_CHECK_ONLY ]]; then continue; fi
      run_step "$name" "$kind" "$limit" "$dir" "$envs" "$cmd"
    done < <(gpu_check_plan "$stage")
    if [ "$stage" = smoke ] && [ -f "$logs/smoke_probe.log" ]; then
      { echo "# probe (tests/test_kernels --gtest_filter=CudaProbe.*)"; grep '^probe:' "$logs/smoke_probe.log"; } >>"$out/libs.txt"
    fi
    if [ "$stage" = bench ]; then
      for f in "$work"/bench_gpu/gpu_*.json; do [ -e "$f" ] && cp "$f" "$out/gpu_bench.json"; done
      for f in "$work"/bench_gpu/gpu_*.md; do [ -e "$f" ] && cp "$f" "$out/gpu_bench.md"; done
    fi
  done
  if [ -s "$work/not_run" ]; then
    note "the deadline (${deadline_s} s) stopped the run before: $(tr '\n' ' ' <"$work/not_run")"
  fi
  local verdict
  verdict=$(python3 "$repo/scripts/gpu_check_results.py" --work "$work" --verdict 2>/dev/null || echo failed)
  [ -s "$work/failed_setup" ] && verdict=failed
  case "$verdict" in
    ok) finish ok 0 ;;
    incomplete) finish incomplete 4 ;;
    *) finish failed 1 ;;
  esac
}

if [ "${KILN_GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
  # The plan only: the bundle's executable list when there is one, else the usual three.
  bundle_exes="tests/test_kernels tests/test_tensor apps/kiln"
  [ -f "$bundle/manifest.env" ] && bundle_exes=$(sed -n "s/^KILN_BUNDLE_EXES='\(.*\)'$/\1/p" "$bundle/manifest.env")
  case " $stages " in *" cuda-tests "*) list_cuda_suites ;; esac
  for stage in $stages; do gpu_check_plan "$stage"; done
  rm -rf "$work"
  exit 0
fi

# Everything goes to the terminal and to OUTDIR/gpu_check.log; the status is main's.
main 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
