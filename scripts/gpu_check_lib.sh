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

# The correctness stages run with synchronous launches, so a fault is reported by the kernel that
# caused it. Timing steps (KIND bench) never do: they run with GPU_CHECK_TIMING_ENV, and
# gpu_check.sh refuses to start one whose CUDA_LAUNCH_BLOCKING is anything but 0 or unset.
# shellcheck disable=SC2034  # read by name (${!b}) in gpu_check_plan
GPU_CHECK_BASE_ENV="CUDA_LAUNCH_BLOCKING=1"
# shellcheck disable=SC2034
GPU_CHECK_TIMING_ENV="CUDA_LAUNCH_BLOCKING=0"
# Stages in the order they run. memcheck-apps is the sanitizer stage's kiln train/generate
# memcheck alone (dropped when sanitizer itself is selected). profile (Nsight Compute over
# training steps) is in neither the window nor all: name it.
GPU_CHECK_STAGES_ORDER="smoke cuda-tests sanitizer bench profile decode memcheck-apps"
GPU_CHECK_STAGES_ALL="smoke cuda-tests sanitizer bench decode"
# The one-command window (docs/gpu_window.md), most important first: if the deadline cuts it,
# what was cut is the least important.
GPU_CHECK_STAGES_WINDOW="smoke cuda-tests bench decode memcheck-apps"
# Expected seconds of each stage on an H200 (first run, 2026-11-26; decode and its peer are
# estimates), for the dry run's plan: the limits bound a hang, these what a good run takes.
# shellcheck disable=SC2034  # read by gpu_check.sh's dry run
declare -A GPU_CHECK_EXPECTED_S=([setup]=10 [smoke]=5 [cuda-tests]=30 [sanitizer]=100 [bench]=110
  [profile]=60 [decode]=190 [memcheck-apps]=15)

# gpu_check_stages "LIST": the stages named in LIST (spaces or commas), in the order above;
# "all" means GPU_CHECK_STAGES_ALL, "window" GPU_CHECK_STAGES_WINDOW. Fails (status 64, message
# on stderr) for an unknown name.
gpu_check_stages() {
  local list=${1//,/ } s k known out="" expanded=""
  for s in $list; do
    case "$s" in
      all) expanded="$expanded $GPU_CHECK_STAGES_ALL" ;;
      window) expanded="$expanded $GPU_CHECK_STAGES_WINDOW" ;;
      *)
        known=0
        for k in $GPU_CHECK_STAGES_ORDER; do [ "$s" = "$k" ] && known=1; done
        if [ "$known" = 0 ]; then
          echo "gpu_check: unknown stage '$s' (stages: $GPU_CHECK_STAGES_ORDER, all, window)" >&2
          return 64
        fi
        expanded="$expanded $s"
        ;;
    esac
  done
  for k in $GPU_CHECK_STAGES_ORDER; do
    for s in $expanded; do [ "$s" = "$k" ] && { out="$out $k"; break; }; done
  done
  case " $out " in *" sanitizer "*) out=${out/ memcheck-apps/} ;; esac
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

# gpu_check_launch_blocking "ENV": the CUDA_LAUNCH_BLOCKING a step with ENV (VAR=value words)
# runs with: its own, else the one this shell passes on, else "unset".
gpu_check_launch_blocking() {
  local - w v=${CUDA_LAUNCH_BLOCKING-unset}
  set -f
  for w in $1; do
    case "$w" in CUDA_LAUNCH_BLOCKING=*) v=${w#CUDA_LAUNCH_BLOCKING=} ;; esac
  done
  echo "$v"
}

# gpu_check_timing_env_ok VALUE: whether a timing step may run with CUDA_LAUNCH_BLOCKING=VALUE
# (0, empty or unset: asynchronous launches).
gpu_check_timing_env_ok() {
  case "$1" in 0 | "" | unset) return 0 ;; esac
  return 1
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
# lines). Words gpu_check.sh resolves when it runs a step: @kiln (the bundle's kiln), %memcheck
# and %racecheck (compute-sanitizer with that tool), %python ($KILN_PYTHON), %decode_q8_0 and
# %decode_q4_k_m (the GGUFs quantized from the random folder, beside it), %serve_check
# ($KILN_GPU_SERVE_CHECK, else scripts/gpu_serve_check.sh), %decode_dir (the
# random Qwen3-8B folder), ^PATH (this checkout), =bundle/PATH, =work/PATH (a folder it creates).
gpu_check_plan() {
  local b=GPU_CHECK_BASE_ENV tb=GPU_CHECK_TIMING_ENV
  local e=${!b} te=${!tb}
  case "$1" in
    smoke)
      echo "smoke_probe|gtest|60|tests|$e|./test_kernels --gtest_filter=CudaProbe.*"
      echo "smoke_runtime|gtest|120|tests|$e|./test_kernels --gtest_filter=CudaErrors.*:CudaDevices.*:CudaDevice.*:CudaRuntime.*"
      echo "smoke_train|cmd|120|run|$e|@kiln train --device cuda --data t.txt --steps 2 --batch 2 --seq 16 --eval-interval 2 --eval-batches 1 --progress 0 --log-interval 1 --out train_smoke --overwrite"
      echo "smoke_generate|cmd|120|run|$e|@kiln generate --device cuda --dtype bf16 --random-weights --config config.json --prompt-ids 1,2,3,4,5 --max-new-tokens 4 --temperature 0"
      # A Hugging Face folder on the GPU: built on meta, each weight materialized on the device.
      echo "smoke_write_folder|cmd|60|run|$e|=bundle/bench/kiln_write_random_safetensors --config config_qwen_vocab.json --out smoke_folder --dtype bf16"
      echo "smoke_generate_folder|cmd|120|run|$e|@kiln generate --device cuda --dtype bf16 --model smoke_folder --prompt-ids 1,2,3,4,5 --max-new-tokens 4 --temperature 0"
      # kiln serve on the GPU: a tiny random Qwen3 over loopback HTTP (scripts/gpu_serve_check.sh).
      echo "smoke_serve|cmd|120|run|$e|%serve_check smoke @kiln"
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
      gpu_check_plan memcheck-apps
      echo "memcheck_generate_cudnn|sanitizer|240|run|$e $m|%memcheck @kiln generate --device cuda --dtype bf16 --attention cudnn --random-weights --config config.json --prompt-ids 1,2,3,4,5 --max-new-tokens 4 --temperature 0"
      # racecheck: kiln's flash attention (shared memory, cp.async, ldmatrix), a few shapes.
      echo "racecheck_attention_decode|sanitizer|180|tests|$e|%racecheck ./test_tensor --gtest_filter=CudaAttentionGpu.KvCacheViewsWithOffset"
      echo "racecheck_attention_train|sanitizer|240|tests|$e|%racecheck ./test_tensor --gtest_filter=CudaAttentionGpu.FlashAndGenericAgreeAndDkDvAreDeterministic"
      ;;
    memcheck-apps)
      # kiln train and generate (kiln's attention) under memcheck, one cudaMalloc per tensor.
      local m="KILN_NO_CACHING=1 KILN_GUARD_BYTES=64"
      echo "memcheck_train_bf16|sanitizer|240|run|$e $m|%memcheck @kiln train --device cuda --dtype bf16 --data t.txt --steps 2 --batch 2 --seq 16 --eval-interval 2 --eval-batches 1 --progress 0 --log-interval 1 --out train_memcheck --overwrite"
      echo "memcheck_generate|sanitizer|180|run|$e $m|%memcheck @kiln generate --device cuda --dtype bf16 --random-weights --config config.json --prompt-ids 1,2,3,4,5 --max-new-tokens 4 --temperature 0"
      ;;
    bench)
      # The GPU benchmarks only, kiln against PyTorch in the same call (bench/run_gpu_bench.sh):
      # training steps of stories15M (seq 256, batch 64) and stories42M (seq 1024, batch 16)
      # against PyTorch eager and torch.compile, attention against cuDNN at T = 1024 and 4096.
      # The batches are the ones that fit on an H100/H200 (the first H200 run's search), so no
      # search (SEARCH=0). Never with synchronous launches.
      echo "bench_gpu_vs_torch|bench|300|bench|$te CONFIGS=stories15M:256:64,stories42M:1024:16 ATTN_SEQS=1024,4096 SEARCH=0 RUN_TIMEOUT=120 WARMUP=3 STEPS=10|^bench/run_gpu_bench.sh =work/bench_gpu =bundle/bench"
      # Decode's GEMVs alone on Qwen3-8B's weights, per format (bf16, Q8_0, Q4_K with R rows and
      # with one row per warp, Q6_K), against the device-to-device copy rate in the same
      # process: JSON lines in the step's log.
      echo "bench_gemv_cuda|bench|120|run|$te|=bundle/bench/kiln_bench_gemv_cuda --config =bundle/data/qwen/Qwen3-8B/config.json --reps 10"
      ;;
    profile)
      # Where a training step's time goes, kernel by kernel: Nsight Compute over 600 launches of
      # steady-state bf16 steps (after 16 steps), the bench's batches, time and
      # DRAM bytes per kernel (CSV in the step's log). Not a timing step: ncu serializes kernels.
      local c
      for c in stories15M:256:64 stories42M:1024:16; do
        IFS=: read -r p t b <<<"$c"
        echo "profile_train_$p|cmd|150|run|$te|%ncu --clock-control none --launch-skip 3000 --launch-count 600 --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page details =bundle/bench/kiln_bench_train_step --device cuda --dtype bf16 --preset $p --seq $t --batch $b --warmup 20 --steps 4"
      done
      ;;
    decode)
      # Qwen3-8B decode (bf16, 64 prompt ids, 128 new tokens, greedy) from a random-weight
      # folder with the real config: kiln, then Hugging Face transformers' static-cache decode
      # of the same folder and PyTorch's device-to-device copy rate (the roofline) in one
      # process. decode_write (KIND background, 16.4 GB, CPU and disk only) starts in the
      # background as soon as the GPU is found, is paused during every timing step, and is
      # waited for here; gpu_check.sh reuses a complete folder from an earlier call.
      local ids
      ids=$(seq -s, 1 64)
      echo "decode_write|background|420|run||nice -n 10 =bundle/bench/kiln_write_random_safetensors --config =bundle/data/qwen/Qwen3-8B/config.json --out %decode_dir --dtype bf16"
      echo "decode_kiln|bench|120|run|$te|@kiln generate --device cuda --dtype bf16 --model %decode_dir --prompt-ids $ids --max-new-tokens 128 --temperature 0"
      # The same with cuBLASLt for every product (kiln's GEMV off): the GEMV's own A/B.
      echo "decode_kiln_cublaslt|bench|120|run|$te KILN_CUDA_GEMV=0|@kiln generate --device cuda --dtype bf16 --model %decode_dir --prompt-ids $ids --max-new-tokens 128 --temperature 0"
      # The same with the generic attention kernel for decode (the decode kernel off): its A/B.
      echo "decode_kiln_generic_attention|bench|120|run|$te KILN_CUDA_DECODE_ATTENTION=0|@kiln generate --device cuda --dtype bf16 --model %decode_dir --prompt-ids $ids --max-new-tokens 128 --temperature 0"
      echo "decode_hf|bench|240|run|$te PYTHONUNBUFFERED=1|%python ^bench/hf_decode_peer.py --model %decode_dir --prompt-len 64 --new-tokens 128 --copy-gib 2 --copies 10"
      # kiln serve on the same folder: throughput at 1, 8 and 32 streams (continuous batching
      # over the paged KV pool), 64-token prompts, 64 new tokens each.
      echo "serve_8b|bench|180|run|$te PYTHONUNBUFFERED=1|%serve_check load @kiln %decode_dir"
      # The same model quantized by kiln quantize (CPU) into each format of
      # $KILN_GPU_CHECK_QUANT (comma-separated: q8_0, q4_k_m; default q8_0, as Q4_K_M's quantize
      # takes 158 s of the window), decoded on the GPU through the quantized GEMVs (the blocks
      # read in place): tok/s against bf16's above.
      local quant=",${KILN_GPU_CHECK_QUANT-q8_0},"
      if [[ "$quant" == *,q8_0,* ]]; then
        echo "decode_quantize|cmd|240|run||nice -n 10 @kiln quantize --model %decode_dir --type q8_0 --force --out %decode_q8_0"
        echo "decode_kiln_q8_0|bench|120|run|$te|@kiln generate --device cuda --dtype bf16 --model %decode_q8_0 --prompt-ids $ids --max-new-tokens 128 --temperature 0"
      fi
      if [[ "$quant" == *,q4_k_m,* ]]; then
        # Q4_K, with Q6_K for the LM head and some value and down projections (llama.cpp's
        # choice): 4.7 GB a token; then again with one row per warp in the Q4_K GEMV (its A/B).
        echo "decode_quantize_q4_k_m|cmd|240|run||nice -n 10 @kiln quantize --model %decode_dir --type q4_k_m --force --out %decode_q4_k_m"
        echo "decode_kiln_q4_k_m|bench|120|run|$te|@kiln generate --device cuda --dtype bf16 --model %decode_q4_k_m --prompt-ids $ids --max-new-tokens 128 --temperature 0"
        echo "decode_kiln_q4_k_m_warp|bench|120|run|$te KILN_CUDA_QGEMV_ROWS=0|@kiln generate --device cuda --dtype bf16 --model %decode_q4_k_m --prompt-ids $ids --max-new-tokens 128 --temperature 0"
      fi
      # Where a decode token's time goes, kernel by kernel (the lever list of the next change):
      # Nsight Compute over 400 launches inside the decode (after the prefill's), time and DRAM
      # bytes read per kernel (CSV, a row per kernel and metric: the raw page carries every device
      # attribute and overflows the log kept), in the step's log. --cache-control none: by default
      # ncu flushes the caches before each kernel, so a small kernel's inputs (the attention split
      # partials, a norm's row) came from DRAM instead of L2 (7.4 us for combine_splits, 2026-11-27).
      echo "decode_ncu|cmd|150|run|$te|%ncu --clock-control none --cache-control none --launch-skip 3000 --launch-count 400 --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page details @kiln generate --device cuda --dtype bf16 --model %decode_dir --prompt-ids $ids --max-new-tokens 8 --temperature 0"
      ;;
  esac
}
