#!/usr/bin/env bash
# kiln serve against the official `openai` Python client (from PyPI, in a venv kept under the
# build folder): chat, streaming, completions, stop strings, max_tokens, seed determinism, an
# unknown model, malformed JSON, and SIGTERM with a request in flight (it finishes, exit 0).
# A tiny random Qwen3 (the real vocabulary) on a loopback port. Without PyPI (no network) the test
# skips with exit 77 and says so.
# usage: test_serve_openai.sh KILN_BINARY SOURCE_DIR VENV_DIR
# The Qwen vocabulary comes from where the C++ tests read it (tests/test_data.h): $KILN_SHARED_DATA,
# else ../shared/data beside the source, else the source's data/.
set -uo pipefail
kiln=$1 src=$2 venv=$3
data=${KILN_SHARED_DATA:-}
[ -n "$data" ] || { [ -d "$src/../shared/data" ] && data=$src/../shared/data; } || data=$src/data
work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
  if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q 'openai>=1,<3'; } >"$work/pip.log" 2>&1; then
    echo "[expected-skip] cannot install the openai client from PyPI (no network?):"
    tail -3 "$work/pip.log"
    exit 77
  fi
fi

python3 - "$data/qwen/Qwen3-0.6B/config.json" "$work/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
         head_dim=16, intermediate_size=128, max_position_embeddings=256)
json.dump(c, open(sys.argv[2], "w"))
PY
cp "$data/qwen/vocab.json" "$data/qwen/merges.txt" "$work/"

"$kiln" serve --random-weights --config "$work/config.json" --port 0 --max-seqs 4 --name tiny \
  --threads 16 --max-queue 8 \
  >"$work/serve.log" 2>&1 &
server_pid=$!
port=
for _ in $(seq 1 600); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/serve.log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { echo "FAIL: kiln serve exited"; cat "$work/serve.log"; exit 1; }
  sleep 0.2
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "FAIL: not healthy"; cat "$work/serve.log"; exit 1; }

"$venv/bin/python" - "$port" <<'PY' || { echo "FAIL: client checks"; cat "$work/serve.log"; exit 1; }
import json, sys, urllib.request, urllib.error
import openai
port = sys.argv[1]
c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
msgs = [{"role": "user", "content": "Tell me a story."}]

a = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, seed=7)
b = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, seed=7)
assert a.choices[0].message.content == b.choices[0].message.content, "same seed, same text"
assert a.usage.completion_tokens == 10 and a.usage.total_tokens == a.usage.prompt_tokens + 10, a.usage
assert a.choices[0].finish_reason == "length"

chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, seed=7,
                                        stream=True))
streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
assert streamed == a.choices[0].message.content, (streamed, a.choices[0].message.content)
assert chunks[-1].choices[0].finish_reason == "length"

t = c.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8, seed=3)
text = t.choices[0].text
assert t.usage.completion_tokens == 8
stop = text[len(text) // 2:len(text) // 2 + 2]
s = c.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8, seed=3, stop=[stop])
assert s.choices[0].text == text[:text.index(stop)] and s.choices[0].finish_reason == "stop", \
    (s.choices[0].text, text, stop)

try:
    c.chat.completions.create(model="gpt-4", messages=msgs)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert "not served here" in str(e)

req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=b"{oops",
                             headers={"Content-Type": "application/json"})
try:
    urllib.request.urlopen(req)
    raise AssertionError("malformed JSON accepted")
except urllib.error.HTTPError as e:
    assert e.code == 400 and "error" in json.loads(e.read())
print("openai client checks passed")
PY

# 200 connections at once (curl, in parallel) against --threads 16 and --max-queue 8: every one
# gets an answer, 200 or 429 (queue full), and the server stays healthy with no blocks held.
seq 1 200 | xargs -P 200 -I{} curl -s -o /dev/null -w '%{http_code}\n' --max-time 120 \
  "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hi", "max_tokens": 2, "seed": {}}' >"$work/codes.txt"
codes=$(sort "$work/codes.txt" | uniq -c | tr -s ' ' | tr '\n' ';')
[ "$(grep -cxE '200|429' "$work/codes.txt")" -eq 200 ] && grep -qx 200 "$work/codes.txt" ||
  { echo "FAIL: 200 simultaneous connections: $codes"; exit 1; }
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "FAIL: unhealthy after the burst"; exit 1; }
curl -s "http://127.0.0.1:$port/metrics" | grep -qx 'kiln_kv_blocks_used 0' ||
  { echo "FAIL: blocks still held after the burst"; exit 1; }
echo "200 simultaneous connections: $codes"

# SIGTERM with a stream in flight: the stream still ends with [DONE], and the server exits 0.
curl -sN "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "A long tale", "max_tokens": 200, "stream": true, "seed": 1}' >"$work/stream.txt" &
curl_pid=$!
for _ in $(seq 1 200); do grep -q '^data: {' "$work/stream.txt" 2>/dev/null && break; sleep 0.05; done
kill -TERM "$server_pid"
wait "$curl_pid"
wait "$server_pid"
rc=$?
server_pid=
grep -v '^$' "$work/stream.txt" | tail -1 | grep -q '^data: \[DONE\]$' ||
  { echo "FAIL: the in-flight stream was cut: $(tail -c 200 "$work/stream.txt")"; exit 1; }
[ "$rc" -eq 0 ] || { echo "FAIL: kiln serve exited $rc after SIGTERM"; cat "$work/serve.log"; exit 1; }
grep -q "kiln serve: stopped" "$work/serve.log" || { echo "FAIL: no clean stop"; exit 1; }
echo "PASS: openai client, SSE, stop strings, errors, SIGTERM drain"
