#!/usr/bin/env bash
# CPU GEMM rates in one run: oneDNN bf16 (kiln's bf16 path), oneDNN f32 and OpenBLAS sgemm (kiln's
# f32 path) on stories15M's training shapes, at every ISA level this CPU has from avx2 up, plus
# oneDNN's own bf16 emulation on plain AVX-512. Writes bench/results/cpu_gemm_<date>.txt
# (commit, CPU model, date, load average before and after; format: bench/results/README.md).
#
#   bench/run_gemm_bench.sh [THREADS=2]
#
# Environment: BUILD_DIR (default build-bench), ROUNDS (5), MIN_SECONDS (0.3), SHAPES (--shape
# MxNxK arguments replacing the default shapes, e.g. "--shape 512x1024x3072"), LEVELS (the ISA
# levels to run, default "avx2 avx512 avx512bf16 amx", stopping at the detected one).
set -euo pipefail

THREADS="${1:-2}"
ROUNDS="${ROUNDS:-5}"
MIN_SECONDS="${MIN_SECONDS:-0.3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
BIN="$BUILD_DIR/bench/kiln_bench_gemm"
source "$ROOT/bench/build_targets.sh"
bench_build_targets "$ROOT" "$BUILD_DIR" kiln_bench_gemm

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
  echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
echo "wrote $OUT" >&2
