#!/usr/bin/env bash
# CPU GEMM rates in one run: oneDNN bf16 (kiln's bf16 path), oneDNN f32 and OpenBLAS sgemm (kiln's
# f32 libraries) on stories15M's training shapes, at every ISA level this CPU has from avx2 up, plus
# oneDNN's own bf16 emulation on plain AVX-512. Then, at the detected level, what matmul.h's f32
# library rule rests on: both f32 libraries on a training step's three kinds of product
# (forward, input gradient, weight gradient: A^T with beta 1) for shakespeare-char and stories15M,
# and whole f32 training steps with every product on OpenBLAS (KILN_F32_GEMM=openblas) against
# the rule (auto), in interleaved pairs. Writes bench/results/cpu_gemm_<date>.txt (commit, CPU
# model, date, load average before and after; format: bench/results/README.md).
#
#   bench/run_gemm_bench.sh [THREADS=2]
#
# Environment: BUILD_DIR (default build-bench), ROUNDS (5), MIN_SECONDS (0.3), SHAPES (--shape
# MxNxK arguments replacing the default shapes, e.g. "--shape 512x1024x3072"), LEVELS (the ISA
# levels to run, default "avx2 avx512 avx512bf16 amx", stopping at the detected one),
# STEP_PAIRS (6; 0 skips the whole-step pairs).
set -euo pipefail

THREADS="${1:-2}"
ROUNDS="${ROUNDS:-5}"
MIN_SECONDS="${MIN_SECONDS:-0.3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
BIN="$BUILD_DIR/bench/kiln_bench_gemm"
source "$ROOT/bench/build_targets.sh"
bench_build_targets "$ROOT" "$BUILD_DIR" kiln_bench_gemm kiln_bench_train_step

mkdir -p "$ROOT/bench/results"
OUT="$ROOT/bench/results/cpu_gemm_$(date -u +%Y%m%d_%H%M%S).txt"
detected="$("$BIN" --shape 1x1x1 --only bf16 --rounds 1 --min-seconds 0 | sed -n 's/.*isa \([a-z0-9]*\).*/\1/p')"
read -r -a levels <<<"${LEVELS:-avx2 avx512 avx512bf16 amx}"
{
  echo "# kiln_bench_gemm, $(date -u +%FT%TZ), commit $(git -C "$ROOT" rev-parse --short HEAD)" \
    "($(git -C "$ROOT" status --porcelain --untracked-files=no | wc -l) tracked files differ)"
  echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) online, threads $THREADS"
  echo "# TFLOP/s = 2*M*N*K / best time; C (M,N) = A (M,K) @ B, B stored (N,K) as a Linear weight"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) (other work on these cores lowers every column alike)"
  for level in "${levels[@]}"; do
    echo
    echo "## KILN_CPU_ISA=$level"
    KILN_CPU_ISA=$level OMP_NUM_THREADS="$THREADS" "$BIN" --rounds "$ROUNDS" \
      --min-seconds "$MIN_SECONDS" ${SHAPES:-}
    [[ "$level" == "$detected" ]] && break
  done
  if [[ -z "${LEVELS:-}" && ( "$detected" == avx512* || "$detected" == amx ) ]]; then
    echo
    echo "## KILN_CPU_ISA=avx512 --path onednn (oneDNN's own bf16 emulation, which kiln does not use)"
    KILN_CPU_ISA=avx512 OMP_NUM_THREADS="$THREADS" "$BIN" --rounds "$ROUNDS" \
      --min-seconds "$MIN_SECONDS" --path onednn --only bf16 ${SHAPES:-}
  fi
  echo
  echo "## f32 libraries at $detected, by kind of product (matmul.h's rule: oneDNN for op(A) = A"
  echo "## with M >= 16 and K <= 4096, at avx2 only; OpenBLAS for the rest)"
  # shakespeare-char (dim 192, hidden 512) and stories15M (dim 288, hidden 768, vocab 32000).
  fwd="--shape 2048x192x192 --shape 2048x512x192 --shape 2048x192x512 --shape 2048x288x288"
  fwd+=" --shape 2048x768x288 --shape 2048x288x768 --shape 2048x32000x288"
  dx="--shape 2048x192x192 --shape 2048x192x512 --shape 2048x512x192 --shape 2048x288x768"
  dx+=" --shape 2048x768x288 --shape 2048x288x32000"
  dw="--shape t:192x192x2048 --shape t:512x192x2048 --shape t:192x512x2048"
  dw+=" --shape t:768x288x2048 --shape t:288x768x2048 --shape t:32000x288x2048"
  echo "### forward, y = x W^T (B stored (N, K))"
  # shellcheck disable=SC2086  # the shape lists are words
  OMP_NUM_THREADS="$THREADS" "$BIN" --rounds "$ROUNDS" --min-seconds "$MIN_SECONDS" $fwd
  echo "### input gradient, dx = dy W (B stored (K, N))"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS="$THREADS" "$BIN" --rounds "$ROUNDS" --min-seconds "$MIN_SECONDS" --no-trans-b $dx
  echo "### weight gradient, dW += dy^T x (A stored (K, M), beta 1)"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS="$THREADS" "$BIN" --rounds "$ROUNDS" --min-seconds "$MIN_SECONDS" --no-trans-b \
    --beta 1 $dw
  pairs=${STEP_PAIRS:-6}
  if [[ "$pairs" -gt 0 ]]; then
    echo
    echo "## whole f32 training steps: tok/s with KILN_F32_GEMM=openblas, then auto (the rule),"
    echo "## $pairs interleaved pairs (shakespeare-char 30 steps, stories15M 10, after 3 warm-up steps)"
    for preset in "shakespeare-char 16 128 30" "stories15M 8 256 10"; do
      read -r name batch seq steps <<<"$preset"
      line="$name b$batch x $seq:"
      for _ in $(seq "$pairs"); do
        for lib in openblas auto; do
          tps=$(KILN_F32_GEMM=$lib OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive \
            "$BUILD_DIR/bench/kiln_bench_train_step" --preset "$name" --device cpu --dtype f32 \
            --batch "$batch" --seq "$seq" --warmup 3 --steps "$steps" 2>/dev/null |
            grep -o '"tok_per_s":[0-9.]*' | head -1 | cut -d: -f2)
          line+=" $lib=${tps:-failed}"
        done
      done
      echo "$line"
    done
  fi
  echo
  echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
echo "wrote $OUT" >&2
