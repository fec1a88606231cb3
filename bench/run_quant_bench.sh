#!/usr/bin/env bash
# Quantized decode and prefill on the CPU: Q8_0 and Q4_K_M weights run by the int8 GEMV
# (ops::linear_quant) against the Q8_0 file dequantized to bf16 (--dequantize), in one run on
# the same machine.
#
#   bench/run_quant_bench.sh [THREADS=2]
#
# Writes a random-weight Qwen3-0.6B (../shared/data/qwen/Qwen3-0.6B/config.json) as Q8_0 and
# Q4_K_M GGUF files with `kiln quantize --random-weights`, then runs `kiln generate` PAIRS times
# over the kinds in alternation: q8_0 and q4_k_m (the Linear weights and the tied embedding / LM
# head stay quantized) and bf16 (the q8_0 file, every weight dequantized at load). Each decodes
# NEW tokens after a PROMPT-token prefill. Prints prefill and decode tokens/s of each, the best of
# each kind, and each kind over bf16; writes bench/results/cpu_quant_decode_<date>.json with the
# commit, the CPU model and ISA, and the date.
#
# With LLAMA_BENCH=path/to/llama-bench (llama.cpp built from the llama-cpp-python sdist), the
# weights come from a random bf16 folder (kiln_write_random_safetensors) with Qwen's vocab.json
# and merges.txt beside them, so the files carry a tokenizer as llama.cpp needs, and llama-bench
# runs on the same two files inside each pair, right after kiln's runs, one repetition each, same
# threads: pp PROMPT for prefill, and tg NEW at depth PROMPT (-d) for decode, so that both decode
# with the same context. Both sides report the best of PAIRS. The JSON adds its figures (each
# run's too) and kiln over llama.cpp per kind.
#
# With LLAMA_CPP_SRC=path/to/llama.cpp (the sdist's vendor/llama.cpp: convert_hf_to_gguf.py and
# gguf-py) and CONVERT_PYTHON=a python with PyTorch 2.x and transformers, llama.cpp's own tools
# make both files instead of kiln quantize: convert_hf_to_gguf.py --outtype q8_0, and
# --outtype bf16 then llama-quantize (LLAMA_QUANTIZE, default beside LLAMA_BENCH) Q4_K_M. kiln
# and llama.cpp then run exactly the files a llama.cpp user has.
#
# Environment: PAIRS (3), PROMPT (128), NEW (32), BUILD_DIR (build), WORK_DIR (mktemp -d),
# LLAMA_BENCH, LLAMA_CPP_SRC, CONVERT_PYTHON, LLAMA_QUANTIZE (unset).
set -euo pipefail

THREADS="${1:-2}"
PAIRS="${PAIRS:-3}"
PROMPT="${PROMPT:-128}"
NEW="${NEW:-32}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
WORK_DIR="${WORK_DIR:-$(mktemp -d)}"
KILN="$BUILD_DIR/apps/kiln"
NCPU="$(nproc --all)"
export OMP_NUM_THREADS="$THREADS"
trap 'rm -rf "$WORK_DIR"' EXIT

[ -x "$KILN" ] || { echo "[bench] build kiln first: $KILN is missing" >&2; exit 1; }
QWEN="$ROOT/../shared/data/qwen"
if [ -n "${LLAMA_BENCH:-}" ]; then
  "$BUILD_DIR/bench/kiln_write_random_safetensors" --config "$QWEN/Qwen3-0.6B/config.json" \
    --out "$WORK_DIR/hf"
  cp "$QWEN/vocab.json" "$QWEN/merges.txt" "$WORK_DIR/hf/"
  SRC=(--model "$WORK_DIR/hf")
else
  SRC=(--random-weights --config "$QWEN/Qwen3-0.6B/config.json")
fi
MADE_BY="kiln quantize"
if [ -n "${LLAMA_CPP_SRC:-}" ]; then
  [ -n "${LLAMA_BENCH:-}" ] || { echo "[bench] LLAMA_CPP_SRC needs LLAMA_BENCH" >&2; exit 1; }
  LLAMA_QUANTIZE="${LLAMA_QUANTIZE:-$(dirname "$LLAMA_BENCH")/llama-quantize}"
  convert() {
    PYTHONPATH="$LLAMA_CPP_SRC/gguf-py" "${CONVERT_PYTHON:-python3}" \
      "$LLAMA_CPP_SRC/convert_hf_to_gguf.py" "$WORK_DIR/hf" --outtype "$1" --outfile "$2" \
      2>&1 | grep -a -E "successfully|Error|error" || true
    [ -s "$2" ] || { echo "[bench] convert_hf_to_gguf.py --outtype $1 wrote nothing" >&2; exit 1; }
  }
  convert q8_0 "$WORK_DIR/qwen3-0.6b-q8_0.gguf"
  convert bf16 "$WORK_DIR/qwen3-0.6b-bf16.gguf"
  "$LLAMA_QUANTIZE" "$WORK_DIR/qwen3-0.6b-bf16.gguf" "$WORK_DIR/qwen3-0.6b-q4_k_m.gguf" Q4_K_M \
    "$THREADS" >/dev/null 2>&1 || { echo "[bench] llama-quantize failed" >&2; exit 1; }
  rm -f "$WORK_DIR/qwen3-0.6b-bf16.gguf"
  MADE_BY="llama.cpp convert_hf_to_gguf.py (q8_0) and llama-quantize (q4_k_m)"
else
  for t in q8_0 q4_k_m; do
    "$KILN" quantize "${SRC[@]}" --type "$t" --out "$WORK_DIR/qwen3-0.6b-$t.gguf"
  done
fi

LOG="$WORK_DIR/runs.txt"
LLAMA_LOG="$WORK_DIR/llama.txt"
: >"$LOG"
: >"$LLAMA_LOG"
# llama-bench runs inside each pair, right after kiln's runs of that pair, one repetition per test:
# a drift of this shared machine then reaches both sides alike (run after all of kiln's pairs, one
# run measured llama.cpp's Q4_K_M decode at 21.1 tok/s and the next day's at 36-38).
for _ in $(seq 1 "$PAIRS"); do
  for kind in q8_0 q4_k_m bf16; do
    extra=()
    gguf="$WORK_DIR/qwen3-0.6b-$kind.gguf"
    [ "$kind" = bf16 ] && extra=(--dequantize) && gguf="$WORK_DIR/qwen3-0.6b-q8_0.gguf"
    out="$("$KILN" generate --model "$gguf" "${extra[@]}" --dtype bf16 \
      --prompt-ids "$(seq -s, 1 "$PROMPT")" --max-new-tokens "$NEW" --temperature 0 2>&1 >/dev/null)"
    pre="$(grep -a -E '^prefill ' <<<"$out" | awk '{print $2}')"
    dec="$(grep -a -E '^decode ' <<<"$out" | awk '{print $2}')"
    echo "$kind $pre $dec" | tee -a "$LOG"
  done
  if [ -n "${LLAMA_BENCH:-}" ]; then
    for t in q8_0 q4_k_m; do
      "$LLAMA_BENCH" -m "$WORK_DIR/qwen3-0.6b-$t.gguf" -t "$THREADS" -p "$PROMPT" -n 0 \
        -r 1 -o csv 2>/dev/null | sed "s/^/$t,/" >>"$LLAMA_LOG"
      "$LLAMA_BENCH" -m "$WORK_DIR/qwen3-0.6b-$t.gguf" -t "$THREADS" -p 0 -n "$NEW" -d "$PROMPT" \
        -r 1 -o csv 2>/dev/null | sed "s/^/$t,/" >>"$LLAMA_LOG"
      echo "llama.cpp $t $(tail -3 "$LLAMA_LOG" | grep -v build_commit | awk -F, '{printf "%s ", $(NF-1)}')"
    done
  fi
done

mkdir -p "$ROOT/bench/results"
RESULT="$ROOT/bench/results/cpu_quant_decode_$(date +%Y%m%d_%H%M%S).json"
PYTHONPATH="$ROOT/bench" /usr/bin/python3 - "$LOG" "$RESULT" "$THREADS" "$PROMPT" "$NEW" "$NCPU" \
  "$ROOT" "$KILN" "$LLAMA_LOG" "$MADE_BY" <<'PY'
import json, subprocess, sys, datetime
import llama_bench_csv
log, result, threads, prompt, new, ncpu, root, kiln, llama_log, made_by = sys.argv[1:]
runs = [l.split() for l in open(log) if l.strip()]
best = {}
for kind, pre, dec in runs:
    b = best.setdefault(kind, {"prefill_tok_per_s": 0.0, "decode_tok_per_s": 0.0})
    b["prefill_tok_per_s"] = max(b["prefill_tok_per_s"], float(pre))
    b["decode_tok_per_s"] = max(b["decode_tok_per_s"], float(dec))
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines() if l.startswith("Model name")), "unknown")
isa = subprocess.run([kiln, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = len(subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.splitlines())
out = {"benchmark": "cpu_quant_decode", "date": datetime.datetime.now().isoformat(timespec="seconds"),
       "commit": commit, "dirty_tracked_files": dirty, "cpu": cpu, "cpu_isa": isa, "nproc": int(ncpu),
       "threads": int(threads), "model": "Qwen3-0.6B random weights", "files_made_by": made_by,
       "prompt_tokens": int(prompt),
       "new_tokens": int(new), "best": best,
       "ratios": {f"{p}_{k}_over_bf16": best[k][f"{p}_tok_per_s"] / best["bf16"][f"{p}_tok_per_s"]
                  for k in ("q8_0", "q4_k_m") for p in ("decode", "prefill")},
       "runs": [{"kind": k, "prefill_tok_per_s": float(p), "decode_tok_per_s": float(d)} for k, p, d in runs]}
# llama-bench's CSV rows, each line prefixed with the kind (bench/llama_bench_csv.py).
rows = llama_bench_csv.read_rows(llama_log, with_kind=True)
if rows:
    # One repetition per pair: the best of the pairs, as kiln's figure is; each run kept.
    llama = {}
    for kind, b in llama_bench_csv.best(rows).items():
        llama[kind] = {f"{t}_tok_per_s": b[t] for t in ("prefill", "decode") if t in b}
        if "decode_depth" in b:
            llama[kind]["decode_depth"] = b["decode_depth"]
        llama[kind]["build"] = b["build"]
    llama_runs = [{"kind": r["kind"], "test": r["test"] + "_tok_per_s", "tok_per_s": r["tok_per_s"]}
                  for r in rows]
    out["llama_cpp"] = llama
    out["llama_cpp_runs"] = llama_runs
    for k in llama:
        for p in ("decode", "prefill"):
            out["ratios"][f"{p}_{k}_kiln_over_llama_cpp"] = best[k][f"{p}_tok_per_s"] / llama[k][f"{p}_tok_per_s"]
json.dump(out, open(result, "w"), indent=1)
print(json.dumps(out["best"]), json.dumps(out.get("llama_cpp", {})), json.dumps(out["ratios"], indent=1))
print("wrote", result)
PY
