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
check "stages: all" [ "$(gpu_check_stages all)" = "smoke cuda-tests sanitizer bench decode" ]
check "stages: window, most important first" \
  [ "$(gpu_check_stages window)" = "smoke cuda-tests bench decode memcheck-apps" ]
check "stages: memcheck-apps dropped beside sanitizer" \
  [ "$(gpu_check_stages 'window sanitizer')" = "smoke cuda-tests sanitizer bench decode" ]
check "stages: duplicates once" [ "$(gpu_check_stages 'sanitizer sanitizer')" = "sanitizer" ]
gpu_check_stages "smoke typo" 2>/dev/null
check "stages: unknown refused" [ $? = 64 ]

# ---- timing steps never with synchronous launches ---------------------------------------------
check "launch blocking: the step's own" [ "$(CUDA_LAUNCH_BLOCKING=1 gpu_check_launch_blocking 'A=1 CUDA_LAUNCH_BLOCKING=0')" = 0 ]
check "launch blocking: inherited" [ "$(CUDA_LAUNCH_BLOCKING=1 gpu_check_launch_blocking 'A=1')" = 1 ]
check "launch blocking: unset" [ "$(unset CUDA_LAUNCH_BLOCKING; gpu_check_launch_blocking '')" = unset ]
check "timing env: 0 and unset only" bash -c "source '$repo/scripts/gpu_check_lib.sh'; gpu_check_timing_env_ok 0 &&
  gpu_check_timing_env_ok unset && ! gpu_check_timing_env_ok 1"

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
KILN_BUNDLE_EXES='tests/test_kernels tests/test_tensor apps/kiln bench/kiln_bench_train_step bench/kiln_bench_attention bench/kiln_bench_gemv_cuda bench/kiln_bench_gemm bench/kiln_write_random_safetensors'
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
# kiln: train writes an output the archive must leave out; generate --model prints what the
# decode stage parses.
cat >"$bundle/apps/kiln" <<'EOF'
#!/usr/bin/env bash
echo "kiln $*"
echo "CUDA_LAUNCH_BLOCKING=${CUDA_LAUNCH_BLOCKING:-unset}"
mkdir -p train_smoke
head -c 3000000 /dev/urandom >train_smoke/final.h5
case " $* " in *" --model "*) cat <<'OUT' ;; esac
loaded qwen3 from <dir> in 6.56 s (bf16, cuda, 36 layers, vocab 151936, no tokenizer)
1 2 3 4 | 66365 1210 23758 52585
--- 64 prompt tokens, 128 new (stop: max-new-tokens); sampling: temperature 0
time to first token       111.5 ms
prefill                  574.24 tokens/s (64 tokens in 0.111 s)
decode                   100.05 tokens/s (127 tokens in 1.269 s)
bytes read per decode token: 15136.8 MB weights + 18.87 MB KV (mean context 128) = 15155.7 MB -> 1516.27 GB/s at the decode rate
OUT
EOF
mkdir -p "$bundle/bench" "$bundle/data/qwen/Qwen3-8B"
echo '{"model_type": "qwen3"}' >"$bundle/data/qwen/Qwen3-8B/config.json"
# The GPU benchmarks (recording the CUDA_LAUNCH_BLOCKING they saw), a CPU benchmark that must
# not run, and the random-folder writer (FAKE_WRITE_SLEEP: seconds before it writes).
cat >"$bundle/bench/kiln_bench_train_step" <<'EOF'
#!/usr/bin/env bash
[ -z "${FAKE_WRITE_UNTIL:-}" ] || touch "$FAKE_WRITE_UNTIL"
echo "{\"tok_per_s\": 2000.0, \"batch\": 4, \"seq\": 256, \"mfu\": 0.2, \"peak_bytes\": 100, \"clb\": \"${CUDA_LAUNCH_BLOCKING:-unset}\"}"
EOF
cat >"$bundle/bench/kiln_bench_attention" <<'EOF'
#!/usr/bin/env bash
for t in 1024 4096; do for impl in kiln cudnn; do
  echo "{\"bench\": \"attention\", \"T\": $t, \"B\": 8, \"H\": 16, \"impl\": \"$impl\", \"fwd_tflops\": 100.0, \"bwd_tflops\": 90.0, \"fwd_bwd_tflops\": 95.0, \"clb\": \"${CUDA_LAUNCH_BLOCKING:-unset}\"}"
done; done
EOF
cat >"$bundle/bench/kiln_bench_gemv_cuda" <<'EOF'
#!/usr/bin/env bash
echo "{\"bench\": \"gemv_cuda\", \"kernel\": \"bf16\", \"gbs\": 3000.0, \"clb\": \"${CUDA_LAUNCH_BLOCKING:-unset}\"}"
EOF
printf '#!/usr/bin/env bash\necho "a CPU benchmark: must not run"\n' >"$bundle/bench/kiln_bench_gemm"
cat >"$bundle/bench/kiln_write_random_safetensors" <<'EOF'
#!/usr/bin/env bash
out=""
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
[ "$out" = smoke_folder ] || sleep "${FAKE_WRITE_SLEEP:-0}"  # only the 8B folder takes minutes
# FAKE_WRITE_UNTIL: the 8B writer also waits for this file, which the fake training bench makes,
# so it is still writing when the bench starts however slowly the steps before it run (a fixed
# sleep raced with them on a loaded machine). 120 s at most, then the check that needs it fails.
if [ "$out" != smoke_folder ] && [ -n "${FAKE_WRITE_UNTIL:-}" ]; then
  for _ in $(seq 600); do [ -e "$FAKE_WRITE_UNTIL" ] && break; sleep 0.2; done
fi
mkdir "$out" && echo '{}' >"$out/config.json" && echo x >"$out/model-00001-of-00001.safetensors"
EOF
# Python for the peers (PyTorch training step, HF decode); anything else goes to python3.
cat >"$tmp/bin/fakepy" <<'EOF'
#!/usr/bin/env bash
clb=${CUDA_LAUNCH_BLOCKING:-unset}
case "${1:-}" in
  */torch_train_step_gpu.py) echo "{\"tok_per_s\": 1000.0, \"batch\": 4, \"seq\": 256, \"mfu\": 0.1, \"peak_bytes\": 200, \"clb\": \"$clb\"}" ;;
  */hf_decode_peer.py) echo "{\"copy_gbs\": 4221.0, \"decode_tok_s\": 110.0, \"tok_per_s_with_prefill\": 104.7, \"first_tokens\": [66365, 1210, 5], \"env\": {\"CUDA_LAUNCH_BLOCKING\": \"$clb\"}}" ;;
  *) exec python3 "$@" ;;
esac
EOF
# The serve check: smoke passes; load prints its one JSON line.
cat >"$tmp/bin/fake_serve_check" <<'EOF'
#!/usr/bin/env bash
[ "$1" = load ] && echo '{"bench": "serve_8b", "levels": [{"concurrency": 1, "aggregate_tokens_per_s": 100.0, "ttft_p50_s": 0.05, "errors": 0}], "tok_s_8_over_1": 3.5}'
echo "PASS: fake serve check $1"
EOF
chmod +x "$tmp/bin/fake_serve_check"
# compute-sanitizer: runs the command after its six option words and reports no errors.
printf '#!/usr/bin/env bash\nshift 6\n"$@"\necho "========= ERROR SUMMARY: 0 errors"\n' >"$tmp/bin/compute-sanitizer"
# A fake Nsight Compute: drops its own options (up to the program's path) and runs the program.
printf '#!/usr/bin/env bash\nwhile [ $# -gt 0 ] && [ "${1#/}" = "$1" ]; do shift; done\n"$@"\necho "\\"ID\\",\\"Kernel Name\\""\n' >"$tmp/bin/ncu"
chmod +x "$bundle"/tests/* "$bundle/apps/kiln" "$bundle"/bench/* "$tmp/bin/fakepy" "$tmp/bin/compute-sanitizer" "$tmp/bin/ncu"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in *--query-gpu*) echo "NVIDIA H100 80GB HBM3, 580.00, 81559 MiB, 9.0" ;; *) echo "fake nvidia-smi" ;; esac
EOF
printf '#!/usr/bin/env bash\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver"\nexit 9\n' >"$tmp/nogpu/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi" "$tmp/nogpu/nvidia-smi"
run_check() {  # run_check OUT PATHDIR VAR=value...: gpu_check.sh on the fake bundle
  local o=$1 p=$2
  shift 2
  env PATH="$p:$PATH" KILN_BUNDLE="$bundle" KILN_GPU_CHECK_CUDA_HOMES="" \
    KILN_GPU_SERVE_CHECK="$tmp/bin/fake_serve_check" "$@" \
    "$repo/scripts/gpu_check.sh" "$o" >"$o.out" 2>&1
}
json() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1/results.json"; }
steps_of() { grep -v '^#' | cut -d'|' -f1 | tr '\n' ' '; }  # a plan's step names

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
check "bench: the GPU benchmarks only ($(grep '^bench' <<<"$plan" | steps_of))" \
  [ "$(grep '^bench' <<<"$plan" | steps_of)" = "bench_gpu_vs_torch bench_gemv_cuda " ]
check "bench: both training configs, attention at 1024 and 4096" grep -q \
  '^bench_gpu_vs_torch|bench|[0-9]*|bench|.*CONFIGS=stories15M:256:64,stories42M:1024:16 ATTN_SEQS=1024,4096 ' <<<"$plan"
check "bench: asynchronous launches" grep -q '^bench_gpu_vs_torch|bench|[0-9]*|bench|CUDA_LAUNCH_BLOCKING=0 ' <<<"$plan"
check "bench: never synchronous" bash -c "! grep '^bench' <<<'$plan' | grep -q CUDA_LAUNCH_BLOCKING=1"
check "every planned limit under 8 minutes" bash -c "! grep -v '^#' <<<'$plan' | cut -d'|' -f3 | awk '\$1 > 480' | grep -q ."
plan=$(KILN_BUNDLE=$bundle KILN_GPU_CHECK_DRY_RUN=1 KILN_GPU_CHECK_STAGES=window "$repo/scripts/gpu_check.sh" "$tmp/dry")
check "window: the plan, in order ($(steps_of <<<"$plan"))" [ "$(steps_of <<<"$plan")" = "smoke_probe smoke_runtime \
smoke_train smoke_generate smoke_write_folder smoke_generate_folder smoke_serve kernels.CudaProbe kernels.CudaDevice tensor.CudaProbe tensor.CudaDevice bench_gpu_vs_torch \
bench_gemv_cuda decode_write decode_kiln decode_kiln_cublaslt decode_kiln_generic_attention decode_hf serve_8b decode_quantize decode_kiln_q8_0 decode_ncu memcheck_train_bf16 memcheck_generate " ]
plan_q=$(KILN_BUNDLE=$bundle KILN_GPU_CHECK_DRY_RUN=1 KILN_GPU_CHECK_STAGES=decode KILN_GPU_CHECK_QUANT=q8_0,q4_k_m "$repo/scripts/gpu_check.sh" "$tmp/dry")
check "decode: KILN_GPU_CHECK_QUANT=q8_0,q4_k_m adds Q4_K_M and its A/B ($(steps_of <<<"$plan_q"))" [ "$(grep -E '^decode_(quantize|kiln_q)' <<<"$plan_q" | steps_of)" = \
  "decode_quantize decode_kiln_q8_0 decode_quantize_q4_k_m decode_kiln_q4_k_m decode_kiln_q4_k_m_warp " ]
check "decode: the A/B with one row per warp" grep -q '^decode_kiln_q4_k_m_warp|bench|120|run|CUDA_LAUNCH_BLOCKING=0 KILN_CUDA_QGEMV_ROWS=0|' <<<"$plan_q"
check "window: timing steps asynchronous" \
  [ "$(grep -E '^(bench|decode_kiln|decode_hf|serve_8b|decode_ncu)' <<<"$plan" | cut -d'|' -f5 | grep -c '^CUDA_LAUNCH_BLOCKING=0')" = 9 ]
check "window: Qwen3-8B decode, 64 ids, 128 new, greedy" grep -q \
  '^decode_kiln|bench|.*--model %decode_dir --prompt-ids 1,2,.*,64 --max-new-tokens 128 --temperature 0' <<<"$plan"
check "window: the HF peer on the same folder" grep -q \
  '^decode_hf|bench|.*hf_decode_peer.py --model %decode_dir --prompt-len 64 --new-tokens 128' <<<"$plan"
check "window: the real Qwen3-8B config" grep -q \
  '^decode_write|background|.*--config =bundle/data/qwen/Qwen3-8B/config.json' <<<"$plan"
check "window: every limit under 8 minutes" bash -c "! grep -v '^#' <<<'$plan' | cut -d'|' -f3 | awk '\$1 > 480' | grep -q ."
check "window: the plan names the files back" grep -q \
  '^# files back in OUTDIR: results.json summary.md logs.tar.gz gpu_check.log gpu_bench.json gpu_bench.md decode_8b.json' <<<"$plan"

# ---- no GPU: every stage exits 2, with results, running no step ------------------------------
# (No wall-clock thresholds anywhere here: that nothing ran, or that the deadline cut a step
# which would otherwise have finished, is read from the results, not from the time taken.)
for stage in smoke cuda-tests sanitizer bench window; do
  o=$tmp/nogpu_$stage
  t=$(date +%s)
  run_check "$o" "$tmp/nogpu" KILN_GPU_CHECK_STAGES=$stage
  rc=$?
  secs=$(($(date +%s) - t))
  check "no GPU, $stage: exit 2 ($rc)" [ "$rc" = 2 ]
  check "no GPU, $stage: says so" grep -q "no NVIDIA GPU found" "$o.out"
  # One command for the three files (joined by && outside it, only the first would count).
  check "no GPU, $stage: results" bash -c "[ -s '$o/results.json' ] && [ -s '$o/summary.md' ] && [ -s '$o/logs.tar.gz' ]"
  check "no GPU, $stage: status no_gpu" [ "$(json "$o" 'r["status"]')" = no_gpu ]
  check "no GPU, $stage: no step ran (took $secs s)" [ "$(json "$o" 'len(r["steps"])')" = 0 ]
done

# ---- a passing smoke stage; results after every step; the expected skip ----------------------
o=$tmp/smoke
run_check "$o" "$tmp/bin" KILN_GPU_CHECK_STAGES=smoke
rc=$?
check "smoke: exit 0 ($rc)" [ "$rc" = 0 ]
check "smoke: seven steps recorded" [ "$(json "$o" 'len(r["steps"])')" = 7 ]
check "smoke: the expected skip is not a failure" [ "$(json "$o" 'r["totals"]["expected_skipped"]')" = 2 ]
check "smoke: synchronous launches" grep -q "CUDA_LAUNCH_BLOCKING=1" <(tar -xzOf "$o/logs.tar.gz" logs/smoke_probe.log)
check "smoke: probe in summary.md" grep -q '^- probe: devices 1' "$o/summary.md"
check "smoke: libs.txt in the archive" grep -q '^probe: devices 1' <(tar -xzOf "$o/logs.tar.gz" logs/libs.txt)
check "smoke: nvidia-smi.txt in the archive" grep -q 'fake nvidia-smi' <(tar -xzOf "$o/logs.tar.gz" logs/nvidia-smi.txt)
check "smoke: the step's env recorded" [ "$(json "$o" 'r["steps"]["smoke_train"]["env"]["CUDA_LAUNCH_BLOCKING"]')" = 1 ]
check "smoke: no training outputs in the archive" bash -c "! tar -tzf '$o/logs.tar.gz' | grep -qv '^logs/'"
check "smoke: at most 8 files back" [ "$(find "$o" -type f | wc -l)" -le 8 ]

# ---- the window, end to end on the fakes -------------------------------------------------------
# The writer waits for the training bench to start, so it is still writing then: paused there,
# waited for at decode. CUDA_LAUNCH_BLOCKING=1 in the environment must not reach the timing steps.
o=$tmp/window
run_check "$o" "$tmp/bin" KILN_GPU_CHECK_STAGES=window KILN_PYTHON="$tmp/bin/fakepy" \
  FAKE_WRITE_UNTIL="$tmp/window_bench_started" \
  KILN_GPU_CHECK_DECODE_DIR="$tmp/decode/qwen3_8b" KILN_GPU_CHECK_DECODE_MIN_GB=0 CUDA_LAUNCH_BLOCKING=1
rc=$?
check "window: exit 0 ($rc)" [ "$rc" = 0 ]
check "window: steps in order" [ "$(json "$o" '" ".join(n for n in r["steps"] if not n.startswith(("kernels.", "tensor.")))')" = \
  "smoke_probe smoke_runtime smoke_train smoke_generate smoke_write_folder smoke_generate_folder smoke_serve bench_gpu_vs_torch bench_gemv_cuda decode_write decode_kiln decode_kiln_cublaslt decode_kiln_generic_attention decode_hf serve_8b decode_quantize decode_kiln_q8_0 decode_ncu memcheck_train_bf16 memcheck_generate" ]
check "window: bench and decode asynchronous" [ "$(json "$o" 'sorted(set(r["timing_env"].values()))')" = "['0']" ]
check "window: the benchmarks saw asynchronous launches" [ "$(python3 -c 'import json, sys
print(sorted({x["result"].get("clb") for x in json.load(open(sys.argv[1]))["runs"]}))' "$o/gpu_bench.json")" = "['0']" ]
check "window: no CPU benchmark ran" bash -c "! grep -q 'must not run' '$o/gpu_check.log'"
check "window: memcheck with synchronous launches" [ "$(json "$o" 'r["steps"]["memcheck_generate"]["env"]["CUDA_LAUNCH_BLOCKING"]')" = 1 ]
check "window: the writer paused for the bench" grep -q 'decode_write: paused during bench_gpu_vs_torch' "$o/gpu_check.log"
check "window: decode_8b.json" [ -s "$o/decode_8b.json" ]
d8() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1/decode_8b.json"; }
check "decode: kiln tok/s" [ "$(d8 "$o" 'r["kiln"]["decode_tok_s"]')" = 100.05 ]
check "decode: HF tok/s" [ "$(d8 "$o" 'r["hf"]["decode_tok_s"]')" = 110.0 ]
check "decode: kiln / HF" [ "$(d8 "$o" 'r["ratios"]["decode_tok_s_kiln_over_hf"]')" = 0.91 ]
check "decode: kiln / copy" [ "$(d8 "$o" 'r["ratios"]["kiln_decode_gbs_over_copy"]')" = 0.359 ]
check "decode: the Q8_0 decode parsed" [ "$(d8 "$o" 'r["kiln_q8_0"]["decode_tok_s"]')" = 100.05 ]
check "window: the Q8_0 file quantized from the folder" grep -q "kiln quantize --model $tmp/decode/qwen3_8b --type q8_0 --force --out $tmp/decode/qwen3_8b_q8_0.gguf" <(tar -xzOf "$o/logs.tar.gz" logs/decode_quantize.log)
check "decode: kiln serve at 8 streams over 1" [ "$(d8 "$o" 'r["serve"]["tok_s_8_over_1"]')" = 3.5 ]
check "decode: kiln serve asynchronous" [ "$(json "$o" 'r["steps"]["serve_8b"]["env"]["CUDA_LAUNCH_BLOCKING"]')" = 0 ]
check "decode: first ids compared" [ "$(d8 "$o" 'r["first_tokens_agree"]')" = "2 of 3" ]
check "decode: in results.json and summary.md" [ "$(json "$o" 'r["decode_8b"]["copy_gbs"]')" = 4221.0 ]
check "decode: in summary.md" grep -q '^## Qwen3-8B decode' "$o/summary.md"
check "decode: the folder marked complete" [ -f "$tmp/decode/qwen3_8b/.kiln_gpu_check_complete" ]
check "window: at most 8 files back ($(find "$o" -type f | wc -l))" [ "$(find "$o" -type f | wc -l)" -le 8 ]
# A second call on the same machine reuses the folder.
o=$tmp/window2
run_check "$o" "$tmp/bin" KILN_GPU_CHECK_STAGES=decode KILN_PYTHON="$tmp/bin/fakepy" FAKE_WRITE_SLEEP=60 \
  KILN_GPU_CHECK_DECODE_DIR="$tmp/decode/qwen3_8b" KILN_GPU_CHECK_DECODE_MIN_GB=0
rc=$?
check "decode again: exit 0 ($rc)" [ "$rc" = 0 ]
check "decode again: the folder reused" [ "$(d8 "$o" 'r["folder"]["reused"]')" = True ]
# A writer the deadline cuts: stopped, the decode steps listed as not run, the run incomplete.
o=$tmp/window3
t=$(date +%s)
run_check "$o" "$tmp/bin" KILN_GPU_CHECK_STAGES=decode KILN_PYTHON="$tmp/bin/fakepy" FAKE_WRITE_SLEEP=120 \
  KILN_GPU_CHECK_DECODE_DIR="$tmp/decode/other" KILN_GPU_CHECK_DECODE_MIN_GB=0 KILN_GPU_CHECK_DEADLINE=35
rc=$?
secs=$(($(date +%s) - t))
check "slow writer: exit 4 ($rc)" [ "$rc" = 4 ]
echo "slow writer: the call took $secs s (deadline 35 s; the writer alone sleeps 120 s)"
check "slow writer: decode steps not run" \
  [ "$(json "$o" '" ".join(sorted(set(r["not_run"])))')" = "decode_hf decode_kiln decode_kiln_cublaslt decode_kiln_generic_attention decode_kiln_q8_0 decode_ncu decode_quantize decode_write serve_8b" ]

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
echo "deadline: the call took $secs s (deadline 27 s; the step alone sleeps 60 s)"
check "deadline: status incomplete" [ "$(json "$o" 'r["status"]')" = incomplete ]
check "deadline: the cut step recorded" [ "$(json "$o" 'r["steps"]["smoke_probe"]["result"]')" = deadline ]
check "deadline: later steps listed" [ "$(json "$o" '" ".join(r["not_run"])')" = "smoke_probe smoke_runtime smoke_train smoke_generate smoke_write_folder smoke_generate_folder smoke_serve" ]

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
