#!/usr/bin/env bash
# CPU decode and prefill benchmark, bf16 against f32 and the read bandwidth in one run.
#
#   bench/run_decode_bench.sh [THREADS=2]
#
# 1. Writes a random-weight bf16 Qwen3-0.6B folder (kiln_write_random_safetensors, from
#    ../shared/data/qwen/Qwen3-0.6B/config.json) and runs `kiln generate --bandwidth` on it
#    in f32 (weights converted on load) and in bf16 (weights used in place from the mapping):
#    prefill tokens/s for PROMPT tokens, decode tokens/s for NEW tokens, GB/s of weights and KV
#    read per second, the fraction of the read bandwidth measured in the same process, load
#    time and peak RSS.
#    With it, kiln_bench_gemm's oneDNN bf16 rate on the layer's five GEMM shapes with PROMPT rows
#    (q, k/v, o, gate/up, down), FLOP-weighted, and prefill_fraction_of_onednn: the best bf16
#    prefill's rate in FLOP/s over it. The prefill's work per token: 2 x the layers' matmul
#    parameters (the LM head runs for the last token only: not counted) + the causal attention
#    4 x layers x Hq x head_dim x (PROMPT + 1) / 2 (a query sees (PROMPT + 1) / 2 keys on
#    average); 0.94 GFLOP for Qwen3-0.6B at 512 tokens.
# 2. kiln_bench_gemv: the decode step's GEMVs alone, bf16 against f32 (OpenBLAS) and the read
#    bandwidth, measured round-robin.
# 3. With MODEL8B=1: the same for Qwen3-8B in bf16 (a 16.4 GB folder written under WORK_DIR,
#    read once to warm the page cache, deleted afterwards; needs about 20 GB of free disk).
#    A prompt of PROMPT8B <= 16 tokens keeps prefill on the GEMV too (no f32 weight copies).
# 4. With LLAMA_BENCH=path/to/llama-bench and LLAMA_CPP_SRC=path/to/llama.cpp (both from the
#    llama-cpp-python sdist: its vendor/llama.cpp, built; convert_hf_to_gguf.py and gguf-py) and
#    CONVERT_PYTHON (a python with PyTorch 2.x and transformers): the same random 0.6B folder
#    (with Qwen's vocab.json and merges.txt beside it) converted by llama.cpp's own
#    convert_hf_to_gguf.py --outtype bf16, then llama-bench on it with the same threads, inside
#    each pair right after kiln's runs, one repetition each: pp PROMPT for prefill, and tg NEW at
#    depth PROMPT (-d) for decode, so that both decode with the context kiln's run has. Both sides
#    report the best of PAIRS. The JSON adds llama_cpp_bf16 (each run too) and kiln over it.
# Prints each figure and writes bench/results/cpu_decode_<date>.json (commit, CPU model, date).
#
# Environment: PAIRS (2: f32+bf16 pairs, run alternately; the ratios use each dtype's best run,
# since other work on the cores slows single runs by up to 10x), PROMPT (128), NEW (32),
# PROMPT8B (16), NEW8B (8), MODEL8B (0), LLAMA_BENCH, LLAMA_CPP_SRC, CONVERT_PYTHON (python3),
# WORK_DIR (mktemp -d), BUILD_DIR
# (build-bench next to the repo's build/), OMP_WAIT_POLICY (passed on unchanged).
set -euo pipefail

THREADS="${1:-2}"
PROMPT="${PROMPT:-128}"
NEW="${NEW:-32}"
NEW8B="${NEW8B:-8}"
PROMPT8B="${PROMPT8B:-16}"
MODEL8B="${MODEL8B:-0}"
PAIRS="${PAIRS:-2}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
QWEN="$ROOT/../shared/data/qwen"
WORK_DIR="${WORK_DIR:-$(mktemp -d)}"
PY=/usr/bin/python3
NCPU="$(nproc --all)"  # before OMP_NUM_THREADS is set: nproc honours it
LOADAVG="$(cut -d' ' -f1 /proc/loadavg)"
export OMP_NUM_THREADS="$THREADS"

source "$ROOT/bench/build_targets.sh"
bench_build_targets "$ROOT" "$BUILD_DIR" kiln kiln_bench_gemv kiln_bench_gemm \
  kiln_write_random_safetensors
KILN="$BUILD_DIR/apps/kiln"
cleanup() { rm -rf "$WORK_DIR/qwen3-0.6b" "$WORK_DIR/qwen3-8b"; }
trap cleanup EXIT

# One `kiln generate` run: prints one JSON line of its figures.
run_generate() {  # label model dtype new prompt_tokens
  local err
  err="$(mktemp)"
  /usr/bin/time -v "$KILN" generate --model "$2" --dtype "$3" --prompt-ids "$(seq -s, 1 "$5")" \
    --max-new-tokens "$4" --temperature 0 --bandwidth >/dev/null 2>"$err"
  "$PY" - "$1" "$3" "$err" <<'EOF'
import json, re, sys
label, dtype, path = sys.argv[1:4]
t = open(path).read()
def num(pattern):
    m = re.search(pattern, t)
    return float(m.group(1).replace(",", "")) if m else None
print(json.dumps({
    "run": label, "dtype": dtype,
    "load_s": num(r"loaded .* in ([0-9.]+) s"),
    "prefill_tok_s": num(r"prefill\s+([0-9.]+) tokens/s"),
    "decode_tok_s": num(r"decode\s+([0-9.]+) tokens/s"),
    "bytes_per_token_mb": num(r"= ([0-9.]+) MB ->"),
    "decode_gbs": num(r"-> ([0-9.]+) GB/s at the decode rate"),
    "read_gbs": num(r"read ([0-9.]+) GB/s;"),
    "fraction_of_read": (num(r"decode reaches ([0-9.]+)% of read") or 0) / 100,
    "mapped_weights": (re.search(r"weights \(mapped\)\s+(\S+ \S+)", t) or [None, None])[1],
    "peak_rss_gb": (num(r"Maximum resident set size \(kbytes\): ([0-9]+)") or 0) / 1e6,
}))
EOF
  rm -f "$err"
}

if [[ -n "${LLAMA_BENCH:-}" && -z "${LLAMA_CPP_SRC:-}" ]]; then
  echo "[bench] LLAMA_BENCH needs LLAMA_CPP_SRC (convert_hf_to_gguf.py writes the bf16 file)" >&2
  exit 1
fi
lines=()
"$BUILD_DIR/bench/kiln_write_random_safetensors" --config "$QWEN/Qwen3-0.6B/config.json" \
  --out "$WORK_DIR/qwen3-0.6b" --dtype bf16 2>/dev/null
# llama.cpp on the same weights: its converter's bf16 GGUF, made before the pairs, so that
# llama-bench runs inside each pair, right after kiln's runs, one repetition per test: a drift of
# this shared machine then reaches both sides alike. Both sides report the best of PAIRS.
LLAMA_LOG="$WORK_DIR/llama.csv"
: >"$LLAMA_LOG"
gguf="$WORK_DIR/qwen3-0.6b-bf16.gguf"
if [[ -n "${LLAMA_BENCH:-}" ]]; then
  cp "$QWEN/vocab.json" "$QWEN/merges.txt" "$WORK_DIR/qwen3-0.6b/"
  PYTHONPATH="$LLAMA_CPP_SRC/gguf-py" "${CONVERT_PYTHON:-python3}" \
    "$LLAMA_CPP_SRC/convert_hf_to_gguf.py" "$WORK_DIR/qwen3-0.6b" --outtype bf16 --outfile "$gguf" \
    >"$WORK_DIR/convert.log" 2>&1 || true
  [[ -s "$gguf" ]] || { tail -n 5 "$WORK_DIR/convert.log" >&2; echo "[bench] convert failed" >&2; exit 1; }
fi
for ((i = 0; i < PAIRS; i++)); do
  for dt in f32 bf16; do
    l="$(run_generate qwen3-0.6b "$WORK_DIR/qwen3-0.6b" "$dt" "$NEW" "$PROMPT")"
    echo "$l"
    lines+=("$l")
  done
  if [[ -n "${LLAMA_BENCH:-}" ]]; then
    "$LLAMA_BENCH" -m "$gguf" -t "$THREADS" -p "$PROMPT" -n 0 -r 1 -o csv 2>/dev/null |
      tee -a "$LLAMA_LOG"
    "$LLAMA_BENCH" -m "$gguf" -t "$THREADS" -p 0 -n "$NEW" -d "$PROMPT" -r 1 -o csv \
      2>/dev/null | tee -a "$LLAMA_LOG"
  fi
done
rm -f "$gguf"
# The prefill's GEMM shapes (--shape PROMPTxNxK each), how many of each a layer runs, and the
# work per prefill token: "shapes|counts|flop_per_token".
prefill_work="$("$PY" - "$QWEN/Qwen3-0.6B/config.json" "$PROMPT" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); P = int(sys.argv[2])
H, I, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
hq, hkv = c["num_attention_heads"], c["num_key_value_heads"]
D = c.get("head_dim") or H // hq
shapes = [(hq * D, H, 1), (hkv * D, H, 2), (H, hq * D, 1), (I, H, 2), (H, I, 1)]  # N, K, count
params = L * sum(n * k * cnt for n, k, cnt in shapes)
flop_token = 2 * params + 4 * L * hq * D * (P + 1) / 2
print(" ".join(f"--shape {P}x{n}x{k}" for n, k, _ in shapes) + "|" +
      ",".join(str(cnt) for _, _, cnt in shapes) + f"|{flop_token}")
EOF
)"
IFS='|' read -r gemm_shapes gemm_counts flop_token <<<"$prefill_work"
# shellcheck disable=SC2086  # the --shape options split on purpose
gemm="$("$BUILD_DIR/bench/kiln_bench_gemm" --only bf16 $gemm_shapes | tr '\n' ';')"
echo "$gemm" | tr ';' '\n'
g="$("$BUILD_DIR/bench/kiln_bench_gemv" --config "$QWEN/Qwen3-0.6B/config.json" --reps 5 | tr '\n' ' ')"
echo "$g"
rm -rf "$WORK_DIR/qwen3-0.6b"

if [[ "$MODEL8B" == 1 ]]; then
  free_gb=$(df -BG --output=avail "$WORK_DIR" | tail -n 1 | tr -dc 0-9)
  if ((free_gb < 20)); then
    echo "MODEL8B: only ${free_gb} GB free under $WORK_DIR; skipped" >&2
  else
    "$BUILD_DIR/bench/kiln_write_random_safetensors" --config "$QWEN/Qwen3-8B/config.json" \
      --out "$WORK_DIR/qwen3-8b" --dtype bf16 2>/dev/null
    cat "$WORK_DIR"/qwen3-8b/*.safetensors >/dev/null  # a warm page cache, as the target says
    l="$(run_generate qwen3-8b "$WORK_DIR/qwen3-8b" bf16 "$NEW8B" "$PROMPT8B")"
    echo "$l"
    lines+=("$l")
    rm -rf "$WORK_DIR/qwen3-8b"
  fi
fi

mkdir -p "$ROOT/bench/results"
OUT="$ROOT/bench/results/cpu_decode_$(date +%Y%m%d_%H%M%S).json"
COMMIT="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
CPU="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
PYTHONPATH="$ROOT/bench" "$PY" - "$OUT" "$COMMIT" "$DIRTY" "$CPU" "$NCPU" "$THREADS" "$PROMPT" \
  "$NEW" "$g" \
  "$(printf '%s\n' "${lines[@]}")" "$LOADAVG" "$gemm" "$gemm_counts" "$flop_token" "$LLAMA_LOG" \
  "$("$KILN" --version | sed -n 's/^cpu isa: //p')" \
  <<'EOF'
import datetime, json, math, sys
import llama_bench_csv
out, commit, dirty, cpu, ncpu, threads, prompt, new, gemv, runs, loadavg = sys.argv[1:12]
gemm, gemm_counts, flop_token = sys.argv[12], sys.argv[13], float(sys.argv[14])
llama_log, cpu_isa = sys.argv[15], sys.argv[16]
runs = [json.loads(l) for l in runs.splitlines() if l.strip()]
gemv = [json.loads(l) for l in gemv.replace("} {", "}\n{").splitlines() if l.strip()]
def best(dtype, key):
    v = [r[key] for r in runs if r["run"] == "qwen3-0.6b" and r["dtype"] == dtype and r[key]]
    return max(v) if v else None
res = {
    "bench": "cpu_decode", "date": datetime.datetime.utcnow().isoformat() + "Z",
    "commit": commit, "dirty_files": int(dirty), "cpu": cpu, "cpu_isa": cpu_isa,
    "nproc": int(ncpu),
    "threads": int(threads), "loadavg_1m": float(loadavg), "prompt_tokens": int(prompt),
    "new_tokens": int(new),
    "runs": runs, "gemv": gemv,
}
for key, name in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
    f, b = best("f32", key), best("bf16", key)
    res[f"best_f32_{key}"], res[f"best_bf16_{key}"] = f, b
    res[f"bf16_over_f32_{name}"] = b / f if f and b else None
# kiln_bench_gemm rows, in the order of the shapes: "MxNxK  TFLOP/s  -  -  impl". FLOP-weighted
# rate: the layer's GEMM FLOP over their total time at each shape's rate.
rows = [r.split() for r in gemm.split(";") if r.strip() and not r.startswith("#")]
rows = [r for r in rows if r[0] != "MxNxK"]
counts = [int(c) for c in gemm_counts.split(",")]
assert len(rows) == len(counts), (gemm, gemm_counts)
flops = [2.0 * math.prod(map(int, r[0].split("x"))) * c for r, c in zip(rows, counts)]
onednn = sum(flops) / sum(f / (float(r[1]) * 1e12) for f, r in zip(flops, rows))
res["onednn_bf16_prefill_shapes"] = [{"shape": r[0], "tflops": float(r[1]), "impl": r[-1],
                                      "per_layer": c} for r, c in zip(rows, counts)]
res["onednn_bf16_tflops_flop_weighted"] = onednn / 1e12
res["prefill_flop_per_token"] = flop_token
pre = res["best_bf16_prefill_tok_s"]
res["prefill_fraction_of_onednn"] = pre * flop_token / onednn if pre else None
# llama-bench's CSV rows (bench/llama_bench_csv.py). One repetition per pair: the best of the
# pairs, as kiln's figure is; each run kept.
llama = {}
rows = llama_bench_csv.read_rows(llama_log)
if rows:
    b = llama_bench_csv.best(rows)[None]
    for t in ("prefill", "decode"):
        if t in b:
            llama[f"{t}_tok_s"], llama[f"{t}_tok_s_runs"] = b[t], b[f"{t}_runs"]
    if "decode_depth" in b:
        llama["decode_depth"] = b["decode_depth"]
    llama["build"], llama["backend"] = b["build"], b["backends"]
if llama:
    res["llama_cpp_bf16"] = llama
    for key, name in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
        for dt in ("bf16", "f32"):
            k = res[f"best_{dt}_{key}"]
            if k and llama.get(key):
                res[f"kiln_{dt}_over_llama_cpp_bf16_{name}"] = k / llama[key]
        print(f"{name}: llama.cpp bf16 {llama.get(key)} tok/s; kiln bf16 "
              f"{res.get(f'kiln_bf16_over_llama_cpp_bf16_{name}')}x, kiln f32 "
              f"{res.get(f'kiln_f32_over_llama_cpp_bf16_{name}')}x of it")
json.dump(res, open(out, "w"), indent=1)
print(f"bf16/f32 decode {res['bf16_over_f32_decode']}, prefill {res['bf16_over_f32_prefill']}")
if pre:
    print(f"bf16 prefill {pre} tok/s x {flop_token / 1e9:.3f} GFLOP/token = "
          f"{res['prefill_fraction_of_onednn']:.3f} of oneDNN's {onednn / 1e12:.3f} TFLOP/s")
print(f"wrote {out}")
EOF
