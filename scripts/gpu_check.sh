#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR: the GPU check, in stages that each fit one command of a short GPU
# window (10 minutes a command; see docs/gpu_window.md for the commands of a window).
#
#   KILN_GPU_CHECK_STAGES   which stages, in this order (spaces or commas; default "smoke"):
#     smoke       (~5 s) nvidia-smi; ldd of one binary; a probe printing the loaded driver,
#                 runtime, cuBLASLt, cuDNN and NCCL versions and the library files actually
#                 mapped (/proc/self/maps); the CUDA runtime tests; a 2-step
#                 `kiln train --device cuda` and a 4-token `kiln generate --device cuda`.
#     cuda-tests  one process per CUDA suite (found by name in --gtest_list_tests, so a fault in
#                 one suite cannot poison the next), <= 120 s each. CPU-only suites are CI's.
#     sanitizer   compute-sanitizer memcheck with KILN_NO_CACHING=1 (one cudaMalloc per tensor)
#                 on the runtime, allocator and backend-ops tests and on kiln train/generate;
#                 racecheck on two attention tests. The deliberate OOM and guard-overrun tests
#                 are excluded.
#     bench       the GPU benchmarks against PyTorch, bench/run_gpu_bench.sh (training steps of
#                 stories15M:256:64 and stories42M:1024:16, attention at T 1024 and 4096), <= 300 s.
#     decode      Qwen3-8B bf16 decode (64 prompt ids, 128 new tokens, greedy) from a random
#                 16.4 GB folder with the real config: `kiln generate --device cuda`, then HF
#                 transformers' static-cache decode of the same folder and PyTorch's
#                 device-to-device copy rate (bench/hf_decode_peer.py); decode_8b.json. The folder
#                 is written in the background from the moment the GPU is found (paused during
#                 timing steps) to KILN_GPU_CHECK_DECODE_DIR (/tmp/kiln_gpu_check_qwen3_8b_bf16;
#                 a complete one from an earlier call is reused).
#     memcheck-apps  the sanitizer stage's memcheck of kiln train and kiln generate alone.
#     window      the one-command window: smoke cuda-tests bench decode memcheck-apps, most
#                 important first (docs/gpu_window.md).
#     all         smoke cuda-tests sanitizer bench decode (longer than one command: use it only
#                 without a time limit).
#   Timing steps (bench, decode_kiln, decode_hf) run with CUDA_LAUNCH_BLOCKING=0, whatever the
#   environment; every other step with CUDA_LAUNCH_BLOCKING=1. results.json records each step's
#   environment (steps.NAME.env).
#   KILN_GPU_CHECK_DEADLINE seconds for the whole command (default 480): no step starts with
#                 fewer than 15 s left, a running step is stopped 10 s before it, and the
#                 results are written either way; the steps not run are listed.
#   KILN_GPU_CHECK_ONLY     a regex on step names: run only those (re-running what failed).
#   KILN_GPU_CHECK_DRY_RUN=1  print the plan of the selected stages and exit 0 (no GPU needed).
#   KILN_BUNDLE             the bundle folder (default build-gpu/bundle, unpacked from
#                 build-gpu/bundle.tar.xz or .tar.gz when absent).
#   KILN_GPU_CHECK_CUDA_HOMES  where to look for CUDA libraries before PyTorch's nvidia-* wheels
#                 (default: $CUDA_HOME $CUDA_PATH /usr/local/cuda /usr/local/cuda-*).
#   KILN_GPU_CHECK_DECODE_DIR, KILN_GPU_CHECK_DECODE_MIN_GB (free space needed, 18),
#   KILN_GPU_CHECK_WRITE_WAIT (seconds the decode stage waits for the folder, 180).
#
# Every step's log, exit status, environment and gtest XML go to a work folder; after every step,
# OUTDIR gets results.json, summary.md and logs.tar.gz (logs and XML only, each log cut to its
# head and tail, the archive under 8 MiB; nvidia-smi.txt and libs.txt are in it too, and the
# probe's version lines in summary.md), so whatever kills the command, what ran so far comes
# back. OUTDIR holds at most 7 files: results.json, summary.md, logs.tar.gz, gpu_check.log, and
# from bench gpu_bench.json and gpu_bench.md, from decode decode_8b.json.
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
  "$out/gpu_bench.json" "$out/gpu_bench.md" "$out/nvidia-smi.txt" "$out/decode_8b.json"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
gpu_found=0
status=running
bg_pid="" bg_paused_at="" bg_paused_s=0
decode_dir=${KILN_GPU_CHECK_DECODE_DIR:-/tmp/kiln_gpu_check_qwen3_8b_bf16}
decode_ok=0 decode_fail_how=fail decode_stamp=""

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
    tar -C "$work" -czf "$out/logs.tar.gz" logs notes.txt nvidia-smi.txt libs.txt 2>/dev/null
  fi
}

finish() {
  local st=$1 code=$2
  status=$st
  stop_background
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

# detect_gpu: nvidia-smi.txt and gpus.csv in the work folder; gpu_found=1 when a GPU answers.
detect_gpu() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi >"$work/nvidia-smi.txt" 2>&1
    if nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
      >"$work/gpus.csv" 2>/dev/null && [ -s "$work/gpus.csv" ]; then
      gpu_found=1
      say "GPU: $(head -1 "$work/gpus.csv")"
    fi
  else
    echo "nvidia-smi not found" >"$work/nvidia-smi.txt"
  fi
}
finish_no_gpu() {
  note "no NVIDIA GPU found (see nvidia-smi.txt in logs.tar.gz): nothing run; exit status 2"
  finish no_gpu 2
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
    detect_gpu
    [ "$gpu_found" = 1 ] || finish_no_gpu
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
  } >"$work/libs.txt" 2>&1

  # ---- the GPU --------------------------------------------------------------------------------
  detect_gpu
  [ "$gpu_found" = 1 ] || finish_no_gpu

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
  # The same with Qwen's vocabulary, for a folder of random weights (its generation_config.json
  # names Qwen's eos id): smoke_generate_folder loads it the way a real model loads.
  sed 's/"vocab_size": 300/"vocab_size": 151936/' "$work/run/config.json" >"$work/run/config_qwen_vocab.json"
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

# resolve_argv CMD: the words of a planned command, with the paths put in (argv).
resolve_argv() {
  local - w
  set -f  # words like --gtest_filter=*BackendOpsCuda* are not globs
  argv=()
  for w in $1; do
    case "$w" in
      @kiln) argv+=("$bundle/apps/kiln") ;;
      %memcheck | %racecheck)
        argv+=("$sanitizer_bin" --tool "${w#%}" --error-exitcode 99 --print-limit 20) ;;
      %python) argv+=("${KILN_PYTHON:-python3}") ;;
      %serve_check) argv+=("${KILN_GPU_SERVE_CHECK:-$repo/scripts/gpu_serve_check.sh}") ;;
      %ncu)  # Nsight Compute: on PATH, in the toolkit, or where the image installs it
        argv+=("$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
          2>/dev/null | head -1 || echo ncu)") ;;
      %decode_dir) argv+=("$decode_dir") ;;
      %decode_q8_0) argv+=("${decode_dir}_q8_0.gguf") ;;  # decode_quantize's output
      %decode_q4_k_m) argv+=("${decode_dir}_q4_k_m.gguf") ;;  # decode_quantize_q4_k_m's output
      ^*) argv+=("$repo/${w#^}") ;;
      =work/*) mkdir -p "$work/${w#=work/}" && argv+=("$work/${w#=work/}") ;;
      =bundle/*) argv+=("$bundle/${w#=bundle/}") ;;
      *) argv+=("$w") ;;
    esac
  done
}

# logs/NAME.env: the step's own VAR=value words, then the CUDA_LAUNCH_BLOCKING it ran with.
write_step_env() {
  local - w
  set -f
  { for w in $2; do echo "$w"; done
    echo "CUDA_LAUNCH_BLOCKING=$(gpu_check_launch_blocking "$2")"; } >"$logs/$1.env"
}

# record_unrun NAME KIND MESSAGE: a step that was not started, recorded as failed.
record_unrun() {
  echo "$3" >"$logs/$1.log"
  echo "1 0 done $2 0" >"$logs/$1.rc"
  say "$1: $3"
  write_results running
}

# step_time NAME LIMIT: sets t, the seconds NAME may run (its LIMIT, cut by the deadline); fails,
# with NAME listed as not run, when the deadline leaves too little to start it.
step_time() {
  t=$(gpu_check_step_limit "$2" "$(date +%s)" "$deadline")
  [ "$t" != 0 ] && return 0
  echo "$1" >>"$work/not_run"
  return 1
}

# step_command NAME DIR ENVS CMD: sets argv and rundir of a planned step, records its environment.
step_command() {
  resolve_argv "$4"
  rundir=$work/run
  [ "$2" = run ] || rundir=$bundle/$2
  write_step_env "$1" "$3"
}

# end_how RC T LIMIT: how a process run under `timeout T` (planned LIMIT) ended: done; timeout
# (stopped at its own limit: a failure); deadline (the deadline had cut its limit: not finished,
# the run is incomplete, not failed).
end_how() {
  if [ "$1" = 124 ] || [ "$1" = 137 ]; then
    if [ "$2" -lt "$3" ]; then echo deadline; else echo timeout; fi
  else
    echo "done"
  fi
}

# Runs one planned step (see gpu_check_lib.sh) within the deadline, then refreshes the results.
# A timing step (KIND bench) runs only without synchronous launches, and with the background
# step (the random folder's writer) paused.
run_step() {
  local name=$1 kind=$2 limit=$3 dir=$4 envs=$5 cmd=$6
  local now t clb rundir
  now=$(date +%s)
  step_time "$name" "$limit" || return 1
  clb=$(gpu_check_launch_blocking "$envs")
  if [ "$kind" = bench ] && ! gpu_check_timing_env_ok "$clb"; then
    write_step_env "$name" "$envs"
    record_unrun "$name" "$kind" "refused: a timing step with CUDA_LAUNCH_BLOCKING=$clb (timings never run with synchronous launches)"
    return 0
  fi
  step_command "$name" "$dir" "$envs" "$cmd"
  [ "$kind" = gtest ] && argv+=("--gtest_output=xml:$logs/$name.xml")
  [ "$kind" = bench ] && pause_background "$name"
  say "$name (limit ${t} s)"
  current_step=$name
  step_t0=$now
  # shellcheck disable=SC2086  # envs is a list of VAR=value words
  (cd "$rundir" && env $envs timeout -k 5 "$t" "${argv[@]}") </dev/null >"$logs/$name.log" 2>&1
  local rc=$? secs=$(($(date +%s) - now))
  current_step=""
  [ "$kind" = bench ] && resume_background
  local how
  how=$(end_how "$rc" "$t" "$limit")
  [ "$how" = deadline ] && echo "$name" >>"$work/not_run"
  echo "$rc $secs $how $kind $t" >"$logs/$name.rc"
  [ "$rc" = 0 ] || say "$name: exit status $rc after $secs s ($how)"
  write_results running
  return 0
}

# ---- the background step: the decode stage's random folder, written while the GPU works -------
# start_background NAME KIND LIMIT DIR ENV CMD: starts a plan line in the background. timeout
# makes itself a process-group leader, so the group -bg_pid is the writer and its timeout.
start_background() {
  local name=$1 limit=$3 dir=$4 envs=$5 cmd=$6 now t rundir
  now=$(date +%s)
  step_time "$name" "$limit" || return 1
  step_command "$name" "$dir" "$envs" "$cmd"
  say "$name: started in the background (limit $t s)"
  # shellcheck disable=SC2086  # envs is a list of VAR=value words
  (cd "$rundir" && exec env $envs timeout -k 5 "$t" "${argv[@]}") </dev/null >"$logs/$name.log" 2>&1 &
  bg_pid=$! bg_name=$name bg_t0=$now bg_limit=$t bg_plan_limit=$limit
  sleep 1  # timeout's setpgid, before anyone signals the group
}

# pause_background STEP / resume_background: SIGSTOP/SIGCONT of the background step around a
# timing step (the time it was paused goes to the results).
pause_background() {
  { [ -n "$bg_pid" ] && [ -z "$bg_paused_at" ] && kill -0 "$bg_pid" 2>/dev/null; } || return 0
  if kill -STOP -- "-$bg_pid" 2>/dev/null; then
    bg_paused_at=$(date +%s)
    say "$bg_name: paused during $1"
  fi
}
resume_background() {
  [ -n "$bg_paused_at" ] || return 0
  kill -CONT -- "-$bg_pid" 2>/dev/null
  bg_paused_s=$((bg_paused_s + $(date +%s) - bg_paused_at))
  bg_paused_at=""
  echo "paused_s=$bg_paused_s" >>"$work/decode.txt"
}

# kill_background: TERM (then KILL) to the background step's process group, running or paused.
kill_background() {
  kill -TERM -- "-$bg_pid" 2>/dev/null
  kill -CONT -- "-$bg_pid" 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$bg_pid" 2>/dev/null || return 0; sleep 1; done
  kill -KILL -- "-$bg_pid" 2>/dev/null
}

# join_background CAP HOW: waits at most CAP seconds for the background step (then stops it and
# records HOW: timeout, or deadline where the deadline shortened the wait); records its result.
# Succeeds when it exited 0.
join_background() {
  [ -n "$bg_pid" ] || return 1
  local cap=$1 cut_how=$2 end rc secs how="done"
  end=$(($(date +%s) + cap))
  resume_background
  kill -0 "$bg_pid" 2>/dev/null && say "waiting for $bg_name (at most $cap s)"
  while kill -0 "$bg_pid" 2>/dev/null && [ "$(date +%s)" -lt "$end" ]; do sleep 1; done
  if kill -0 "$bg_pid" 2>/dev/null; then
    kill_background
    how=$cut_how
  fi
  wait "$bg_pid"
  rc=$?
  secs=$(($(date +%s) - bg_t0))
  [ "$how" = "done" ] && how=$(end_how "$rc" "$bg_limit" "$bg_plan_limit")
  [ "$how" = deadline ] && echo "$bg_name" >>"$work/not_run"
  echo "$rc $secs $how cmd $bg_limit" >"$logs/$bg_name.rc"
  [ "$rc" = 0 ] || say "$bg_name: exit status $rc after $secs s ($how)"
  bg_pid=""
  [ "$rc" = 0 ] && [ "$how" = "done" ]
}

# stop_background: at the end of the run, a background step still running is stopped and listed
# as not run (killed when a signal ended the run).
stop_background() {
  [ -n "${bg_pid:-}" ] || return 0
  if kill -0 "$bg_pid" 2>/dev/null; then
    say "stopping $bg_name"
    kill_background
    local how=deadline
    [ "$status" = interrupted ] && how=killed
    echo "143 $(($(date +%s) - bg_t0)) $how cmd $bg_limit" >"$logs/$bg_name.rc"
    [ "$how" = deadline ] && echo "$bg_name" >>"$work/not_run"
  fi
  wait "$bg_pid" 2>/dev/null
  bg_pid=""
}

# prepare_decode_dir: 0 when $decode_dir is to be written (decode_stamp set), 0 with decode_ok=1
# when a complete folder from an earlier call is there, 1 (with a note) when it cannot be.
prepare_decode_dir() {
  local cfg=$bundle/data/qwen/Qwen3-8B/config.json parent avail min_gb=${KILN_GPU_CHECK_DECODE_MIN_GB:-18}
  if [ ! -f "$cfg" ]; then
    note "decode: no Qwen3-8B config at $cfg (scripts/get_data.sh lays it out)"
    return 1
  fi
  decode_stamp="$(sha256sum "$cfg" | cut -d' ' -f1) bf16 seed 0"
  echo "dir=$decode_dir" >>"$work/decode.txt"
  if [ -f "$decode_dir/.kiln_gpu_check_complete" ] &&
    [ "$(cat "$decode_dir/.kiln_gpu_check_complete")" = "$decode_stamp" ]; then
    decode_ok=1
    echo "reused=1" >>"$work/decode.txt"
    return 0
  fi
  if [ -e "$decode_dir" ]; then
    if [ ! -d "$decode_dir" ] || find "$decode_dir" -mindepth 1 -maxdepth 1 ! -name config.json \
      ! -name generation_config.json ! -name 'model*.safetensors*' ! -name .kiln_gpu_check_complete |
      grep -q .; then
      note "decode: $decode_dir exists and is not a random folder of an earlier call: left alone, not written"
      return 1
    fi
    rm -rf "$decode_dir"  # an unfinished folder of an earlier call
  fi
  parent=$(dirname "$decode_dir")
  mkdir -p "$parent" || { note "decode: cannot create $parent"; return 1; }
  avail=$(df -P -k "$parent" | awk 'NR == 2 {print int($4 / 1000000)}')
  if [ "${avail:-0}" -lt "$min_gb" ]; then
    note "decode: ${avail:-?} GB free under $parent, the 16.4 GB folder needs $min_gb: not written"
    return 1
  fi
  return 0
}

# start_decode_folder: before the first stage, when decode is one: the random folder's writer
# (the decode plan's background line) starts, unless an earlier call's folder is there.
start_decode_folder() {
  local name kind limit dir envs cmd need=1
  if [ -n "${KILN_GPU_CHECK_ONLY:-}" ]; then  # only when a decode step is selected
    need=0
    while IFS='|' read -r name _; do
      [ "$name" != decode_write ] && [[ "$name" =~ $KILN_GPU_CHECK_ONLY ]] && need=1
    done < <(gpu_check_plan decode)
  fi
  [ "$need" = 1 ] || return 0
  decode_fail_how=fail
  if ! prepare_decode_dir; then
    record_unrun decode_write cmd "the random Qwen3-8B folder was not written (see the notes)"
    return 0
  fi
  if [ "$decode_ok" = 1 ]; then
    echo "reusing $decode_dir (complete, written by an earlier call for the same config)" >"$logs/decode_write.log"
    echo "0 0 done cmd 0" >"$logs/decode_write.rc"
    say "decode_write: reusing $decode_dir"
    return 0
  fi
  IFS='|' read -r name kind limit dir envs cmd < <(gpu_check_plan decode | grep '^decode_write|')
  start_background "$name" "$kind" "$limit" "$dir" "$envs" "$cmd" || decode_fail_how=deadline
}

# finish_decode_folder: at the decode stage, waits for the writer (KILN_GPU_CHECK_WRITE_WAIT,
# 180 s, at most, and never past the deadline) and marks the folder complete.
finish_decode_folder() {
  [ -n "$bg_pid" ] && [ "$bg_name" = decode_write ] || return 0
  local cap=${KILN_GPU_CHECK_WRITE_WAIT:-180} left how=timeout
  left=$((deadline - $(date +%s) - 25))
  [ "$left" -lt "$cap" ] && cap=$left how=deadline
  [ "$cap" -ge 0 ] || cap=0
  if join_background "$cap" "$how"; then
    echo "$decode_stamp" >"$decode_dir/.kiln_gpu_check_complete"
    decode_ok=1
  else
    decode_fail_how=$(read -r _ _ h _ <"$logs/decode_write.rc"; [ "$h" = deadline ] && echo deadline || echo fail)
    [ "$decode_fail_how" = deadline ] ||
      note "decode_write failed (logs/decode_write.log): the decode steps did not run"
  fi
  write_results running
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
  # The random Qwen3-8B folder takes CPU and disk, not the GPU: it is written from now on, while
  # the stages before decode run (paused during their timing steps).
  case " $stages " in *" decode "*) start_decode_folder ;; esac
  for stage in $stages; do
    [ "$stage" = cuda-tests ] && list_cuda_suites
    if { [ "$stage" = sanitizer ] || [ "$stage" = memcheck-apps ]; } && [ ! -x "$sanitizer_bin" ]; then
      note "compute-sanitizer not found (PATH, /usr/local/cuda/bin): the $stage stage did not run"
      echo "compute-sanitizer-missing" >>"$work/failed_setup"
      continue
    fi
    say "---- stage $stage"
    while IFS='|' read -r name kind limit dir envs cmd; do
      [ -n "$name" ] || continue
      if [ "$kind" = background ]; then  # decode_write, started before the first stage
        finish_decode_folder
        continue
      fi
      if [ -n "${KILN_GPU_CHECK_ONLY:-}" ] && ! [[ "$name" =~ $KILN_GPU_CHECK_ONLY ]]; then continue; fi
      if [ "$stage" = decode ] && [ "$decode_ok" != 1 ]; then
        if [ "$decode_fail_how" = deadline ]; then
          echo "$name" >>"$work/not_run"
        else
          record_unrun "$name" "$kind" "not run: no random Qwen3-8B folder (see decode_write and the notes)"
        fi
        continue
      fi
      run_step "$name" "$kind" "$limit" "$dir" "$envs" "$cmd"
    done < <(gpu_check_plan "$stage")
    if [ "$stage" = smoke ] && [ -f "$logs/smoke_probe.log" ]; then
      { echo "# probe (tests/test_kernels --gtest_filter=CudaProbe.*)"; grep '^probe:' "$logs/smoke_probe.log"; } >>"$work/libs.txt"
    fi
    if [ "$stage" = bench ]; then
      for f in "$work"/bench_gpu/gpu_*.json; do [ -e "$f" ] && cp "$f" "$out/gpu_bench.json"; done
      for f in "$work"/bench_gpu/gpu_*.md; do [ -e "$f" ] && cp "$f" "$out/gpu_bench.md"; done
    fi
  done
  stop_background  # a writer whose decode stage the deadline cut
  if [ -s "$work/not_run" ]; then
    note "the deadline (${deadline_s} s) stopped the run before: $(sort -u "$work/not_run" | tr '\n' ' ')"
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
  expected=${GPU_CHECK_EXPECTED_S[setup]}
  for stage in $stages; do expected=$((expected + ${GPU_CHECK_EXPECTED_S[$stage]:-0})); done
  echo "# gpu_check plan: stages $stages; deadline ${deadline_s} s (no step starts with < 15 s left;"
  echo "# a running one is stopped 10 s before it); expected about ${expected} s on an H200, setup"
  echo "# (unpacking the bundle, ldd, the probe) ~${GPU_CHECK_EXPECTED_S[setup]} s. Lines: NAME|KIND|LIMIT (s)|DIR|ENV|COMMAND."
  for stage in $stages; do
    echo "# stage $stage (expected ~${GPU_CHECK_EXPECTED_S[$stage]:-?} s)"
    case "$stage" in
      cuda-tests) [ -n "$(gpu_check_plan cuda-tests)" ] ||
        echo "#   (one step per CUDA suite of the test binaries of the bundle; none at $bundle to list them)" ;;
      decode) echo "#   decode_write starts in the background when the GPU is found (before smoke), is paused" \
        "during timing steps and waited for here (<= ${KILN_GPU_CHECK_WRITE_WAIT:-180} s); %decode_dir = $decode_dir" ;;
    esac
    gpu_check_plan "$stage"
  done
  files="results.json summary.md logs.tar.gz gpu_check.log"
  case " $stages " in *" bench "*) files="$files gpu_bench.json gpu_bench.md" ;; esac
  case " $stages " in *" decode "*) files="$files decode_8b.json" ;; esac
  echo "# files back in OUTDIR: $files (nvidia-smi.txt, libs.txt and the logs of every step in logs.tar.gz)"
  rm -rf "$work"
  exit 0
fi

# Everything goes to the terminal and to OUTDIR/gpu_check.log; the status is main's.
main 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
