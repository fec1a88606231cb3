#!/usr/bin/env bash
# kiln's GGUF files against the reference reader/writer: the `gguf` Python package (gguf-py, as
# published on PyPI and vendored in llama.cpp's source).
#
#   scripts/check_gguf_py.sh GGUF_PY_DIR [KILN]
#
# GGUF_PY_DIR holds the package (e.g. vendor/llama.cpp/gguf-py from the llama-cpp-python sdist;
# needs numpy: Debian's python3-numpy). KILN defaults to build/apps/kiln. With a random-weight
# Qwen3 whose rows are whole 256-blocks (dim 256, intermediate 768), it checks:
#   1. every file kiln writes (f32, q8_0, q4_k_m) reads back with gguf.GGUFReader with the
#      metadata and the tensor names, shapes and types kiln wrote;
#   2. kiln's Q8_0 blocks are byte-identical to gguf.quants.quantize of the same f32 weights;
#   3. kiln's dequantized Q4_K and Q6_K values (`kiln quantize --model q4_k_m.gguf --type f32`)
#      equal gguf.quants.dequantize of the same blocks bit for bit.
# Prints one line per check and exits non-zero on the first difference. Not run by CI: the
# package comes from a download.
set -euo pipefail
GGUF_PY="${1:?usage: $0 GGUF_PY_DIR [KILN]}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KILN="${2:-$ROOT/build/apps/kiln}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/config.json" <<'JSON'
{"model_type": "qwen3", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 768,
 "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
 "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "tie_word_embeddings": false}
JSON
for t in f32 q8_0 q4_k_m; do
  "$KILN" quantize --random-weights --config "$WORK/config.json" --weights-seed 7 --type "$t" \
    --out "$WORK/$t.gguf" 2>/dev/null
done
"$KILN" quantize --model "$WORK/q4_k_m.gguf" --type f32 --out "$WORK/q4_k_m_dequantized.gguf" \
  2>/dev/null
PYTHONPATH="$GGUF_PY" /usr/bin/python3 - "$WORK" <<'PY'
import sys
import numpy as np
import gguf
from gguf import GGUFReader, GGMLQuantizationType as Q
from gguf.quants import quantize, dequantize

work = sys.argv[1]
def read(name):
    r = GGUFReader(f"{work}/{name}.gguf")
    return r, {t.name: t for t in r.tensors}

def field(r, key):
    f = r.fields[key]
    return f.contents()

f32, f32t = read("f32")
for name in ("f32", "q8_0", "q4_k_m"):
    r, ts = read(name)
    assert field(r, "general.architecture") == "qwen3", name
    assert field(r, "qwen3.block_count") == 8 and field(r, "qwen3.embedding_length") == 256, name
    assert field(r, "qwen3.attention.head_count_kv") == 2 and field(r, "qwen3.attention.key_length") == 64, name
    assert sorted(ts) == sorted(f32t), name
    for n, t in ts.items():
        assert list(t.shape) == list(f32t[n].shape), (name, n, t.shape, f32t[n].shape)
    types = sorted({t.tensor_type.name for t in ts.values()})
    print(f"read {name}.gguf: {len(ts)} tensors, types {types}, metadata as written")

q8, q8t = read("q8_0")
n_q8 = 0
for n, t in q8t.items():
    if t.tensor_type != Q.Q8_0:
        continue
    w = np.asarray(f32t[n].data, dtype=np.float32).reshape(-1, int(t.shape[0]))
    ref = quantize(w, Q.Q8_0)
    assert np.asarray(t.data).tobytes() == ref.tobytes(), f"q8_0 bytes differ in {n}"
    n_q8 += 1
print(f"q8_0: {n_q8} tensors byte-identical to gguf.quants.quantize")

q4, q4t = read("q4_k_m")
deq, deqt = read("q4_k_m_dequantized")
counts = {}
for n, t in q4t.items():
    if t.tensor_type not in (Q.Q4_K, Q.Q6_K):
        continue
    ref = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).ravel()
    got = np.asarray(deqt[n].data, dtype=np.float32).ravel()
    assert ref.view(np.uint32).tolist() == got.view(np.uint32).tolist(), f"{t.tensor_type.name} values differ in {n}"
    counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
print(f"q4_k_m: dequantized values bit-identical to gguf.quants.dequantize ({counts})")
PY
