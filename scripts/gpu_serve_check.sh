#!/usr/bin/env bash
# `kiln serve --device cuda` on a GPU machine, for scripts/gpu_check.sh (standard library Python
# only: the GPU machine has no network, so no openai client).
#
#   gpu_serve_check.sh smoke KILN          a tiny random Qwen3 (the real vocabulary): /health,
#                                          a chat completion (the same seed gives the same
#                                          text, max_tokens holds), the same request streamed
#                                          gives the same text, /metrics, SIGTERM exits 0
#   gpu_serve_check.sh load KILN MODEL_DIR the random Qwen3-8B folder (bf16), the Qwen
#                                          tokenizer: bench/serve_load.py at 1, 8 and 32
#                                          streams (64-token prompts, 64 new tokens each);
#                                          the last line is one JSON object with every level
#                                          and the 8- and 32-stream throughput over 1 stream
#
# The tokenizer comes from $KILN_SHARED_DATA/qwen (gpu_check points it at the bundle's data/).
# KILN_SERVE_DEVICE (default cuda) runs the same checks elsewhere (cpu: on the build machine).
# Exit 0 when every check held, 1 otherwise (the log says which).
set -uo pipefail
mode=${1:?usage: gpu_serve_check.sh smoke|load KILN [MODEL_DIR]} kiln=${2:?KILN}
model=${3:-}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data=${KILN_SHARED_DATA:-$repo/../shared/data}
py=${KILN_PYTHON:-python3}
work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "---- kiln serve's output"
  cat "$work/serve.log"
  exit 1
}

start_server() {  # kiln serve's arguments after --port 0
  "$kiln" serve --device "${KILN_SERVE_DEVICE:-cuda}" --port 0 "$@" >"$work/serve.log" 2>&1 &
  server_pid=$!
  port=
  for _ in $(seq 1 1200); do  # loading 16 GB may take a while
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/serve.log")
    [ -n "$port" ] && "$py" - "$port" <<'PY' && return 0
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=5)
except Exception:
    sys.exit(1)
PY
    kill -0 "$server_pid" 2>/dev/null || fail "kiln serve exited"
    sleep 0.25
  done
  fail "kiln serve was not healthy within 300 s"
}

stop_server() {  # SIGTERM drains and exits 0
  kill -TERM "$server_pid"
  wait "$server_pid"
  local rc=$?
  server_pid=
  [ "$rc" = 0 ] || fail "kiln serve exited $rc after SIGTERM"
}

case "$mode" in
  smoke)
    "$py" - "$data/qwen/Qwen3-0.6B/config.json" "$work/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
         head_dim=16, intermediate_size=128, max_position_embeddings=256)
json.dump(c, open(sys.argv[2], "w"))
PY
    start_server --random-weights --config "$work/config.json" --tokenizer "qwen:$data/qwen" \
      --dtype bf16 --max-seqs 4 --name tiny
    grep -E "cuda|GiB" "$work/serve.log" | head -20
    "$py" - "$port" <<'PY' || fail "client checks"
import json, sys, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}"

def post(path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60)

msgs = [{"role": "user", "content": "Tell me a story."}]
body = {"model": "tiny", "messages": msgs, "max_tokens": 12, "seed": 7}
a = json.load(post("/v1/chat/completions", body))
b = json.load(post("/v1/chat/completions", body))
assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"], (a, b)
assert a["usage"]["completion_tokens"] == 12, a["usage"]
assert a["choices"][0]["finish_reason"] == "length", a
text = ""
with post("/v1/chat/completions", dict(body, stream=True)) as r:
    for line in r:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            for ch in json.loads(line[6:])["choices"]:
                text += ch["delta"].get("content") or ""
assert text == a["choices"][0]["message"]["content"], (text, a)
m = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
assert "kiln" in m, m[:200]
print("serve smoke: 2 identical seeded completions of 12 tokens, the stream equal:",
      repr(text[:60]))
PY
    stop_server
    echo "PASS: kiln serve --device cuda (tiny random Qwen3)"
    ;;
  load)
    [ -d "$model" ] || fail "no model folder $model"
    start_server --model "$model" --tokenizer "qwen:$data/qwen" --dtype bf16 --max-seqs 32 \
      --context 512 --max-queue 256 --threads 64 --name qwen3-8b
    grep -E "cuda|GiB|fit" "$work/serve.log" | head -20
    "$py" "$repo/bench/serve_load.py" --url "http://127.0.0.1:$port" --concurrency 1,8,32 \
      --requests-per-stream 1 --prompt-tokens 64 --max-tokens 64 --timeout 120 \
      --json "$work/load.json" || fail "serve_load.py reported errors"
    stop_server
    "$py" - "$work/load.json" <<'PY'
import json, sys
levels = json.load(open(sys.argv[1]))
by = {l["concurrency"]: l["aggregate_tokens_per_s"] for l in levels}
out = {"bench": "serve_8b", "model": "Qwen3-8B config, random bf16 weights", "prompt_tokens": 64,
       "max_tokens": 64, "levels": levels}
for n in (8, 32):
    if by.get(1) and n in by:
        out[f"tok_s_{n}_over_1"] = round(by[n] / by[1], 3)
print(json.dumps(out))
PY
    ;;
  *) echo "usage: gpu_serve_check.sh smoke|load KILN [MODEL_DIR]" >&2; exit 2 ;;
esac
