#!/usr/bin/env bash
# CPU training-step benchmark: kiln (f32 and bf16) against PyTorch 2.x from PyPI (fp32 eager,
# fp32 + torch.compile, bf16 autocast eager, bf16 autocast + torch.compile), all in one run,
# quoted as tokens/s ratios.
#
#   bench/run_cpu_bench.sh [THREADS=2]
#
# PyTorch 2.x comes from PyPI into a venv this script creates ($VENV, default bench/.venv, git-
# ignored). The wheel pulls several GB of CUDA wheels; only this benchmark installs it, never
# scripts/setup.sh or the tests. Set VENV to reuse one made elsewhere.
#
# Builds kiln_bench_train_step if needed (in $BUILD_DIR, default build-bench next to the repo's
# build/), then runs each peer mode and each kiln dtype one after the other with the same thread
# count, batch, sequence and step counts, PAIRS rounds in alternation. Writes
# bench/results/cpu_train_step_<date>.json (format: bench/results/README.md) and prints
#   kiln bf16 / best torch mode, kiln bf16 / kiln f32, kiln f32 / torch fp32.
#
# Environment: PRESET (stories15M), BATCH (8), SEQ (256), WARMUP (2), STEPS (5), PAIRS (1; the
# ratios quoted are medians over rounds), TORCH_MODES ("fp32 fp32-compile bf16 bf16-compile"),
# KILN_DTYPES ("f32 bf16"), PEER_TIMEOUT (seconds one peer run may take, 900: on a CPU without
# AVX512-BF16, torch's bf16 autocast emulates every matmul and one eager run takes many minutes;
# a run that fails or times out is recorded as {"failed": true, "exit_code", "timed_out"} and
# left out of the ratios),
# TORCH_VERSION (2.15.0), VENV, BUILD_DIR, OMP_WAIT_POLICY (passed to both peers).
set -euo pipefail

THREADS="${1:-2}"
PRESET="${PRESET:-stories15M}"
BATCH="${BATCH:-8}"
SEQ="${SEQ:-256}"
WARMUP="${WARMUP:-2}"
STEPS="${STEPS:-5}"
PAIRS="${PAIRS:-1}"
TORCH_MODES="${TORCH_MODES:-fp32 fp32-compile bf16 bf16-compile}"
PEER_TIMEOUT="${PEER_TIMEOUT:-900}"
KILN_DTYPES="${KILN_DTYPES:-f32 bf16}"
TORCH_VERSION="${TORCH_VERSION:-2.15.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
VENV="${VENV:-$ROOT/bench/.venv}"

if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "bench: creating $VENV with torch==$TORCH_VERSION from PyPI (several GB, once)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy
fi
PY="$VENV/bin/python"

BIN="$BUILD_DIR/bench/kiln_bench_train_step"
source "$ROOT/bench/build_targets.sh"
bench_build_targets "$ROOT" "$BUILD_DIR" kiln_bench_train_step

common=(--threads "$THREADS" --batch "$BATCH" --seq "$SEQ" --warmup "$WARMUP" --steps "$STEPS")
LINES="$(mktemp)"
trap 'rm -f "$LINES"' EXIT
for ((i = 0; i < PAIRS; i++)); do
  for m in $TORCH_MODES; do
    rc=0
    out="$(timeout "$PEER_TIMEOUT" "$PY" "$ROOT/bench/torch_train_step.py" --config "$PRESET" \
      --mode "$m" "${common[@]}" 2>/dev/null)" || rc=$?
    line="$(tail -n 1 <<<"$out")"
    if [[ "$rc" != 0 || "$line" != "{"* ]]; then
      line="{\"peer\": \"pytorch\", \"mode\": \"$m\", \"failed\": true, \"exit_code\": $rc, \"timed_out\": $([[ $rc == 124 ]] && echo true || echo false), \"timeout_s\": $PEER_TIMEOUT}"
    fi
    echo "$line" | tee -a "$LINES"
  done
  for d in $KILN_DTYPES; do
    "$BIN" --preset "$PRESET" --dtype "$d" "${common[@]}" | tail -n 1 | tee -a "$LINES"
  done
done

mkdir -p "$ROOT/bench/results"
OUT="$ROOT/bench/results/cpu_train_step_$(date +%Y%m%d_%H%M%S).json"
COMMIT="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
CPU="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"

python3 - "$OUT" "$COMMIT" "$DIRTY" "$CPU" "$(nproc)" "$THREADS" "$PAIRS" "$LINES" <<'PYEOF'
import collections, json, statistics, sys, datetime
out, commit, dirty, cpu, ncpu, threads, pairs, lines = sys.argv[1:9]
runs = [json.loads(l) for l in open(lines) if l.strip().startswith("{")]
by = collections.defaultdict(list)  # "torch fp32", "kiln bf16", ... -> tok/s per round
params = collections.defaultdict(set)  # the same keys -> parameter counts seen
for r in runs:
    if r.get("failed"):
        continue
    key = f"torch {r['mode']}" if r["peer"] == "pytorch" else f"kiln {r['dtype']}"
    by[key].append(r["tok_per_s"])
    params[key].add(r.get("params"))
med = {k: statistics.median(v) for k, v in by.items()}
# A ratio compares the same model only: every run of every peer must report one parameter count.
same_model = len(set().union(*params.values())) == 1
params = {k: sorted(v, key=str) if len(v) > 1 else next(iter(v)) for k, v in params.items()}
if not same_model:
    print(f"[run_cpu_bench] the peers trained different models (parameters: {params}); "
          "no ratio is reported", file=sys.stderr)
torch_modes = {k: v for k, v in med.items() if k.startswith("torch")}
ratios = {}
if torch_modes and same_model:
    best = max(torch_modes, key=torch_modes.get)
    for d in ("bf16", "f32"):
        if f"kiln {d}" in med:
            ratios[f"kiln {d} / {best} (best torch mode)"] = med[f"kiln {d}"] / torch_modes[best]
if "kiln bf16" in med and "kiln f32" in med:
    ratios["kiln bf16 / kiln f32"] = med["kiln bf16"] / med["kiln f32"]
if same_model and "kiln f32" in med and "torch fp32" in med:
    ratios["kiln f32 / torch fp32"] = med["kiln f32"] / med["torch fp32"]
res = {
    "benchmark": "cpu_train_step",
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "commit": commit, "dirty_tracked_files": int(dirty), "cpu": cpu, "nproc": int(ncpu),
    "threads": int(threads), "rounds": int(pairs),
    "params": params, "same_model": same_model,
    "median_tok_per_s": {k: round(v, 1) for k, v in med.items()},
    "ratios": {k: round(v, 3) for k, v in ratios.items()},
    "runs": runs,
}
with open(out, "w") as f:
    json.dump(res, f, indent=2)
    f.write("\n")
for k, v in sorted(med.items()):
    print(f"{k:20s} {v:10.1f} tok/s")
for k, v in ratios.items():
    print(f"{k}: {v:.3f}")
print(f"wrote {out}")
sys.exit(0 if same_model else 1)
PYEOF
