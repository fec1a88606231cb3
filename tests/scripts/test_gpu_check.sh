#!/usr/bin/env bash
# Tests of scripts/gpu_check.sh without a GPU (ctest: scripts.gpu_check): stage selection, the
# deadline, skip-marker parsing, the no-GPU exit, and results written after every step. A fake
# bundle (shell scripts that behave like the gtest binaries and kiln) and a fake nvidia-smi
# stand in for the GPU machine.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_gpu_check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check "what" command...: fails the test (and goes on) when the command fails
  local what=$1
  shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; failures=$((failures + 1)); fi
}

# shellcheck source=scripts/gpu_check_lib.sh
source "$repo/scripts/gpu_check_lib.sh"

# ---- stage selection --------------------------------------------------------------------------
check "stages keep their order" [ "$(gpu_check_stages 'bench,smoke')" = "smoke bench" ]
check "stages: all" [ "$(gpu_check_stages all)" = "smoke cuda-tests sanitizer bench" ]
check "stages: duplicates once" [ "$(gpu_check_stages 'sanitizer sanitizer')" = "sanitizer" ]
gpu_check_stages "smoke typo" 2>/dev/null
check "stages: unknown refused" [ $? = 64 ]

# ---- step limits under the deadline -----------------------------------------------------------
check "limit: plenty of time" [ "$(gpu_check_step_limit 120 1000 1480)" = 120 ]
check "limit: cut to the deadline less 10 s" [ "$(gpu_check_step_limit 120 1000 1100)" = 90 ]
check "limit: too little left, not started" [ "$(gpu_check_step_limit 120 1000 1024)" = 0 ]

# ---- CUDA suites from --gtest_list_tests ------------------------------------------------------
suites=$(printf '%s\n' 'CudaDevice.' '  A' 'CudaAttentionHost.' '  B' 'Ops.' '  C' \
  'All/BackendOpsCuda.' '  MatchesCpu/0  # GetParam() = 1' '  MatchesCpu/1  # GetParam() = 2' \
  'CudaAttentionPlan.' '  D' 'CudnnAttentionGpu.' '  E' 'Cli.' '  Help' '  TrainOnCuda' \
  'MultiTensorAdamW.' '  CudaMatchesCpu' | gpu_check_cuda_suites | cut -d' ' -f1 | tr '\n' ' ')
check "cuda suites: GPU ones only ($suites)" [ "$suites" = "CudaDevice BackendOpsCuda CudnnAttentionGpu named " ]
named=$(printf '%s\n' 'Cli.' '  Help' '  TrainOnCuda' 'MultiTensorAdamW.' '  CudaMatchesCpu' | gpu_check_cuda_suites)
check "cuda tests of other suites by name ($named)" [ "$named" = "named Cli.TrainOnCuda:MultiTensorAdamW.CudaMatchesCpu" ]

# ---- a fake bundle and a fake nvidia-smi ------------------------------------------------------
bundle=$tmp/bundle
mkdir -p "$bundle/tests" "$bundle/apps" "$bundle/data" "$tmp/bin" "$tmp/nogpu"
cat >"$bundle/manifest.env" <<EOF
KILN_BUNDLE_SOURCE_DIR='$repo'
KILN_BUNDLE_BINARY_DIR='$tmp/build'
KILN_BUNDLE_COMMIT='unknown'
KILN_BUNDLE_DATE='2026-01-01T00:00:00Z'
KILN_BUNDLE_BUILD_OK='1'
KILN_BUNDLE_NVCC='nvcc 13.0'
KILN_BUNDLE_EXES='tests/test_kernels tests/test_tensor apps/kiln'
EOF
# A gtest binary: lists two CUDA suites and a host suite; writes XML for the filter it is given.
# FAKE_SKIP: the skip message of its one skipped test; FAKE_SLEEP: seconds before finishing.
cat >"$bundle/tests/test_kernels" <<'EOF'
#!/usr/bin/env bash
xml="" filter=""
for a in "$@"; do
  case "$a" in
    --gtest_list_tests) printf '%s\n' 'CudaProbe.' '  VersionsAndLoadedLibraries' 'CudaDevice.' \
      '  Info' 'CudaAttentionHost.' '  Key'; exit 0 ;;
    --gtest_output=xml:*) xml=${a#--gtest_output=xml:} ;;
    --gtest_filter=*) filter=${a#--gtest_filter=} ;;
  esac
done
echo "probe: devices 1 driver 13000 runtime 13000 cublasLt 130000 cudnn 91900 nccl 22803"
echo "filter $filter; CUDA_LAUNCH_BLOCKING=${CUDA_LAUNCH_BLOCKING:-unset}"
[ -z "$xml" ] || sleep "${FAKE_SLEEP:-0}"  # the steps, not the probe before the GPU check
cat >"$xml" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="0">
  <testsuite name="CudaDevice" tests="2">
    <testcase name="Info" status="run" result="completed" classname="CudaDevice"/>
    <testcase name="Deliberate" status="run" result="skipped" classname="CudaDevice">
      <skipped message="${FAKE_SKIP:-[expected-skip] a CUDA device is present}"/>
    </testcase>
  </testsuite>
</testsuites>
XML
EOF
cp "$bundle/tests/test_kernels" "$bundle/tests/test_tensor"
printf '#!/usr/bin/env bash\necho "kiln $*"; mkdir -p train_smoke; head -c 3000000 /dev/urandom >train_smoke/final.h5\n' >"$bundle/apps/kiln"
chmod +x "$bundle"/tests/* "$bundle/apps/kiln"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in *--query-gpu*) echo "NVIDIA H100 80GB HBM3, 580.00, 81559 MiB, 9.0" ;; *) echo "fake nvidia-smi" ;; esac
EOF
printf '#!/usr/bin/env bash\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver"\nexit 9\n' >"$tmp/nogpu/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi" "$tmp/nogpu/nvidia-smi"
run_check() {  # run_check OUT PATHDIR VAR=value...: gpu_check.sh on the fake bundle
  local o=$1 p=$2
  shift 2
  env PATH="$p:$PATH" KILN_BUNDLE="$bundle" KILN_GPU_CHECK_CUDA_HOMES="" "$@" \
    "$repo/scripts/gpu_check.sh" "$o" >"$o.out" 2>&1
}
json() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1/results.json"; }

# ---- the plan of each stage (dry run) ---------------------------------------------------------
plan=$(KILN_BUNDLE=$bundle KILN_GPU_CHECK_DRY_RUN=1 KILN_GPU_CHECK_STAGES=sanitizer "$repo/scripts/gpu_check.sh" "$tmp/dry")
check "sanitizer: memcheck without caching" grep -q '^memcheck_backend_ops|sanitizer|[0-9]*|tests|.*KILN_NO_CACHING=1' <<<"$plan"
check "sanitizer: the OOM test excluded" grep -q -- '-CudaDevice.OutOfMemoryIsAClearErrorAndNotSticky' <<<"$plan"
check "sanitizer: the guard overrun excluded" grep -q -- '-CudaCachingAllocator.GuardBytesCatchADeviceOverrun' <<<"$plan"
check "sanitizer: racecheck" grep -q '^racecheck_' <<<"$plan"
plan=$(KILN_BUNDLE=$bundle KILN_GPU_CHECK_DRY_RUN=1 KILN_GPU_CHECK_STAGES=cuda-tests "$repo/scripts/gpu_check.sh" "$tmp/dry")
check "cuda-tests: one process per CUDA suite" [ "$(grep -c '|gtest|' <<<"$plan")" = 4 ]
check "cuda-tests: chosen by filter" grep -q '^kernels.CudaDevice|gtest|120|tests|CUDA_LAUNCH_BLOCKING=1|./test_kernels --gtest_filter=CudaDevice' <<<"$plan"
check "cuda-tests: host suites left to CI" bash -c "! grep -q CudaAttentionHost <<<'$plan'"
plan=$(KILN_BUNDLE=$bundle KILN_GPU_CHECK_DRY_RUN=1 KILN_GPU_CHECK_STAGES=smoke,bench "$repo/scripts/gpu_check.sh" "$tmp/dry")
check "smoke + bench: smoke steps" grep -q '^smoke_generate|' <<<"$plan"
check "smoke + bench: bench step 120 s per run" grep -q '^bench_gpu_vs_torch|.*RUN_TIMEOUT=120' <<<"$plan"
check "every planned limit under 8 minutes" bash -c "! cut -d'|' -f3 <<<'$plan' | awk '\$1 > 480' | grep -q ."

# ---- no GPU: every stage exits 2, with results, in seconds -----------------------------------
for stage in smoke cuda-tests sanitizer bench; do
  o=$tmp/nogpu_$stage
  t=$(date +%s)
  run_check "$o" "$tmp/nogpu" KILN_GPU_CHECK_STAGES=$stage
  rc=$?
  secs=$(($(date +%s) - t))
  check "no GPU, $stage: exit 2 ($rc)" [ "$rc" = 2 ]
  check "no GPU, $stage: says so" grep -q "no NVIDIA GPU found" "$o.out"
  check "no GPU, $stage: results" [ -s "$o/results.json" ] && [ -s "$o/summary.md" ] && [ -s "$o/logs.tar.gz" ]
  check "no GPU, $stage: status no_gpu" [ "$(json "$o" 'r["status"]')" = no_gpu ]
  check "no GPU, $stage: in seconds ($secs s; loose, for loaded CI machines)" [ "$secs" -lt 60 ]
done

# ---- a passing smoke stage; results after every step; the expected skip ----------------------
o=$tmp/smoke
run_check "$o" "$tmp/bin" KILN_GPU_CHECK_STAGES=smoke
rc=$?
check "smoke: exit 0 ($rc)" [ "$rc" = 0 ]
check "smoke: four steps recorded" [ "$(json "$o" 'len(r["steps"])')" = 4 ]
check "smoke: the expected skip is not a failure" [ "$(json "$o" 'r["totals"]["expected_skipped"]')" = 2 ]
check "smoke: synchronous launches" grep -q "CUDA_LAUNCH_BLOCKING=1" <(tar -xzOf "$o/logs.tar.gz" logs/smoke_probe.log)
check "smoke: probe in libs.txt" grep -q '^probe: devices 1' "$o/libs.txt"
check "smoke: no training outputs in the archive" bash -c "! tar -tzf '$o/logs.tar.gz' | grep -qv '^logs/'"
check "smoke: at most 8 files back" [ "$(find "$o" -type f | wc -l)" -le 8 ]

# A CUDA skip without the marker on a GPU machine is a failure.
o=$tmp/skip
run_check "$o" "$tmp/bin" KILN_GPU_CHECK_STAGES=smoke FAKE_SKIP="no CUDA device: not run"
rc=$?
check "unmarked CUDA skip: exit 1 ($rc)" [ "$rc" = 1 ]
check "unmarked CUDA skip: named" grep -q "skipped on a GPU machine" "$o/summary.md"

# ---- the deadline: the running step is cut, the rest listed, the results written -------------
o=$tmp/deadline
t=$(date +%s)
run_check "$o" "$tmp/bin" KILN_GPU_CHECK_STAGES=smoke KILN_GPU_CHECK_DEADLINE=27 FAKE_SLEEP=60
rc=$?
secs=$(($(date +%s) - t))
check "deadline: exit 4, incomplete ($rc)" [ "$rc" = 4 ]
check "deadline: stopped near the deadline ($secs s of 27; loose, for loaded CI machines)" [ "$secs" -le 45 ]
check "deadline: status incomplete" [ "$(json "$o" 'r["status"]')" = incomplete ]
check "deadline: the cut step recorded" [ "$(json "$o" 'r["steps"]["smoke_probe"]["result"]')" = deadline ]
check "deadline: later steps listed" [ "$(json "$o" '" ".join(r["not_run"])')" = "smoke_probe smoke_runtime smoke_train smoke_generate" ]

# ---- the logs archive stays under 8 MiB whatever the logs ------------------------------------
w=$tmp/work
mkdir -p "$w/logs" "$tmp/arch"
for i in $(seq 1 45); do  # 45 incompressible logs of 400 KB: over 8 MiB at the first cut
  head -c 300000 /dev/urandom | base64 >"$w/logs/big$i.log"
  echo "0 1 done cmd 10" >"$w/logs/big$i.rc"
done
python3 "$repo/scripts/gpu_check_results.py" --work "$w" --out "$tmp/arch" --status test
size=$(stat -c %s "$tmp/arch/logs.tar.gz")
check "archive under 8 MiB with 18 MB of incompressible logs ($size bytes)" [ "$size" -lt $((8 << 20)) ]

# ---- the bundle's RPATH rewrite ---------------------------------------------------------------
if command -v cc >/dev/null && command -v readelf >/dev/null; then
  printf 'int main(void) { return 0; }\n' >"$tmp/rp.c"
  cc "$tmp/rp.c" -o "$tmp/rp" -Wl,--disable-new-dtags '-Wl,-rpath,$ORIGIN/../lib:/usr/local/cuda/lib64:/opt/openblas' &&
    python3 "$repo/scripts/set_rpath.py" '$ORIGIN/../lib' "$tmp/rp"
  check "set_rpath: \$ORIGIN/../lib only" grep -q 'Library rpath: \[\$ORIGIN/../lib\]$' <(readelf -d "$tmp/rp")
  check "set_rpath: the binary still runs" "$tmp/rp"
  python3 "$repo/scripts/set_rpath.py" "$(printf '/x%.0s' $(seq 1 80))" "$tmp/rp" 2>/dev/null
  check "set_rpath: a longer RPATH is refused" [ $? = 1 ]
fi

# ---- skip classification ----------------------------------------------------------------------
check "skip marker parsing" python3 - "$repo/scripts" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
from gpu_check_results import classify_skip as c
assert c("[expected-skip] a CUDA device is present: ...", True) == "expected"
assert c("no CUDA device: not run", True) == "cuda_fail"
assert c("no CUDA device: not run", False) == "cuda"
assert c("needs python3 with torch", True) == "other"
EOF

echo "test_gpu_check: $failures failure(s)"
[ "$failures" = 0 ]
