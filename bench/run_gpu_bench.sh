#!/usr/bin/env bash
# GPU benchmarks, kiln against PyTorch in one run, quoted as ratios (DESIGN.md, Performance).
#
#   bench/run_gpu_bench.sh [OUTDIR=bench/results] [BINDIR]
#
# BINDIR holds kiln_bench_train_step and kiln_bench_attention (default: the bundle's bench/
# folder, build-gpu/bundle/bench, else build-gpu/bench). Python: $KILN_PYTHON, else python3 on
# PATH (PyTorch 2.x with CUDA).
#
# 1. Training steps, for stories15M (seq 256) and stories42M (seq 1024):
#    - the largest power-of-two batch that fits, found by each peer itself (PyTorch eager, kiln
#      bf16); the comparison runs at the smaller of the two, B, so that memory compares too;
#    - at B: kiln (bf16 weights/activations, f32 masters and moments, --attention auto: cuDNN's
#      fused attention for training's shape), the same kiln step with kiln's own attention
#      kernels (--attention kiln: the measurement behind the default), the same kiln step with
#      each LM head + loss chunking of LOSS_CHUNK_ROWS_AB (--loss-chunk-rows; 0: the (N, V)
#      logits whole before the loss; the measurement behind the default, 4096-row chunks),
#      PyTorch eager and PyTorch torch.compile (bf16 autocast, SDPA flash, fused AdamW).
#    Tokens/s, MFU (6N + 12 L H Dh T per token over the card's bf16 dense peak), peak memory
#    (kiln's tracker allocated peak vs torch.cuda.max_memory_allocated) and the driver's used.
# 2. Attention, causal, bf16, D = 128, T = 1024, 4096, 8192: kiln's kernel vs cuDNN's, forward
#    + backward TFLOP/s (forward 4·B·H·T²·D/2, backward 2.5x that).
# Writes OUTDIR/gpu_<card>_<date>.json (all raw lines, commit, card, date) and
# OUTDIR/gpu_<card>_<date>.md, the summary table with the ratios:
#    tokens/s kiln / torch.compile (and / eager), attention kiln / cuDNN, peak memory kiln / torch.
# A run that fails is recorded with its error and the rest goes on. Exit status: 0 when every
# run produced a result, 1 otherwise, 2 without a GPU.
#
# Environment: WARMUP (3), STEPS (10), CONFIGS ("stories15M:256:256 stories42M:1024:128",
# name:seq:max_batch), ATTN_SEQS ("1024 4096 8192"; both lists split on spaces or commas),
# RUN_TIMEOUT (seconds per run, 420), LOSS_CHUNK_ROWS_AB ("0 2048 8192"), SEARCH (1; 0
# compares at max_batch without searching, for batches known to fit).
# Timings never run with synchronous launches: CUDA_LAUNCH_BLOCKING is set to 0 for every run
# whatever it was (the JSON's "env" records both).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
outdir=${1:-$repo/bench/results}
bindir=${2:-}
if [ -z "$bindir" ]; then
  for d in "$repo/build-gpu/bundle/bench" "$repo/build-gpu/bench"; do
    [ -x "$d/kiln_bench_train_step" ] && { bindir=$d; break; }
  done
fi
py=${KILN_PYTHON:-python3}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-10}
CONFIGS=${CONFIGS:-"stories15M:256:256 stories42M:1024:128"}
LOSS_CHUNK_ROWS_AB=$(echo "${LOSS_CHUNK_ROWS_AB-0 2048 8192}" | tr ',' ' ')
CONFIGS=${CONFIGS//,/ }
ATTN_SEQS=${ATTN_SEQS:-"1024 4096 8192"}
ATTN_SEQS=${ATTN_SEQS//,/ }
RUN_TIMEOUT=${RUN_TIMEOUT:-420}
SEARCH=${SEARCH:-1}

say() { echo "run_gpu_bench: $*" >&2; }
inherited_launch_blocking=${CUDA_LAUNCH_BLOCKING-unset}
if [ "$inherited_launch_blocking" != unset ] && [ "$inherited_launch_blocking" != 0 ]; then
  say "CUDA_LAUNCH_BLOCKING=$inherited_launch_blocking in the environment: set to 0 for the timings"
fi
export CUDA_LAUNCH_BLOCKING=0
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU found"
  exit 2
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/kiln_bench_train_step" ]; then
  say "kiln_bench_train_step not found (give BINDIR, or build with scripts/bundle_gpu.sh)"
  exit 1
fi
mkdir -p "$outdir"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
card_tag=$(echo "$card" | tr -c 'A-Za-z0-9\n' '_' | sed 's/__*/_/g; s/_$//')
stamp=$(date -u +%Y%m%d_%H%M%S)
base="$outdir/gpu_${card_tag}_${stamp}"
lines=$(mktemp)
status=0

# record KIND CMD...: runs CMD with a timeout; its last JSON line (or an error record) goes to
# the lines file tagged with KIND; prints the JSON line.
record() {
  local kind=$1
  shift
  local out err rc line
  out=$(mktemp)
  err=$(mktemp)
  timeout "$RUN_TIMEOUT" "$@" >"$out" 2>"$err"
  rc=$?
  line=$(grep '^{' "$out" | tail -1)
  if [ -z "$line" ]; then
    line=$("$py" -c 'import json,sys; print(json.dumps({"error": sys.argv[1][-2000:], "exit_code": int(sys.argv[2])}))' \
      "$(tail -c 2000 "$err")" "$rc")
    status=1
  fi
  echo "{\"kind\": \"$kind\", \"exit_code\": $rc, \"result\": $line}" >>"$lines"
  [ "$rc" = 0 ] || say "$kind exited with $rc: $(tail -3 "$err" | tr '\n' ' ')"
  echo "$line"
  rm -f "$out" "$err"
}
batch_of() { "$py" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d.get("batch", 0) if "tok_per_s" in d else 0)' "$1"; }

export PYTHONUNBUFFERED=1
for spec in $CONFIGS; do
  IFS=: read -r cfg seq maxb <<<"$spec"
  if [ "$SEARCH" = 0 ]; then
    b=$maxb
    say "$cfg seq $seq: batch $b (no search)"
  else
    say "$cfg seq $seq: batch search (PyTorch eager, kiln)"
    t=$(record "search_torch_eager_$cfg" "$py" "$repo/bench/torch_train_step_gpu.py" --config "$cfg" \
      --seq "$seq" --batch 0 --max-batch "$maxb" --warmup 1 --steps 2)
    k=$(record "search_kiln_$cfg" "$bindir/kiln_bench_train_step" --device cuda --dtype bf16 \
      --preset "$cfg" --seq "$seq" --batch 0 --max-batch "$maxb" --warmup 1 --steps 2)
    bt=$(batch_of "$t")
    bk=$(batch_of "$k")
    b=$bt
    [ "$bk" -gt 0 ] && { [ "$b" = 0 ] || [ "$bk" -lt "$b" ]; } && b=$bk
    [ "$b" -gt 0 ] || { say "$cfg: no batch fits for either peer"; status=1; continue; }
    say "$cfg: max batch PyTorch $bt, kiln $bk; comparing at $b"
  fi
  record "kiln_$cfg" "$bindir/kiln_bench_train_step" --device cuda --dtype bf16 --preset "$cfg" \
    --seq "$seq" --batch "$b" --warmup "$WARMUP" --steps "$STEPS" >/dev/null
  # The same step with kiln's own attention kernels (--attention kiln) against the default
  # (--attention auto: cuDNN for training's shape): the measurement behind the default (issue 19).
  record "kilnown_$cfg" "$bindir/kiln_bench_train_step" --device cuda --dtype bf16 --preset "$cfg" \
    --seq "$seq" --batch "$b" --warmup "$WARMUP" --steps "$STEPS" --attention kiln >/dev/null
  # The same step with other LM head + loss chunks (--loss-chunk-rows R; 0: the logits whole,
  # then the loss) against the default (chunks of 4096 rows, both gradients in forward): the
  # measurement behind the default's speed and memory.
  for rows in $LOSS_CHUNK_ROWS_AB; do
    record "kilnrows${rows}_$cfg" "$bindir/kiln_bench_train_step" --device cuda --dtype bf16 \
      --preset "$cfg" --seq "$seq" --batch "$b" --warmup "$WARMUP" --steps "$STEPS" \
      --loss-chunk-rows "$rows" >/dev/null
  done
  record "torch_eager_$cfg" "$py" "$repo/bench/torch_train_step_gpu.py" --config "$cfg" --seq "$seq" \
    --batch "$b" --warmup "$WARMUP" --steps "$STEPS" >/dev/null
  record "torch_compile_$cfg" "$py" "$repo/bench/torch_train_step_gpu.py" --config "$cfg" \
    --seq "$seq" --batch "$b" --warmup "$WARMUP" --steps "$STEPS" --compile >/dev/null
done

if [ -x "$bindir/kiln_bench_attention" ]; then
  say "attention: kiln vs cuDNN at T = $ATTN_SEQS"
  out=$(mktemp)
  # shellcheck disable=SC2086
  timeout "$RUN_TIMEOUT" "$bindir/kiln_bench_attention" --seq $ATTN_SEQS >"$out" 2>"$out.err"
  rc=$?
  while IFS= read -r l; do
    case "$l" in \{*) echo "{\"kind\": \"attention\", \"exit_code\": $rc, \"result\": $l}" >>"$lines" ;; esac
  done <"$out"
  [ "$rc" = 0 ] || { say "kiln_bench_attention exited with $rc: $(tail -3 "$out.err" | tr '\n' ' ')"; status=1; }
  rm -f "$out" "$out.err"
else
  say "kiln_bench_attention not found in $bindir"
  status=1
fi

commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo "${KILN_BUNDLE_COMMIT:-unknown}")
"$py" - "$lines" "$base" "$card" "$commit" "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)" \
  "$inherited_launch_blocking" "$WARMUP" "$STEPS" "$CONFIGS" "$ATTN_SEQS" "$RUN_TIMEOUT" "$SEARCH" <<'PY'
import datetime, json, sys
lines_path, base, card, commit, driver = sys.argv[1:6]
inherited, warmup, steps, configs, attn_seqs, run_timeout, search = sys.argv[6:13]
runs = [json.loads(l) for l in open(lines_path) if l.strip()]
by_kind = {r["kind"]: r["result"] for r in runs}
res = {"benchmark": "gpu", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "commit": commit, "card": card, "driver": driver,
       "env": {"CUDA_LAUNCH_BLOCKING": "0", "CUDA_LAUNCH_BLOCKING_inherited": inherited,
               "WARMUP": warmup, "STEPS": steps, "CONFIGS": configs, "ATTN_SEQS": attn_seqs,
               "RUN_TIMEOUT": run_timeout, "SEARCH": search},
       "runs": runs, "ratios": {}}

def ok(r):
    return r is not None and "tok_per_s" in r

md = [f"# kiln vs PyTorch on {card}", "",
      f"commit {commit}, {res['date']}, driver {driver}; CUDA_LAUNCH_BLOCKING=0 (inherited: {inherited}), "
      f"warmup {warmup}, steps {steps}" + ("" if search != "0" else ", batches given (no search)"), "",
      "## Training step (bf16; kiln: bf16 weights + f32 masters/moments; PyTorch: fp32 params, bf16 autocast, SDPA, fused AdamW)", "",
      "| config | seq | batch | peer | tok/s | MFU | peak alloc | driver used | kiln / peer tok/s | kiln / peer peak |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
gib = lambda b: f"{b / 2**30:.2f} GiB" if isinstance(b, (int, float)) else "?"
for kind in [r["kind"] for r in runs if r["kind"].startswith("kiln_")]:
    cfg = kind[len("kiln_"):]
    k = by_kind.get(kind)
    for peer in ("torch_compile", "torch_eager"):
        t = by_kind.get(f"{peer}_{cfg}")
        if ok(k) and ok(t):
            res["ratios"][f"{cfg}_tok_per_s_kiln_over_{peer}"] = round(k["tok_per_s"] / t["tok_per_s"], 3)
            res["ratios"][f"{cfg}_peak_bytes_kiln_over_{peer}"] = round(k["peak_bytes"] / t["peak_bytes"], 3)
    kc = by_kind.get(f"kilnown_{cfg}")
    if ok(k) and ok(kc):
        res["ratios"][f"{cfg}_tok_per_s_kiln_auto_attention_over_kiln_attention"] = round(k["tok_per_s"] / kc["tok_per_s"], 3)
    variants = sorted((int(r["kind"][len("kilnrows"):-len(cfg) - 1]), r["result"]) for r in runs
                      if r["kind"].startswith("kilnrows") and r["kind"].endswith("_" + cfg))
    whole = dict(variants).get(0)
    for rows_ab, kv in variants:
        if rows_ab and ok(kv) and ok(whole):
            res["ratios"][f"{cfg}_tok_per_s_kiln_{rows_ab}_row_loss_chunks_over_whole_logits"] = round(kv["tok_per_s"] / whole["tok_per_s"], 3)
    if ok(k) and ok(whole):
        res["ratios"][f"{cfg}_tok_per_s_kiln_over_whole_logits"] = round(k["tok_per_s"] / whole["tok_per_s"], 3)
        res["ratios"][f"{cfg}_peak_bytes_kiln_over_whole_logits"] = round(k["peak_bytes"] / whole["peak_bytes"], 3)
    rows = [("kiln (--attention auto)", k), ("kiln, its own attention kernels", kc),
            *[("kiln, logits whole (--loss-chunk-rows 0)" if r == 0 else f"kiln, loss chunks of {r} rows", kv) for r, kv in variants],
            ("torch.compile", by_kind.get(f"torch_compile_{cfg}")), ("torch eager", by_kind.get(f"torch_eager_{cfg}"))]
    for name, r in rows:
        if not ok(r):
            err = (r or {}).get("error", "no result")
            md.append(f"| {cfg} | | | {name} | failed: {str(err)[:80]} | | | | | |")
            continue
        own = name.startswith("kiln")
        rk = "" if own or not ok(k) else f"{k['tok_per_s'] / r['tok_per_s']:.3f}"
        rm = "" if own or not ok(k) else f"{k['peak_bytes'] / r['peak_bytes']:.3f}"
        md.append(f"| {cfg} | {r['seq']} | {r['batch']} | {name} | {r['tok_per_s']:,.0f} | {100 * r['mfu']:.1f}% | "
                  f"{gib(r['peak_bytes'])} | {gib(r.get('driver_used_bytes'))} | {rk} | {rm} |")
searches = {r["kind"]: r["result"] for r in runs if r["kind"].startswith("search_")}
if searches:
    md += ["", "Largest power-of-two batch that fits: " + ", ".join(
        f"{k[len('search_'):]} {v.get('batch', 'none') if 'tok_per_s' in v else 'none'}" for k, v in searches.items())]

att = [r["result"] for r in runs if r["kind"] == "attention" and r["result"].get("bench") == "attention"]
if att:
    md += ["", "## Attention (causal, bf16, D = 128; forward 4·B·H·T²·D/2 FLOPs, backward 2.5x)", "",
           "| T | B x H | impl | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s | kiln / cuDNN |", "| --- | --- | --- | --- | --- | --- | --- |"]
    by = {(a["T"], a["impl"]): a for a in att}
    for a in att:
        if "error" in a:
            md.append(f"| {a['T']} | {a['B']} x {a['H']} | {a['impl']} | failed: {a['error'][:80]} | | | |")
            continue
        other = by.get((a["T"], "cudnn"))
        ratio = ""
        if a["impl"] == "kiln" and other and "fwd_bwd_tflops" in other:
            ratio = f"{a['fwd_bwd_tflops'] / other['fwd_bwd_tflops']:.3f}"
            res["ratios"][f"attention_T{a['T']}_kiln_over_cudnn"] = round(a["fwd_bwd_tflops"] / other["fwd_bwd_tflops"], 3)
        md.append(f"| {a['T']} | {a['B']} x {a['H']} | {a['impl']} | {a['fwd_tflops']:.1f} | {a['bwd_tflops']:.1f} | {a['fwd_bwd_tflops']:.1f} | {ratio} |")
if res["ratios"]:
    md += ["", "## Ratios", "", *[f"- {k}: {v}" for k, v in res["ratios"].items()]]
failed = [(r["kind"], r["result"].get("error", "")) for r in runs if "error" in r["result"]]
if failed:
    md += ["", "## Failed runs", "",
           *[f"- {k}: {' '.join(str(e).split())[-300:]}" for k, e in failed]]
json.dump(res, open(base + ".json", "w"), indent=2)
open(base + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
print(f"\nwrote {base}.json and {base}.md")
PY
rm -f "$lines"
exit $status
