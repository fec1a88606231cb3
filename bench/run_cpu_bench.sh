#!/usr/bin/env bash
# CPU training-step benchmark, kiln against PyTorch in one run, quoted as a tokens/s ratio.
#
#   bench/run_cpu_bench.sh [THREADS=2]
#
# Builds kiln_bench_train_step if needed (in $BUILD_DIR, default build-bench next to the repo's
# build/), then runs bench/torch_train_step.py and the kiln bench one after the other with the
# same thread count, batch, sequence and step counts, prints both JSON lines and kiln/torch, and
# writes bench/results/cpu_train_step_<date>.json (format: bench/results/README.md).
#
# Environment: PRESET (stories15M), BATCH (8), SEQ (256), WARMUP (2), STEPS (5),
# PAIRS (1: torch+kiln pairs, run alternately; the ratio quoted is the median of the pairs'),
# BUILD_DIR, OMP_WAIT_POLICY (passed to both peers unchanged).
set -euo pipefail

THREADS="${1:-2}"
PRESET="${PRESET:-stories15M}"
BATCH="${BATCH:-8}"
SEQ="${SEQ:-256}"
WARMUP="${WARMUP:-2}"
STEPS="${STEPS:-5}"
PAIRS="${PAIRS:-1}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
PY=/usr/bin/python3

BIN="$BUILD_DIR/bench/kiln_bench_train_step"
if [[ ! -d "$BUILD_DIR" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -DKILN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
LOG="$(mktemp)"
if ! cmake --build "$BUILD_DIR" --target kiln_bench_train_step -j"$(nproc)" >"$LOG" 2>&1; then
  cat "$LOG" >&2
  exit 1
fi
rm -f "$LOG"

common=(--threads "$THREADS" --batch "$BATCH" --seq "$SEQ" --warmup "$WARMUP" --steps "$STEPS")
torch_lines=()
kiln_lines=()
for ((i = 0; i < PAIRS; i++)); do
  t=$("$PY" "$ROOT/bench/torch_train_step.py" --config "$PRESET" "${common[@]}" | tail -n 1)
  k=$("$BIN" --preset "$PRESET" "${common[@]}" | tail -n 1)
  echo "$t"
  echo "$k"
  torch_lines+=("$t")
  kiln_lines+=("$k")
done

mkdir -p "$ROOT/bench/results"
OUT="$ROOT/bench/results/cpu_train_step_$(date +%Y%m%d_%H%M%S).json"
COMMIT="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
CPU="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
NCPU="$(nproc)"

"$PY" - "$OUT" "$COMMIT" "$DIRTY" "$CPU" "$NCPU" "$THREADS" \
  "$(printf '%s\n' "${torch_lines[@]}")" "$(printf '%s\n' "${kiln_lines[@]}")" <<'EOF'
import json, statistics, sys, datetime
out, commit, dirty, cpu, ncpu, threads, tl, kl = sys.argv[1:9]
torch_runs = [json.loads(l) for l in tl.splitlines() if l.strip()]
kiln_runs = [json.loads(l) for l in kl.splitlines() if l.strip()]
ratios = [k["tok_per_s"] / t["tok_per_s"] for t, k in zip(torch_runs, kiln_runs)]
ratio = statistics.median(ratios)
res = {
    "benchmark": "cpu_train_step",
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "commit": commit,
    "dirty_tracked_files": int(dirty),
    "cpu": cpu,
    "nproc": int(ncpu),
    "threads": int(threads),
    "torch": torch_runs[-1] if len(torch_runs) == 1 else torch_runs,
    "kiln": kiln_runs[-1] if len(kiln_runs) == 1 else kiln_runs,
    "pair_ratios": [round(r, 3) for r in ratios],
    "ratio_kiln_over_torch": round(ratio, 3),
}
with open(out, "w") as f:
    json.dump(res, f, indent=2)
    f.write("\n")
print(f"kiln/torch tokens/s ratio: {ratio:.3f}  (pairs: {', '.join(f'{r:.3f}' for r in ratios)})")
print(f"wrote {out}")
EOF
