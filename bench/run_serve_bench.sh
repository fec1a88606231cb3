#!/usr/bin/env bash
# Serving throughput on the CPU: kiln serve against llama.cpp's llama-server on the same GGUF
# file, in one run on the same machine, with bench/serve_load.py as the client of both.
#
#   LLAMA_SERVER=path/to/llama-server bench/run_serve_bench.sh [THREADS=2]
#
# Writes a random-weight Qwen3-0.6B (../shared/data/qwen/Qwen3-0.6B/config.json, Qwen's
# vocab.json and merges.txt) as a Q8_0 GGUF (`kiln quantize`), then for each server: start it
# (kiln: --max-seqs 32; llama-server: -np 32 with continuous batching, a context of 32 x CTX),
# run serve_load.py at 1, 8 and 32 concurrent streams (PROMPT prompt tokens, NEW new tokens,
# ignore_eos), stop it. Prints both tables and kiln over llama-server per level, and writes
# bench/results/cpu_serve_<date>.json with the commit, the CPU model and the date.
# Without LLAMA_SERVER only kiln runs.
#
# Environment: PROMPT (32), NEW (64), CTX (256), LEVELS (1,8,32), PER_STREAM (2), BUILD_DIR
# (build), WORK_DIR (mktemp -d), LLAMA_SERVER (unset).
set -euo pipefail

THREADS="${1:-2}"
PROMPT="${PROMPT:-32}"
NEW="${NEW:-64}"
CTX="${CTX:-256}"
LEVELS="${LEVELS:-1,8,32}"
PER_STREAM="${PER_STREAM:-2}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
WORK_DIR="${WORK_DIR:-$(mktemp -d)}"
KILN="$BUILD_DIR/apps/kiln"
QWEN="$ROOT/../shared/data/qwen"
export OMP_NUM_THREADS="$THREADS"
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$WORK_DIR"
}
trap cleanup EXIT
[ -x "$KILN" ] || { echo "[bench] build kiln first: $KILN is missing" >&2; exit 1; }

"$BUILD_DIR/bench/kiln_write_random_safetensors" --config "$QWEN/Qwen3-0.6B/config.json" \
  --out "$WORK_DIR/hf"
cp "$QWEN/vocab.json" "$QWEN/merges.txt" "$WORK_DIR/hf/"
GGUF="$WORK_DIR/qwen3-0.6b-q8_0.gguf"
"$KILN" quantize --model "$WORK_DIR/hf" --type q8_0 --out "$GGUF"

wait_healthy() {  # port
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$server_pid" 2>/dev/null || { echo "[bench] the server exited" >&2; return 1; }
    sleep 0.5
  done
  return 1
}

run_server() {  # name port command...
  local name=$1 port=$2
  shift 2
  "$@" >"$WORK_DIR/$name.log" 2>&1 &
  server_pid=$!
  wait_healthy "$port" || { cat "$WORK_DIR/$name.log"; exit 1; }
  echo "== $name"
  /usr/bin/python3 "$ROOT/bench/serve_load.py" --url "http://127.0.0.1:$port" --concurrency "$LEVELS" \
    --requests-per-stream "$PER_STREAM" --prompt-tokens "$PROMPT" --max-tokens "$NEW" \
    --json "$WORK_DIR/$name.json"
  kill "$server_pid"
  wait "$server_pid" || true
  server_pid=
}

run_server kiln 18181 "$KILN" serve --model "$GGUF" --port 18181 --max-seqs 32 --context "$CTX" \
  --max-queue 256 --threads 64
if [ -n "${LLAMA_SERVER:-}" ]; then
  run_server llama 18182 "$LLAMA_SERVER" -m "$GGUF" --port 18182 -t "$THREADS" -np 32 \
    -c $((32 * CTX)) -cb --no-webui
fi

mkdir -p "$ROOT/bench/results"
RESULT="$ROOT/bench/results/cpu_serve_$(date +%Y%m%d_%H%M%S).json"
/usr/bin/python3 - "$WORK_DIR" "$RESULT" "$THREADS" "$ROOT" "$PROMPT" "$NEW" <<'PY'
import json, os, subprocess, sys, datetime
work, result, threads, root, prompt, new = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit, "cpu": cpu,
       "threads": int(threads), "model": "Qwen3-0.6B random weights, Q8_0 GGUF (kiln quantize)",
       "prompt_tokens": int(prompt), "new_tokens": int(new)}
for name in ("kiln", "llama"):
    p = os.path.join(work, name + ".json")
    if os.path.exists(p):
        out[name] = json.load(open(p))
if "llama" in out:
    out["kiln_over_llama_server"] = {
        str(k["concurrency"]): round(k["aggregate_tokens_per_s"] / l["aggregate_tokens_per_s"], 3)
        for k, l in zip(out["kiln"], out["llama"]) if l["aggregate_tokens_per_s"] > 0}
    print("kiln / llama-server aggregate tokens/s:", out["kiln_over_llama_server"])
k1 = out["kiln"][0]["aggregate_tokens_per_s"] if out["kiln"] else 0
if k1 > 0:
    out["kiln_over_its_single_stream"] = {str(k["concurrency"]): round(k["aggregate_tokens_per_s"] / k1, 3)
                                          for k in out["kiln"]}
    print("kiln at N streams / kiln at 1:", out["kiln_over_its_single_stream"])
json.dump(out, open(result, "w"), indent=1)
print("wrote", result)
PY
