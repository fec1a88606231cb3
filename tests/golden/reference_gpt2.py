#!/usr/bin/python3
"""Independent PyTorch reference for kiln's GPT-2 golden test (torch 1.13 CPU + numpy).

Usage: reference_gpt2.py IN_DIR OUT_DIR

IN_DIR holds the same files as for reference_llama.py: config.json, weights.safetensors (kiln's
parameter names), batch.safetensors and train.json. The script converts kiln's weights into
Hugging Face's GPT2LMHeadModel layout (models/decoder.h documents the mapping: fused c_attn,
Conv1D weights stored (in, out)), runs a GPT-2 written from the paper's math on that layout, and
maps the gradients and trained weights back to kiln's names. A wrong mapping in decoder.h, or a
block that is not GPT-2's, shows up as a mismatch.

GPT-2 block (pre-LN): h = wte[ids] + wpe[0..T); per layer
    h = h + c_proj(attn(ln_1(h)));  h = h + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(h))))
logits = ln_f(h) @ wte^T (tied). LayerNorm with bias, eps from the config; attention is causal
multi-head softmax(q k^T / sqrt(D)) v with no positional rotation.
"""
import json
import math
import os
import sys
from collections import OrderedDict

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_llama import read_safetensors, write_safetensors  # noqa: E402

CONFIG_KEYS = ["vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_seq_len",
               "norm_eps"]


def check_config(cfg):
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"config.json is missing {missing}")
    if cfg["dim"] % cfg["n_heads"] != 0:
        raise ValueError("dim must be a multiple of n_heads")
    return cfg


# ---- kiln <-> Hugging Face GPT-2 layout ---------------------------------------------------

def kiln_to_hf(cfg, w):
    """kiln-named numpy arrays -> OrderedDict of HF GPT-2 names (Conv1D weights are (in, out))."""
    C = cfg["dim"]
    hf = OrderedDict()
    hf["transformer.wte.weight"] = w["model.embed_tokens.weight"]
    hf["transformer.wpe.weight"] = w["model.embed_positions.weight"]
    for i in range(cfg["n_layers"]):
        k, h = f"model.layers.{i}.", f"transformer.h.{i}."
        hf[h + "ln_1.weight"] = w[k + "input_layernorm.weight"]
        hf[h + "ln_1.bias"] = w[k + "input_layernorm.bias"]
        a = k + "self_attn."
        hf[h + "attn.c_attn.weight"] = np.concatenate(
            [w[a + p + "_proj.weight"].T for p in ("q", "k", "v")], axis=1)  # (C, 3C)
        hf[h + "attn.c_attn.bias"] = np.concatenate([w[a + p + "_proj.bias"] for p in "qkv"])
        hf[h + "attn.c_proj.weight"] = w[a + "o_proj.weight"].T
        hf[h + "attn.c_proj.bias"] = w[a + "o_proj.bias"]
        hf[h + "ln_2.weight"] = w[k + "post_attention_layernorm.weight"]
        hf[h + "ln_2.bias"] = w[k + "post_attention_layernorm.bias"]
        hf[h + "mlp.c_fc.weight"] = w[k + "mlp.fc.weight"].T      # (C, 4C)
        hf[h + "mlp.c_fc.bias"] = w[k + "mlp.fc.bias"]
        hf[h + "mlp.c_proj.weight"] = w[k + "mlp.proj.weight"].T  # (4C, C)
        hf[h + "mlp.c_proj.bias"] = w[k + "mlp.proj.bias"]
    hf["transformer.ln_f.weight"] = w["model.norm.weight"]
    hf["transformer.ln_f.bias"] = w["model.norm.bias"]
    assert hf["transformer.h.0.attn.c_attn.weight"].shape == (C, 3 * C)
    return hf


def hf_to_kiln(cfg, hf):
    """The inverse of kiln_to_hf (for gradients and trained weights)."""
    C = cfg["dim"]
    w = OrderedDict()
    w["model.embed_tokens.weight"] = hf["transformer.wte.weight"]
    w["model.embed_positions.weight"] = hf["transformer.wpe.weight"]
    for i in range(cfg["n_layers"]):
        k, h = f"model.layers.{i}.", f"transformer.h.{i}."
        a = k + "self_attn."
        w[k + "input_layernorm.weight"] = hf[h + "ln_1.weight"]
        w[k + "input_layernorm.bias"] = hf[h + "ln_1.bias"]
        for j, p in enumerate("qkv"):
            w[a + p + "_proj.weight"] = hf[h + "attn.c_attn.weight"][:, j * C:(j + 1) * C].T
            w[a + p + "_proj.bias"] = hf[h + "attn.c_attn.bias"][j * C:(j + 1) * C]
        w[a + "o_proj.weight"] = hf[h + "attn.c_proj.weight"].T
        w[a + "o_proj.bias"] = hf[h + "attn.c_proj.bias"]
        w[k + "post_attention_layernorm.weight"] = hf[h + "ln_2.weight"]
        w[k + "post_attention_layernorm.bias"] = hf[h + "ln_2.bias"]
        w[k + "mlp.fc.weight"] = hf[h + "mlp.c_fc.weight"].T
        w[k + "mlp.fc.bias"] = hf[h + "mlp.c_fc.bias"]
        w[k + "mlp.proj.weight"] = hf[h + "mlp.c_proj.weight"].T
        w[k + "mlp.proj.bias"] = hf[h + "mlp.c_proj.bias"]
    w["model.norm.weight"] = hf["transformer.ln_f.weight"]
    w["model.norm.bias"] = hf["transformer.ln_f.bias"]
    return w


def expected_kiln_shapes(cfg):
    V, C, F, L, T = (cfg[k] for k in ("vocab_size", "dim", "hidden_dim", "n_layers",
                                      "max_seq_len"))
    s = {"model.embed_tokens.weight": (V, C), "model.embed_positions.weight": (T, C),
         "model.norm.weight": (C,), "model.norm.bias": (C,)}
    for i in range(L):
        k = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            s[k + n + ".weight"] = (C,)
            s[k + n + ".bias"] = (C,)
        for p in "qko":
            s[k + f"self_attn.{p}_proj.weight"] = (C, C)
            s[k + f"self_attn.{p}_proj.bias"] = (C,)
        s[k + "self_attn.v_proj.weight"] = (C, C)
        s[k + "self_attn.v_proj.bias"] = (C,)
        s[k + "mlp.fc.weight"] = (F, C)
        s[k + "mlp.fc.bias"] = (F,)
        s[k + "mlp.proj.weight"] = (C, F)
        s[k + "mlp.proj.bias"] = (C,)
    return s


def check_weights(cfg, arrays):
    want = expected_kiln_shapes(cfg)
    missing = [n for n in want if n not in arrays]
    extra = [n for n in arrays if n not in want]
    if missing or extra:
        raise ValueError(f"weights: missing {missing[:5]}, unexpected {extra[:5]}")
    for n, shape in want.items():
        if tuple(arrays[n].shape) != tuple(shape):
            raise ValueError(f"weights: {n} has shape {list(arrays[n].shape)}, expected {shape}")


# ---- GPT-2 on the HF layout ----------------------------------------------------------------

def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)  # biased, as nn.LayerNorm
    return (x - mu) * torch.rsqrt(var + eps) * w + b


def gelu_tanh(x):
    """GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def conv1d(x, w, b):
    """HF Conv1D: x (..., in) @ w (in, out) + b."""
    return x @ w + b


def forward(cfg, P, ids):
    """ids: (B, T) int64 -> logits (B, T, V)."""
    B, T = ids.shape
    C, H, eps = cfg["dim"], cfg["n_heads"], cfg["norm_eps"]
    D = C // H
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    h = P["transformer.wte.weight"][ids] + P["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layers"]):
        p = f"transformer.h.{i}."
        x = layer_norm(h, P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        qkv = conv1d(x, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])  # (B, T, 3C)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + conv1d(o, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
        x = layer_norm(h, P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        m = gelu_tanh(conv1d(x, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]))
        h = h + conv1d(m, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
    x = layer_norm(h, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps)
    return x @ P["transformer.wte.weight"].t()  # tied LM head


def loss_fn(logits, targets):
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                                             ignore_index=-100)


def leaves(hf):
    return OrderedDict((n, torch.from_numpy(np.array(a, dtype=np.float32)).requires_grad_(True))
                       for n, a in hf.items())


def run(in_dir, out_dir):
    with open(os.path.join(in_dir, "config.json")) as f:
        cfg = check_config(json.load(f))
    with open(os.path.join(in_dir, "train.json")) as f:
        tr = json.load(f)
    arrays = read_safetensors(os.path.join(in_dir, "weights.safetensors"))
    check_weights(cfg, arrays)
    batch = read_safetensors(os.path.join(in_dir, "batch.safetensors"))
    ids = torch.from_numpy(batch["input_ids"].astype(np.int64))
    targets = torch.from_numpy(batch["targets"].astype(np.int64))
    V, T = cfg["vocab_size"], ids.shape[1]
    if ids.min() < 0 or ids.max() >= V or T > cfg["max_seq_len"]:
        raise ValueError("batch: input id out of range or sequence past max_seq_len")
    hf = kiln_to_hf(cfg, arrays)
    # The round trip is exact: the mapping and its inverse agree.
    for n, a in hf_to_kiln(cfg, hf).items():
        if not np.array_equal(a, arrays[n]):
            raise ValueError(f"kiln -> HF -> kiln changed {n}")

    out = OrderedDict()
    P = leaves(hf)
    logits = forward(cfg, P, ids)
    loss = loss_fn(logits, targets)
    loss.backward()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(())
    grads = hf_to_kiln(cfg, OrderedDict((n, t.grad.numpy()) for n, t in P.items()))
    for n, g in grads.items():
        out["grad." + n] = np.ascontiguousarray(g)

    P = leaves(hf)
    decay = [t for t in P.values() if t.ndim >= 2]
    no_decay = [t for t in P.values() if t.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"])
    losses = []
    for _ in range(int(tr["steps"])):
        opt.zero_grad(set_to_none=True)
        l = loss_fn(forward(cfg, P, ids), targets)
        losses.append(l.item())
        l.backward()
        opt.step()
    out["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    final = hf_to_kiln(cfg, OrderedDict((n, t.detach().numpy()) for n, t in P.items()))
    for n, a in final.items():
        out["final." + n] = np.ascontiguousarray(a)

    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "outputs.safetensors"), out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: reference_gpt2.py IN_DIR OUT_DIR")
    torch.manual_seed(0)
    run(sys.argv[1], sys.argv[2])
