# shellcheck shell=bash
# Functions of scripts/gpu_check.sh that need no GPU, sourced by it and by its test
# (tests/scripts/test_gpu_check.sh): stage selection, the deadline, and the plan of each stage.
#
# A plan is a list of steps, one line each, fields separated by '|':
#   NAME|KIND|LIMIT|DIR|ENV|COMMAND
# NAME: [A-Za-z0-9_.-]+ (its log is logs/NAME.log); KIND: gtest (writes gtest XML), sanitizer
# (a compute-sanitizer log), cmd (exit status only), bench; LIMIT: the step's own time limit in
# seconds (the deadline may cut it shorter); DIR: where it runs, relative to the bundle; ENV:
# space-separated VAR=value pairs for this step; COMMAND: the command line, words separated by
# spaces (no quoting needed: plans use no spaces inside arguments).

# Every stage runs with synchronous launches, so a fault is reported by the kernel that caused it.
GPU_CHECK_BASE_ENV="CUDA_LAUNCH_BLOCKING=1"
GPU_CHECK_STAGES_ALL="smoke cuda-tests sanitizer bench"

# gpu_check_stages "LIST": the stages named in LIST (spaces or commas), in the order above;
# "all" means every stage. Fails (status 64, message on stderr) for an unknown name.
gpu_check_stages() {
  local list=${1//,/ } s known out=""
  for s in $list; do
    if [ "$s" = all ]; then
      echo "$GPU_CHECK_STAGES_ALL"
      return 0
    fi
    known=0
    for k in $GPU_CHECK_STAGES_ALL; do [ "$s" = "$k" ] && known=1; done
    if [ "$known" = 0 ]; then
      echo "gpu_check: unknown stage '$s' (stages: $GPU_CHECK_STAGES_ALL, all)" >&2
      return 64
    fi
  done
  for k in $GPU_CHECK_STAGES_ALL; do
    for s in $list; do [ "$s" = "$k" ] && { out="$out $k"; break; }; done
  done
  echo "${out# }"
}

# gpu_check_step_limit LIMIT NOW DEADLINE: the seconds a step may run, LIMIT cut to what is left
# before DEADLINE less a 10 s margin (for writing the results); 0 when fewer than 15 s are left,
# which means: do not start it.
gpu_check_step_limit() {
  local limit=$1 now=$2 deadline=$3
  local left=$((deadline - now - 10))
  if [ "$left" -lt 15 ]; then
    echo 0
  elif [ "$limit" -gt "$left" ]; then
    echo "$left"
  else
    echo "$limit"
  fi
}

# gpu_check_cuda_suites: the CUDA tests among `--gtest_list_tests` output (stdin), as lines
# "NAME FILTER", one process each: every suite whose name names CUDA, cuDNN, a GPU or the backend
# comparison ("CudaMatmul CudaMatmul.*:*/CudaMatmul.*"), except the host-only suites that CI runs
# (*Host, *Plan, *Fragments, *Replay); then, in one more process ("named ..."), the tests of
# other suites whose own name does (Cli.TrainGenerateBudgetOnCuda, MultiTensorAdamW.CudaMatchesCpu).
gpu_check_cuda_suites() {
  awk '
    /^[^ ]/ { suite = $1; sub(/\.$/, "", suite); sub(/^.*\//, "", suite); next }
    /^  / {
      test = $1; sub(/\/.*$/, "", test)
      if (suite ~ /[Cc]uda|CUDA|[Cc]udnn|[Gg]pu|GPU|BackendOps|DeviceMemory/ &&
          suite !~ /(Host|Plan|Fragments|Replay)$/) {
        if (!(suite in seen)) { seen[suite] = 1; order[++n] = suite }
      } else if (test ~ /[Cc]uda|[Gg]pu/) {
        key = suite "." test
        if (!(key in named_seen)) { named_seen[key] = 1; named = named (named ? ":" : "") key }
      }
    }
    END {
      for (i = 1; i <= n; i++) print order[i], order[i] ".*:*/" order[i] ".*"
      if (named) print "named", named
    }'
}

# gpu_check_plan STAGE: the steps of STAGE (format above). Needs: $bundle_exes (the bundle's
# executables, relative paths), and for cuda-tests $suites_<binary> (gpu_check_cuda_suites'
# lines).
gpu_check_plan() {
  local b=GPU_CHECK_BASE_ENV
  local e=${!b}
  case "$1" in
    smoke)
      echo "smoke_probe|gtest|60|tests|$e|./test_kernels --gtest_filter=CudaProbe.*"
      echo "smoke_runtime|gtest|120|tests|$e|./test_kernels --gtest_filter=CudaErrors.*:CudaDevices.*:CudaDevice.*:CudaRuntime.*"
      echo "smoke_train|cmd|120|run|$e|@kiln train --device cuda --data t.txt --steps 2 --batch 2 --seq 16 --eval-interval 2 --eval-batches 1 --progress 0 --log-interval 1 --out train_smoke --overwrite"
      echo "smoke_generate|cmd|120|run|$e|@kiln generate --device cuda --dtype bf16 --random-weights --config config.json --prompt-ids 1,2,3,4,5 --max-new-tokens 4 --temperature 0"
      ;;
    cuda-tests)
      local rel bin var suite
      for rel in $bundle_exes; do
        case "$rel" in tests/test_*) ;; *) continue ;; esac
        bin=${rel#tests/}
        var="suites_${bin}"
        while read -r suite filter; do
          [ -n "$suite" ] && echo "${bin#test_}.${suite}|gtest|120|tests|$e|./$bin --gtest_filter=$filter"
        done <<<"${!var:-}"
      done
      ;;
    sanitizer)
      # memcheck. The deliberate failures are left out: the 4x-the-card cudaMalloc (memcheck
      # reports the refused call) and the guard-byte overrun. The allocator's own tests keep
      # caching (they check segment sizes); everything else runs with KILN_NO_CACHING=1, one
      # cudaMalloc per tensor, so memcheck sees each tensor's bounds, and 64 guard bytes.
      local m="KILN_NO_CACHING=1 KILN_GUARD_BYTES=64"
      echo "memcheck_runtime|sanitizer|180|tests|$e|%memcheck ./test_kernels --gtest_filter=CudaDevices.*:CudaDevice.*-CudaDevice.OutOfMemoryIsAClearErrorAndNotSticky"
      echo "memcheck_allocator|sanitizer|180|tests|$e|%memcheck ./test_tensor --gtest_filter=CudaCachingAllocator.*:DeviceMemoryRows.*-CudaCachingAllocator.GuardBytesCatchADeviceOverrun"
      echo "memcheck_backend_ops|sanitizer|300|tests|$e $m|%memcheck ./test_tensor --gtest_filter=*BackendOpsCuda*"
      echo "memcheck_train_bf16|sanitizer|240|run|$e $m|%memcheck @kiln train --device cuda --dtype bf16 --data t.txt --steps 2 --batch 2 --seq 16 --eval-interval 2 --eval-batches 1 --progress 0 --log-interval 1 --out train_memcheck --overwrite"
      echo "memcheck_generate|sanitizer|180|run|$e $m|%memcheck @kiln generate --device cuda --dtype bf16 --random-weights --config config.json --prompt-ids 1,2,3,4,5 --max-new-tokens 4 --temperature 0"
      echo "memcheck_generate_cudnn|sanitizer|240|run|$e $m|%memcheck @kiln generate --device cuda --dtype bf16 --attention cudnn --random-weights --config config.json --prompt-ids 1,2,3,4,5 --max-new-tokens 4 --temperature 0"
      # racecheck: kiln's flash attention (shared memory, cp.async, ldmatrix), a few shapes.
      echo "racecheck_attention_decode|sanitizer|180|tests|$e|%racecheck ./test_tensor --gtest_filter=CudaAttentionGpu.KvCacheViewsWithOffset"
      echo "racecheck_attention_train|sanitizer|240|tests|$e|%racecheck ./test_tensor --gtest_filter=CudaAttentionGpu.FlashAndGenericAgreeAndDkDvAreDeterministic"
      ;;
    bench)
      local rel
      for rel in $bundle_exes; do
        case "$rel" in bench/*) ;; *) continue ;; esac
        case "$(basename "$rel")" in
          kiln_bench_train_step | kiln_bench_attention) ;;  # driven by run_gpu_bench.sh below
          *) echo "bench_$(basename "$rel")|bench|120|bench|$e|./$(basename "$rel") --benchmark_min_time=0.2s" ;;
        esac
      done
      # kiln vs PyTorch, one configuration each: stories15M at seq 256, attention at T = 1024.
      echo "bench_gpu_vs_torch|bench|420|bench|$e CONFIGS=stories15M:256:64 ATTN_SEQS=1024 RUN_TIMEOUT=120 WARMUP=2 STEPS=5|^bench/run_gpu_bench.sh =work/bench_gpu =bundle/bench"
      ;;
  esac
}
