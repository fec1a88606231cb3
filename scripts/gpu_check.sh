#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR: the one command for an NVIDIA GPU machine (H100/H200 with the CUDA
# toolkit, PyTorch and transformers, but none of the Debian -dev packages and no network).
#
# It uses the bundle that scripts/bundle_gpu.sh built (build-gpu/bundle/, or build-gpu/bundle.tar.gz
# which it unpacks); where the machine can build (nvcc, cmake and the -dev packages), it builds the
# bundle itself. Then it:
#   1. records nvidia-smi (OUTDIR/nvidia-smi.txt);
#   2. finds the CUDA libraries the binaries need and the system lacks (cuDNN, NCCL, ...) in the
#      CUDA toolkit or in PyTorch's nvidia-* wheels, and puts their folders on LD_LIBRARY_PATH;
#   3. maps the source/build paths compiled into the tests onto this checkout and the bundle;
#   4. runs every test binary directly (gtest XML; ctest's files hold the build machine's paths),
#      then every Google Benchmark binary in bench/, then bench/gpu_bench.sh WORKDIR BUNDLE if it
#      exists (the hook for end-to-end benchmarks against PyTorch; it writes WORKDIR/*.json);
#   5. writes OUTDIR/results.json, OUTDIR/summary.md, OUTDIR/gpu_check.log and
#      OUTDIR/details.tar.gz (per-binary logs, gtest XML, benchmark JSON). OUTDIR stays at five
#      files, so that it can be copied back from machines that return only a few.
# Exit status: 0 all passed; 1 a test failed or crashed; 2 no NVIDIA GPU found (the tests still
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
rm -f "$out/results.json" "$out/summary.md" "$out/details.tar.gz"

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
      MISSING="${missing_libs:-}" python3 - <<'PY'
import glob, json, os, socket, xml.etree.ElementTree as ET

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

tests, totals = {}, {"passed": 0, "failed": 0, "skipped": 0, "total": 0}
for rc_file in sorted(glob.glob(f"{work}/tests/*.rc")):
    name = os.path.basename(rc_file)[:-3]
    rc = int(open(rc_file).read().split()[0])
    secs = int(open(rc_file).read().split()[1])
    r = {"passed": 0, "failed": 0, "skipped": 0, "total": 0, "exit_code": rc, "seconds": secs,
         "failed_tests": []}
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
            else:
                r["passed"] += 1
        r["result"] = "pass" if rc == 0 and r["failed"] == 0 else "fail"
    else:
        # No XML: it did not start or died before writing it (or is not a gtest binary).
        r["result"] = "crashed" if rc != 0 else "no_report"
    for k in totals:
        totals[k] += r[k]
    tests[name] = r

benchmarks = sorted(os.path.relpath(p, work) for p in glob.glob(f"{work}/bench/*.json"))
notes = [n for n in open(f"{work}/notes.txt").read().splitlines() if n]
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
    "benchmarks": benchmarks,
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
      "| binary | result | passed | failed | skipped | total | seconds |",
      "| --- | --- | --- | --- | --- | --- | --- |"]
for name, r in tests.items():
    md.append(f"| {name} | {r['result']} | {r['passed']} | {r['failed']} | {r['skipped']} | {r['total']} | {r['seconds']} |")
md.append(f"| **all** | | {totals['passed']} | {totals['failed']} | {totals['skipped']} | {totals['total']} | |")
failed = [t for r in tests.values() for t in r["failed_tests"]]
if failed:
    md += ["", "Failed tests:", *[f"- {t}" for t in failed]]
md += ["", "Benchmarks: " + (", ".join(benchmarks) if benchmarks else "none run")]
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
mkdir -p "$work/tests" "$work/bench"
for rel in "${exes[@]}"; do
  case "$rel" in tests/test_*) ;; *) continue ;; esac
  name=$(basename "$rel")
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

# ---- 7. benchmarks -----------------------------------------------------------------------------------
for rel in "${exes[@]}"; do
  case "$rel" in bench/*) ;; *) continue ;; esac
  name=$(basename "$rel")
  # Only Google Benchmark binaries take --benchmark_out; others (a CLI driver with a PyTorch peer,
  # say) belong in the bench/gpu_bench.sh hook, which knows their flags.
  if ! grep -qa 'benchmark_out_format' "$bundle/$rel"; then
    note "benchmark $name is not a Google Benchmark binary: skipped (run it from bench/gpu_bench.sh)"
    continue
  fi
  say "benchmark $name"
  (cd "$bundle/bench" && timeout "${KILN_BENCH_TIMEOUT:-600}" "./$name" \
    --benchmark_out="$work/bench/$name.json" --benchmark_out_format=json) >"$work/bench/$name.log" 2>&1 ||
    note "benchmark $name exited with status $?"
done
if [ -x "$repo/bench/gpu_bench.sh" ]; then
  say "running bench/gpu_bench.sh"
  "$repo/bench/gpu_bench.sh" "$work/bench" "$bundle" >"$work/bench/gpu_bench.log" 2>&1 ||
    note "bench/gpu_bench.sh exited with status $?"
fi

# ---- 8. results --------------------------------------------------------------------------------------
failed=0
for f in "$work"/tests/*.rc; do
  [ -e "$f" ] || continue
  [ "$(cut -d' ' -f1 "$f")" = 0 ] || failed=1
done
ls "$work"/tests/*.rc >/dev/null 2>&1 || { note "no test binaries in the bundle"; failed=1; }
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
