#!/usr/bin/python3
"""PyTorch reference for kiln's generation golden tests (torch 1.13 CPU + numpy).

Usage:
  reference_qwen3.py hf MODEL_DIR REQUEST_JSON OUT_DIR
      MODEL_DIR is a Hugging Face folder as `kiln generate --model` reads it: config.json with HF
      field names (model_type qwen3/qwen2/llama/mistral, hidden_size, intermediate_size,
      num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps,
      rope_theta, tie_word_embeddings, attention_bias, vocab_size, hidden_act) and the weights as
      model.safetensors.index.json + shards, or a single model.safetensors.
  reference_qwen3.py llama2c MODEL_BIN REQUEST_JSON OUT_DIR
      MODEL_BIN is a llama2.c legacy .bin (run.c's layout: 7 int32 header, f32 weights, a negative
      vocab_size means an unshared classifier). The math is run.c's forward: interleaved RoPE,
      theta 1e4, eps 1e-5.

REQUEST_JSON: {"prompt_ids": [...], "n_greedy": 16}.
OUT_DIR/outputs.safetensors (float32 unless noted):
  prompt_logits (T, V)   logits of every prompt position, one forward over the prompt
  greedy_ids    (N,) I32 N greedy tokens (argmax, first index on ties), each from a full recompute
                         over prompt + the tokens so far (no cache: independent of kiln's KV cache)
  step_logits   (N, V)   the last-position logits each greedy token was picked from
  step_margin   (N,)     top-1 minus top-2 logit of each step (how safe the argmax is)

The decoder math is reference_llama.forward (HF Qwen3: rotate-half RoPE, QK-norm, GQA), fed from
HF names; this file only adds HF-folder / llama2.c .bin reading and greedy decoding.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_llama as ref  # noqa: E402


def hf_config(path):
    with open(path) as f:
        j = json.load(f)
    mt = j.get("model_type")
    if mt not in ("qwen3", "qwen2", "llama", "mistral"):
        raise ValueError(f"{path}: unknown model_type {mt!r}")
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads"):
        if k not in j:
            raise ValueError(f"{path}: missing {k}")
    n_heads = j["num_attention_heads"]
    theta = j.get("rope_theta", 10000.0)
    if isinstance(j.get("rope_parameters"), dict) and "rope_theta" in j["rope_parameters"]:
        theta = j["rope_parameters"]["rope_theta"]
    return ref.check_config({
        "vocab_size": j["vocab_size"],
        "dim": j["hidden_size"],
        "n_layers": j["num_hidden_layers"],
        "n_heads": n_heads,
        "n_kv_heads": j.get("num_key_value_heads") or n_heads,
        "head_dim": j.get("head_dim") or j["hidden_size"] // n_heads,
        "hidden_dim": j["intermediate_size"],
        "norm_eps": j.get("rms_norm_eps", 1e-6),
        "rope_theta": theta,
        "rope_style": "rotate_half",
        "qk_norm": mt == "qwen3",
        "qkv_bias": True if mt == "qwen2" else bool(j.get("attention_bias", False)),
        "tie_embeddings": bool(j.get("tie_word_embeddings", False)),
        "hidden_act": j.get("hidden_act", "silu"),
    })


def hf_weights(model_dir, cfg):
    """name -> numpy array from the index's shards (or model.safetensors)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    arrays = {}
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        for shard in sorted(set(wm.values())):
            got = ref.read_safetensors(os.path.join(model_dir, shard))
            for name, a in got.items():
                if wm.get(name) != shard:
                    raise ValueError(f"{shard}: {name} is not mapped to this shard by the index")
                arrays[name] = a
        missing = [n for n in wm if n not in arrays]
        if missing:
            raise ValueError(f"index names tensors no shard holds: {missing[:5]}")
    else:
        arrays = dict(ref.read_safetensors(os.path.join(model_dir, "model.safetensors")))
    if cfg["tie_embeddings"]:
        arrays.pop("lm_head.weight", None)
    return arrays


def llama2c_model(path):
    """run.c's legacy checkpoint -> (cfg, name -> numpy array) with HF names."""
    with open(path, "rb") as f:
        blob = f.read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", blob[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // n_heads
    kv_dim = n_kv * hs
    w = np.frombuffer(blob, dtype="<f4", offset=28)
    pos = [0]

    def take(*shape):
        n = math.prod(shape)
        a = w[pos[0]:pos[0] + n]
        if a.size != n:
            raise ValueError(f"{path}: truncated")
        pos[0] += n
        return a.reshape(shape).copy()

    A = {"model.embed_tokens.weight": take(vocab, dim)}
    per = {}
    for key, shape in (("input_layernorm.weight", (dim,)),
                       ("self_attn.q_proj.weight", (dim, dim)),
                       ("self_attn.k_proj.weight", (kv_dim, dim)),
                       ("self_attn.v_proj.weight", (kv_dim, dim)),
                       ("self_attn.o_proj.weight", (dim, dim)),
                       ("post_attention_layernorm.weight", (dim,)),
                       ("mlp.gate_proj.weight", (hidden, dim)),   # w1
                       ("mlp.down_proj.weight", (dim, hidden)),   # w2
                       ("mlp.up_proj.weight", (hidden, dim))):    # w3
        per[key] = take(n_layers, *shape)
    for key, a in per.items():
        for l in range(n_layers):
            A[f"model.layers.{l}.{key}"] = a[l]
    A["model.norm.weight"] = take(dim)
    take(seq_len, hs // 2)  # freq_cis_real: run.c ignores it
    take(seq_len, hs // 2)  # freq_cis_imag
    if not shared:
        A["lm_head.weight"] = take(vocab, dim)
    cfg = ref.check_config({
        "vocab_size": vocab, "dim": dim, "n_layers": n_layers, "n_heads": n_heads,
        "n_kv_heads": n_kv, "head_dim": hs, "hidden_dim": hidden, "norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_style": "interleaved", "qk_norm": False, "qkv_bias": False,
        "tie_embeddings": shared})
    return cfg, A


def run(mode, model, request, out_dir):
    with open(request) as f:
        req = json.load(f)
    prompt = [int(i) for i in req["prompt_ids"]]
    n = int(req.get("n_greedy", 16))
    if mode == "hf":
        cfg = hf_config(os.path.join(model, "config.json"))
        arrays = hf_weights(model, cfg)
    elif mode == "llama2c":
        cfg, arrays = llama2c_model(model)
    else:
        raise ValueError(f"unknown mode {mode!r} (hf or llama2c)")
    V = cfg["vocab_size"]
    if not prompt or min(prompt) < 0 or max(prompt) >= V:
        raise ValueError("prompt ids empty or out of range")
    P = ref.params_from_arrays(cfg, arrays)
    out = {}
    with torch.no_grad():
        ids = torch.tensor([prompt], dtype=torch.int64)
        out["prompt_logits"] = ref.forward(cfg, P, ids)[0]
        seq = list(prompt)
        greedy, rows, margins = [], [], []
        for _ in range(n):
            last = ref.forward(cfg, P, torch.tensor([seq], dtype=torch.int64))[0, -1]
            top2 = torch.topk(last, 2).values
            nxt = int(torch.argmax(last))  # first index among equal maxima
            greedy.append(nxt)
            rows.append(last)
            margins.append(float(top2[0] - top2[1]))
            seq.append(nxt)
    out["greedy_ids"] = np.array(greedy, dtype=np.int32)
    out["step_logits"] = torch.stack(rows)
    out["step_margin"] = np.array(margins, dtype=np.float32)
    os.makedirs(out_dir, exist_ok=True)
    ref.write_safetensors(os.path.join(out_dir, "outputs.safetensors"), out)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: reference_qwen3.py hf|llama2c MODEL REQUEST_JSON OUT_DIR")
    torch.manual_seed(0)
    run(*sys.argv[1:])
