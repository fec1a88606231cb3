#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR: the one command for an NVIDIA GPU machine (H100/H200 with the CUDA
# toolkit, PyTorch and transformers, but none of the Debian -dev packages and no network).
#
# It uses the bundle that scripts/bundle_gpu.sh built (build-gpu/bundle/, or build-gpu/bundle.tar.gz
# or .tar.xz, which it unpacks); where the machine can build (nvcc, cmake and the -dev packages), it
# builds the bundle itself. Then it:
#   1. records nvidia-smi (OUTDIR/nvidia-smi.txt);
#   2. finds the CUDA libraries the binaries need and the system lacks (cuDNN, NCCL, ...) in the
#      CUDA toolkit or in PyTorch's nvidia-* wheels, and puts their folders on LD_LIBRARY_PATH;
#   3. maps the source/build paths compiled into the tests onto this checkout and the bundle;
#   4. runs every test binary directly (gtest XML; ctest's files hold the build machine's paths),
#      counting passed, failed and skipped tests. On a GPU machine no CUDA test may skip: a
#      skipped test whose message names CUDA, a GPU or a device counts as a failure there;
#   5. runs compute-sanitizer --tool memcheck on a small subset: the CUDA runtime, allocator and
#      guard-byte tests, the backend-ops test (every op's CUDA kernel on small shapes), and kiln
#      train / generate on tiny shapes (every kernel of a training step and of decoding), the
#      latter with KILN_GUARD_BYTES=64; and --tool racecheck on kiln's flash attention test. Any
#      memcheck error, racecheck hazard or guard violation fails the check;
#   6. every Google Benchmark binary in bench/, then bench/run_gpu_bench.sh (kiln vs PyTorch:
#      training steps, attention; its JSON and markdown land in OUTDIR as gpu_bench.json/.md);
#   7. writes OUTDIR/results.json, OUTDIR/summary.md, OUTDIR/gpu_check.log and
#      OUTDIR/details.tar.gz (per-binary logs, gtest XML, sanitizer logs, benchmark JSON), with
#      nvidia-smi.txt and the two gpu_bench files: at most seven files, so that they can be
#      copied back from machines that return only a few.
# KILN_GPU_CHECK_STAGES picks the stages (default "tests sanitizer bench"), so that the whole can
# be split over several shorter runs; KILN_TEST_FILTER (a regex on binary names) narrows the
# tests.
# Exit status: 0 all passed; 1 a test failed or crashed, a CUDA test skipped on a GPU machine,
# the sanitizer found an error, or a benchmark failed; 2 no NVIDIA GPU found (the tests still
# run, the CUDA ones skip, and results.json says so); 3 no bundle and no way to build one.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: scripts/gpu_check.sh OUTDIR" >&2
  exit 64
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo" || exit 1
bundle=${KILN_BUNDLE:-$repo/build-gpu/bundle}
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln_gpu_check.XXXXXX")
rm -f "$out/results.json" "$out/summary.md" "$out/details.tar.gz" "$out/gpu_bench.json" \
  "$out/gpu_bench.md"
stages=" ${KILN_GPU_CHECK_STAGES:-tests sanitizer bench} "
stage() { case "$stages" in *" $1 "*) return 0 ;; esac; return 1; }

main() {

say() { echo "gpu_check: $*"; }
notes=()
note() {
  say "$*"
  notes+=("$*")
}
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=$(date +%s)

# ---- 1. the GPU ------------------------------------------------------------------------------
gpu_found=0
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
  note "no NVIDIA GPU found (see nvidia-smi.txt); running the tests anyway, the CUDA ones skip; exit status 2"
fi

# ---- results writer (used on every exit path) -------------------------------------------------
write_results() {
  local status=$1
  local commit
  commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo "${KILN_BUNDLE_COMMIT:-unknown}")
  printf '%s\n' "${notes[@]+"${notes[@]}"}" >"$work/notes.txt"
  if command -v python3 >/dev/null; then
    STATUS="$status" COMMIT="$commit" STARTED="$started" SECONDS_TOTAL=$(($(date +%s) - t0)) \
      GPU_FOUND="$gpu_found" WORK="$work" OUT="$out" LIBDIRS="${cuda_lib_dirs:-}" \
      MISSING="${missing_libs:-}" STAGES="$stages" python3 - <<'PY'
import glob, json, os, re, socket, xml.etree.ElementTree as ET

work, out = os.environ["WORK"], os.environ["OUT"]
gpus = []
if os.path.exists(f"{work}/gpus.csv"):
    for line in open(f"{work}/gpus.csv"):
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 4:
            gpus.append({"name": f[0], "driver": f[1], "memory": f[2], "compute_cap": f[3]})
manifest = {}
if os.path.exists(f"{work}/manifest.env"):
    for line in open(f"{work}/manifest.env"):
        k, _, v = line.strip().partition("=")
        manifest[k.replace("KILN_BUNDLE_", "").lower()] = v.strip("'")

# A skip that names CUDA, a GPU or a device: on a GPU machine it must not happen.
cuda_skip = re.compile(r"cuda|gpu|device", re.I)
gpu_found = os.environ["GPU_FOUND"] == "1"
tests, totals = {}, {"passed": 0, "failed": 0, "skipped": 0, "total": 0, "cuda_skipped": 0}
for rc_file in sorted(glob.glob(f"{work}/tests/*.rc")):
    name = os.path.basename(rc_file)[:-3]
    rc = int(open(rc_file).read().split()[0])
    secs = int(open(rc_file).read().split()[1])
    r = {"passed": 0, "failed": 0, "skipped": 0, "total": 0, "cuda_skipped": 0, "exit_code": rc,
         "seconds": secs, "failed_tests": [], "skipped_tests": []}
    xml = f"{work}/tests/{name}.xml"
    if os.path.exists(xml):
        for case in ET.parse(xml).getroot().iter("testcase"):
            if case.get("status") == "notrun":
                continue  # DISABLED_ tests
            r["total"] += 1
            if case.find("failure") is not None or case.find("error") is not None:
                r["failed"] += 1
                r["failed_tests"].append(f"{case.get('classname')}.{case.get('name')}")
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                r["skipped"] += 1
                sk = case.find("skipped")
                msg = (sk.get("message") or sk.text or "") if sk is not None else ""
                msg = " ".join(msg.split())
                tname = f"{case.get('classname')}.{case.get('name')}"
                r["skipped_tests"].append(f"{tname}: {msg[:200]}")
                if cuda_skip.search(msg):
                    r["cuda_skipped"] += 1
                    if gpu_found:
                        r["failed_tests"].append(f"{tname} (skipped on a GPU machine: {msg[:160]})")
            else:
                r["passed"] += 1
        gpu_skip = gpu_found and r["cuda_skipped"] > 0
        r["result"] = "pass" if rc == 0 and r["failed"] == 0 and not gpu_skip else "fail"
    else:
        # No XML: it did not start or died before writing it (or is not a gtest binary).
        r["result"] = "crashed" if rc != 0 else "no_report"
    for k in totals:
        totals[k] += r[k]
    tests[name] = r

benchmarks = sorted(os.path.relpath(p, work) for p in glob.glob(f"{work}/bench/*.json"))
notes = [n for n in open(f"{work}/notes.txt").read().splitlines() if n]
sanitizer = {}
for rc_file in sorted(glob.glob(f"{work}/sanitizer/*.rc")):
    name = os.path.basename(rc_file)[:-3]
    rc, secs = open(rc_file).read().split()[:2]
    log = open(f"{work}/sanitizer/{name}.log", errors="replace").read()
    m = re.search(r"ERROR SUMMARY: (\d+) error", log) or re.search(r"RACECHECK SUMMARY: (\d+) hazard", log)
    guard = log.count("guard bytes overwritten")
    sanitizer[name] = {"exit_code": int(rc), "seconds": int(secs),
                       "errors": int(m.group(1)) if m else None, "guard_violations": guard,
                       "result": "pass" if int(rc) == 0 and m and m.group(1) == "0" and guard == 0 else "fail"}
gpu_bench = None
if os.path.exists(f"{out}/gpu_bench.json"):
    try:
        gpu_bench = json.load(open(f"{out}/gpu_bench.json")).get("ratios")
    except Exception as e:
        gpu_bench = {"error": str(e)}
res = {
    "schema": 1,
    "status": os.environ["STATUS"],
    "date": os.environ["STARTED"],
    "seconds": int(os.environ["SECONDS_TOTAL"]),
    "host": socket.gethostname(),
    "commit": os.environ["COMMIT"],
    "bundle": manifest,
    "gpu_found": os.environ["GPU_FOUND"] == "1",
    "gpus": gpus,
    "card": gpus[0]["name"] if gpus else None,
    "cuda_lib_dirs": [d for d in os.environ["LIBDIRS"].split(":") if d],
    "missing_libs": os.environ["MISSING"].split(),
    "tests": tests,
    "totals": totals,
    "stages": os.environ["STAGES"].split(),
    "sanitizer": sanitizer,
    "benchmarks": benchmarks,
    "gpu_bench_ratios": gpu_bench,
    "notes": notes,
}
json.dump(res, open(f"{out}/results.json", "w"), indent=2)

md = [f"# kiln gpu_check: {res['status']}", "",
      f"- date: {res['date']} ({res['seconds']} s), host {res['host']}",
      f"- commit: {res['commit']} (bundle built from {manifest.get('commit', '?')}"
      f" on {manifest.get('date', '?')}, {manifest.get('nvcc', '?')})",
      f"- GPU: {', '.join(g['name'] + ' (driver ' + g['driver'] + ', ' + g['memory'] + ')' for g in gpus) or 'none found'}",
      f"- CUDA libraries from: {', '.join(res['cuda_lib_dirs']) or 'the system paths'}"
      + (f"; missing: {' '.join(res['missing_libs'])}" if res['missing_libs'] else ""), "",
      "| binary | result | passed | failed | skipped (CUDA) | total | seconds |",
      "| --- | --- | --- | --- | --- | --- | --- |"]
for name, r in tests.items():
    md.append(f"| {name} | {r['result']} | {r['passed']} | {r['failed']} | {r['skipped']} ({r['cuda_skipped']}) | {r['total']} | {r['seconds']} |")
md.append(f"| **all** | | {totals['passed']} | {totals['failed']} | {totals['skipped']} ({totals['cuda_skipped']}) | {totals['total']} | |")
failed = [t for r in tests.values() for t in r["failed_tests"]]
if failed:
    md += ["", "Failed tests:", *[f"- {t}" for t in failed]]
skipped = [t for r in tests.values() for t in r["skipped_tests"]]
if skipped:
    md += ["", "Skipped tests:", *[f"- {t}" for t in skipped[:40]]]
if sanitizer:
    md += ["", "| compute-sanitizer run | result | errors | guard violations | seconds |",
           "| --- | --- | --- | --- | --- |"]
    for name, r in sanitizer.items():
        md.append(f"| {name} | {r['result']} | {r['errors']} | {r['guard_violations']} | {r['seconds']} |")
md += ["", "Benchmarks: " + (", ".join(benchmarks) if benchmarks else "none run")]
if os.path.exists(f"{out}/gpu_bench.md"):
    md += ["", open(f"{out}/gpu_bench.md").read()]
if notes:
    md += ["", "Notes:", *[f"- {n}" for n in notes]]
open(f"{out}/summary.md", "w").write("\n".join(md) + "\n")
PY
  else
    printf '{"schema": 1, "status": "%s", "date": "%s", "commit": "%s", "gpu_found": %s, "notes": "python3 not found; see gpu_check.log"}\n' \
      "$status" "$started" "$commit" "$([ "$gpu_found" = 1 ] && echo true || echo false)" >"$out/results.json"
    echo "# kiln gpu_check: $status (python3 missing; see gpu_check.log)" >"$out/summary.md"
  fi
  tar -C "$work" -czf "$out/details.tar.gz" . 2>/dev/null
}

finish() {
  local status=$1 code=$2
  write_results "$status"
  say "status $status; results in $out/results.json and $out/summary.md"
  [ -f "$out/summary.md" ] && cat "$out/summary.md"
  rm -rf "$work"
  exit "$code"
}

# ---- 2. the bundle ---------------------------------------------------------------------------
if [ ! -d "$bundle" ] && [ -f "$bundle.tar.gz" ]; then
  say "unpacking $bundle.tar.gz"
  tar -C "$(dirname "$bundle")" -xzf "$bundle.tar.gz" || note "could not unpack $bundle.tar.gz"
elif [ ! -d "$bundle" ] && [ -f "$bundle.tar.xz" ]; then
  say "unpacking $bundle.tar.xz"
  # tar -J needs the xz program; Python's lzma module does without it.
  tar -C "$(dirname "$bundle")" -xJf "$bundle.tar.xz" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
      "$bundle.tar.xz" "$(dirname "$bundle")" || note "could not unpack $bundle.tar.xz"
fi
if [ ! -d "$bundle" ]; then
  if command -v cmake >/dev/null && command -v pkg-config >/dev/null &&
    pkg-config --exists openblas libpcre2-8 2>/dev/null; then
    say "no bundle; building one here with scripts/bundle_gpu.sh"
    KILN_GPU_BUILD_DIR="$(dirname "$bundle")" "$repo/scripts/bundle_gpu.sh" ||
      { note "scripts/bundle_gpu.sh failed"; finish build_failed 3; }
  else
    note "no bundle at $bundle and this machine cannot build one (no -dev packages): run scripts/bundle_gpu.sh on a build machine and carry build-gpu/bundle.tar.gz"
    finish no_bundle 3
  fi
fi
cp "$bundle/manifest.env" "$work/manifest.env"
# shellcheck disable=SC1091
source "$bundle/manifest.env"
read -r -a exes <<<"$KILN_BUNDLE_EXES"
say "bundle: commit ${KILN_BUNDLE_COMMIT:0:12} built $KILN_BUNDLE_DATE; ${#exes[@]} executables"
[ "$KILN_BUNDLE_BUILD_OK" = 1 ] || note "the bundle was built with KILN_BUNDLE_KEEP_GOING after a failed build: some binaries are missing"
here_commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
[ "$here_commit" = "$KILN_BUNDLE_COMMIT" ] || [ "$here_commit" = unknown ] ||
  note "checkout is at ${here_commit:0:12} but the bundle was built from ${KILN_BUNDLE_COMMIT:0:12}"

# ---- 3. compiled-in paths -> this machine ------------------------------------------------------------
# Tests find their scripts and data through KILN_SOURCE_DIR / KILN_BINARY_DIR, compiled in as the
# build machine's paths. Where those do not exist here, link them to this checkout and the bundle.
src=$KILN_BUNDLE_SOURCE_DIR
bin=$KILN_BUNDLE_BINARY_DIR
if [ "$(realpath -m "$src")" != "$repo" ]; then
  if [ ! -e "$src" ] && mkdir -p "$(dirname "$src")" 2>/dev/null && ln -s "$repo" "$src"; then
    say "linked the compiled source path $src -> $repo"
  else
    note "compiled source path $src is not this checkout ($repo) and could not be linked; tests that read files through it may fail"
  fi
fi
for d in tests apps bench examples; do
  if [ -d "$bundle/$d" ] && [ ! -e "$bin/$d" ]; then
    mkdir -p "$bin" && ln -s "$bundle/$d" "$bin/$d" && say "linked $bin/$d -> $bundle/$d"
  fi
done
export KILN_SOURCE_DIR="$repo" KILN_BINARY_DIR="$bin" KILN_DATA_DIR="$repo/data"
# The reference scripts need a Python with torch: on the GPU image that is the one on PATH
# (its own virtual environment), not Debian's /usr/bin/python3 the tests default to.
if [ -z "${KILN_PYTHON:-}" ] && command -v python3 >/dev/null; then
  export KILN_PYTHON="$(command -v python3)"
fi

# ---- 4. data -----------------------------------------------------------------------------------------
if [ -d "${KILN_SHARED_DATA:-$repo/../shared/data}" ]; then
  "$repo/scripts/get_data.sh" || note "scripts/get_data.sh failed"
else
  KILN_SHARED_DATA="$bundle/data" "$repo/scripts/get_data.sh" || note "scripts/get_data.sh from the bundle failed"
fi

# ---- 5. CUDA libraries -----------------------------------------------------------------------------
missing_sonames() {
  local rel
  for rel in "${exes[@]}"; do ldd "$bundle/$rel" 2>/dev/null | awk '/not found/ {print $1}'; done | sort -u
}
candidate_dirs=()
for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-*; do
  [ -n "$d" ] && for sub in lib64 lib targets/x86_64-linux/lib; do
    [ -d "$d/$sub" ] && candidate_dirs+=("$d/$sub")
  done
done
site_dirs=()
if command -v python3 >/dev/null; then
  while IFS= read -r d; do [ -d "$d" ] && site_dirs+=("$d"); done < <(python3 -c \
    'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null | sort -u)
fi
base_ld_path=${LD_LIBRARY_PATH:-}
cuda_lib_dirs=""
missing_libs=""
# Several passes: ldd cannot see the dependencies of a library it did not find (cuDNN's wheel
# needs cuBLASLt from another wheel, say).
for _pass in 1 2 3; do
  added=0
  for so in $(missing_sonames); do
    found=""
    for d in "${candidate_dirs[@]+"${candidate_dirs[@]}"}"; do
      [ -e "$d/$so" ] && { found="$d"; break; }
    done
    if [ -z "$found" ]; then
      # PyTorch's wheels: site-packages/nvidia/{cudnn,nccl,cu13,...}/lib/<soname>, torch/lib
      for sp in "${site_dirs[@]+"${site_dirs[@]}"}"; do
        hit=$(find "$sp/nvidia" "$sp/torch/lib" -maxdepth 3 -name "$so" 2>/dev/null | head -1)
        [ -n "$hit" ] && { found=$(dirname "$hit"); break; }
      done
    fi
    if [ -n "$found" ]; then
      case ":$cuda_lib_dirs:" in *":$found:"*) ;; *) cuda_lib_dirs="${cuda_lib_dirs:+$cuda_lib_dirs:}$found" added=1 ;; esac
      say "$so: $found"
    fi
  done
  [ -z "$cuda_lib_dirs" ] || export LD_LIBRARY_PATH="$cuda_lib_dirs${base_ld_path:+:$base_ld_path}"
  [ "$added" = 1 ] || break
done
missing_libs=$(missing_sonames | tr '\n' ' ')
[ -z "${missing_libs// /}" ] || note "libraries not found anywhere: $missing_libs"

# libstdc++: the system's is normally newer than the build machine's; use ours only if it is not.
probe=""
for rel in "${exes[@]}"; do case "$rel" in tests/test_*) probe="$bundle/$rel"; break ;; esac; done
if [ -n "$probe" ] && ! "$probe" --gtest_list_tests >/dev/null 2>"$work/probe.err" &&
  grep -q 'GLIBCXX\|CXXABI\|libstdc++\|libgcc_s' "$work/probe.err"; then
  export LD_LIBRARY_PATH="$bundle/lib/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "the system libstdc++ is older than the build machine's: using the bundled one"
fi

# ---- 6. tests ----------------------------------------------------------------------------------------
mkdir -p "$work/tests" "$work/bench" "$work/sanitizer"
for rel in "${exes[@]}"; do
  stage tests || break
  case "$rel" in tests/test_*) ;; *) continue ;; esac
  name=$(basename "$rel")
  if [ -n "${KILN_TEST_FILTER:-}" ] && ! [[ "$name" =~ $KILN_TEST_FILTER ]]; then continue; fi
  say "running $name"
  t=$(date +%s)
  # Same working directory as under ctest (the build tree's tests/ folder).
  (cd "$bundle/$(dirname "$rel")" &&
    timeout "${KILN_TEST_TIMEOUT:-900}" "./$name" --gtest_output="xml:$work/tests/$name.xml") \
    >"$work/tests/$name.log" 2>&1
  rc=$?
  echo "$rc $(($(date +%s) - t))" >"$work/tests/$name.rc"
  grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$work/tests/$name.log" | sed "s/^/  $name: /"
  [ "$rc" = 0 ] || say "$name exited with status $rc (log: details.tar.gz tests/$name.log)"
done

# ---- 7. compute-sanitizer memcheck on a small subset --------------------------------------------------
sanitizer_failed=0
# NAME DIR CMD...: CMD (run in DIR) under compute-sanitizer's $SAN_TOOL (memcheck unless set:
# racecheck for the shared-memory kernels); its log and exit status into $work.
sanitize() {
  local name=$1 dir=$2 tool=${SAN_TOOL:-memcheck}
  shift 2
  say "compute-sanitizer ($tool): $name"
  local t
  t=$(date +%s)
  (cd "$dir" && timeout "${KILN_SANITIZER_TIMEOUT:-600}" "$sanitizer_bin" --tool "$tool" \
    --error-exitcode 99 --print-limit 20 "$@") >"$work/sanitizer/$name.log" 2>&1
  local rc=$?
  echo "$rc $(($(date +%s) - t))" >"$work/sanitizer/$name.rc"
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|guard bytes overwritten' "$work/sanitizer/$name.log" |
    head -5 | sed "s/^/  $name: /"
  # memcheck ends with "ERROR SUMMARY: 0 errors", racecheck with "RACECHECK SUMMARY: 0 hazards".
  if [ "$rc" != 0 ] || grep -q 'guard bytes overwritten' "$work/sanitizer/$name.log" ||
    ! grep -qE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$work/sanitizer/$name.log"; then
    sanitizer_failed=1
    say "compute-sanitizer: $name failed (exit $rc; log: details.tar.gz sanitizer/$name.log)"
  fi
}
if stage sanitizer && [ "$gpu_found" = 1 ]; then
  sanitizer_bin=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ ! -x "$sanitizer_bin" ]; then
    note "compute-sanitizer not found (PATH, /usr/local/cuda/bin): memcheck not run"
    sanitizer_failed=1
  else
    san_dir="$work/sanitizer/run"
    mkdir -p "$san_dir"
    # Small inputs for kiln: a text, and a tiny Qwen3 config for generate.
    for i in $(seq 1 200); do echo "to be or not to be, that is the question."; done >"$san_dir/t.txt"
    cat >"$san_dir/config.json" <<'JSON'
{"model_type": "qwen3", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "max_position_embeddings": 64, "tie_word_embeddings": false}
JSON
    [ -x "$bundle/tests/test_kernels" ] &&
      sanitize test_kernels_cuda_runtime "$bundle/tests" ./test_kernels --gtest_filter='CudaDevice*:CudaDevices*'
    [ -x "$bundle/tests/test_tensor" ] &&
      sanitize test_tensor_allocator "$bundle/tests" ./test_tensor \
        --gtest_filter='CudaCachingAllocator*:DeviceMemoryRows*:CachingAllocatorGuards*'
    # Every op's CUDA kernel once (small shapes) under memcheck, and kiln's flash attention
    # (shared memory, cp.async, ldmatrix) under racecheck.
    [ -x "$bundle/tests/test_tensor" ] &&
      sanitize test_tensor_backend_ops "$bundle/tests" ./test_tensor --gtest_filter='*BackendOpsCuda*'
    [ -x "$bundle/tests/test_tensor" ] &&
      SAN_TOOL=racecheck sanitize test_tensor_attention_racecheck "$bundle/tests" ./test_tensor \
        --gtest_filter='CudaAttentionGpu.MatchesCpuForwardAndBackward'
    if [ -x "$bundle/apps/kiln" ]; then
      for dt in bf16 f32; do
        KILN_GUARD_BYTES=64 sanitize "kiln_train_$dt" "$san_dir" "$bundle/apps/kiln" train --device cuda \
          --dtype "$dt" --data t.txt --steps 2 --batch 2 --seq 16 --eval-interval 2 \
          --eval-batches 1 --progress 0 --log-interval 1 --out "run_$dt"
      done
      KILN_GUARD_BYTES=64 sanitize kiln_generate "$san_dir" "$bundle/apps/kiln" generate --device cuda \
        --dtype bf16 --random-weights --config config.json --prompt-ids 1,2,3,4,5 \
        --max-new-tokens 6 --temperature 0
      KILN_GUARD_BYTES=64 sanitize kiln_generate_cudnn "$san_dir" "$bundle/apps/kiln" generate \
        --device cuda --dtype bf16 --attention cudnn --random-weights --config config.json \
        --prompt-ids 1,2,3,4,5 --max-new-tokens 6 --temperature 0
    fi
    [ "$sanitizer_failed" = 0 ] || note "compute-sanitizer memcheck found errors (see the table)"
  fi
fi

# ---- 8. benchmarks -----------------------------------------------------------------------------------
bench_failed=0
for rel in "${exes[@]}"; do
  stage bench || break
  case "$rel" in bench/*) ;; *) continue ;; esac
  name=$(basename "$rel")
  # Only Google Benchmark binaries take --benchmark_out; the others (CLI drivers with a PyTorch
  # peer) run from bench/run_gpu_bench.sh, which knows their flags.
  if ! grep -qa 'benchmark_out_format' "$bundle/$rel"; then
    case "$name" in kiln_bench_train_step | kiln_bench_attention) ;;
      *) note "benchmark $name is not a Google Benchmark binary: skipped" ;;
    esac
    continue
  fi
  say "benchmark $name"
  (cd "$bundle/bench" && timeout "${KILN_BENCH_TIMEOUT:-600}" "./$name" \
    --benchmark_out="$work/bench/$name.json" --benchmark_out_format=json) >"$work/bench/$name.log" 2>&1 ||
    note "benchmark $name exited with status $?"
done
if stage bench && [ "$gpu_found" = 1 ] && [ -x "$repo/bench/run_gpu_bench.sh" ]; then
  say "running bench/run_gpu_bench.sh (kiln vs PyTorch)"
  KILN_BUNDLE_COMMIT=${KILN_BUNDLE_COMMIT:-} "$repo/bench/run_gpu_bench.sh" "$work/bench" "$bundle/bench" \
    >"$work/bench/run_gpu_bench.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || { note "bench/run_gpu_bench.sh exited with status $rc"; bench_failed=1; }
  for f in "$work"/bench/gpu_*.json; do [ -e "$f" ] && cp "$f" "$out/gpu_bench.json"; done
  for f in "$work"/bench/gpu_*.md; do [ -e "$f" ] && cp "$f" "$out/gpu_bench.md"; done
  tail -40 "$work/bench/run_gpu_bench.log"
fi

# ---- 9. results --------------------------------------------------------------------------------------
failed=0
for f in "$work"/tests/*.rc; do
  [ -e "$f" ] || continue
  [ "$(cut -d' ' -f1 "$f")" = 0 ] || failed=1
done
if stage tests; then
  ls "$work"/tests/*.rc >/dev/null 2>&1 || { note "no test binaries in the bundle"; failed=1; }
fi
# On a GPU machine a skipped CUDA test is a failure (the test's own message says why it skipped).
if [ "$gpu_found" = 1 ]; then
  cuda_skips=$(cat "$work"/tests/*.xml 2>/dev/null | python3 -c '
import re, sys
print(sum(1 for m in re.finditer(r"<skipped[^>]*message=\"([^\"]*)\"", sys.stdin.read())
          if re.search(r"cuda|gpu|device", m.group(1), re.I)))' 2>/dev/null || echo 0)
  if [ "${cuda_skips:-0}" != 0 ]; then
    note "$cuda_skips CUDA test(s) skipped on a GPU machine: counted as failures"
    failed=1
  fi
fi
[ "$sanitizer_failed" = 0 ] || failed=1
[ "$bench_failed" = 0 ] || failed=1
if [ "$gpu_found" = 0 ]; then
  finish no_gpu 2
elif [ "$failed" = 1 ]; then
  finish failed 1
else
  finish ok 0
fi
}

# Everything goes to the terminal and to OUTDIR/gpu_check.log; the status is main's.
main 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
