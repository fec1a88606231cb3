#!/usr/bin/python3
"""Independent PyTorch reference for kiln's golden model tests (torch 1.13 CPU + numpy).

Usage: reference_llama.py IN_DIR OUT_DIR   (contract in tests/golden/README.md)

The model is a plain-torch LLaMA / Qwen3-style decoder with HF parameter names. It is written
from the math, not from kiln, so that the two can check each other. bench/torch_train_step.py
imports this module so there is only one PyTorch model definition in the repo.
"""
import json
import math
import os
import struct
import sys
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

# ---- minimal safetensors (json header + raw little-endian bytes) ---------------------------

_NP_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors(path):
    """Returns an OrderedDict name -> numpy array (BF16 is widened to float32)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8:
        raise ValueError(f"{path}: header length {hlen} past the end of the file")
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = memoryview(blob)[8 + hlen:]
    out = OrderedDict()
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = e["dtype"], [int(d) for d in e["shape"]]
        begin, end = (int(x) for x in e["data_offsets"])
        if not (0 <= begin <= end <= len(data)):
            raise ValueError(f"{path}: tensor {name} offsets [{begin}, {end}) out of range")
        raw = data[begin:end]
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif dtype in _NP_DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_NP_DTYPES[dtype]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        if arr.size != math.prod(shape):
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements, shape {shape}")
        out[name] = arr.reshape(shape).copy()
    return out


def write_safetensors(path, tensors):
    """tensors: dict name -> numpy array or torch tensor (F64/F32/F16/I64/I32/U8...)."""
    rev = {np.dtype(v): k for k, v in _NP_DTYPES.items()}
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        a = np.array(a, order="C")  # not ascontiguousarray: that turns a scalar into shape [1]
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": rev[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


# ---- model -------------------------------------------------------------------------------

CONFIG_KEYS = ["vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
               "hidden_dim", "norm_eps", "rope_theta", "rope_style", "qk_norm", "qkv_bias",
               "tie_embeddings"]


# hidden_act -> the gated MLP's activation (HF's ACT2FN names): gelu is the exact erf form.
ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def check_config(cfg):
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"config.json is missing {missing}")
    cfg.setdefault("hidden_act", "silu")
    if cfg["hidden_act"] not in ACTIVATIONS:
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not one of {sorted(ACTIVATIONS)}")
    if cfg["rope_style"] not in ("interleaved", "rotate_half"):
        raise ValueError(f"rope_style must be interleaved or rotate_half, not {cfg['rope_style']}")
    if cfg["n_heads"] % cfg["n_kv_heads"] != 0 or cfg["head_dim"] % 2 != 0:
        raise ValueError("n_heads must be a multiple of n_kv_heads and head_dim even")
    return cfg


def work_dtype(cfg):
    return torch.float64 if cfg.get("dtype", "float32") == "float64" else torch.float32


def param_shapes(cfg):
    """OrderedDict HF name -> shape, in a fixed order."""
    V, C, D, Hid = cfg["vocab_size"], cfg["dim"], cfg["head_dim"], cfg["hidden_dim"]
    Hq, Hkv = cfg["n_heads"], cfg["n_kv_heads"]
    s = OrderedDict()
    s["model.embed_tokens.weight"] = (V, C)
    for i in range(cfg["n_layers"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (C,)
        s[p + "self_attn.q_proj.weight"] = (Hq * D, C)
        s[p + "self_attn.k_proj.weight"] = (Hkv * D, C)
        s[p + "self_attn.v_proj.weight"] = (Hkv * D, C)
        if cfg["qkv_bias"]:
            s[p + "self_attn.q_proj.bias"] = (Hq * D,)
            s[p + "self_attn.k_proj.bias"] = (Hkv * D,)
            s[p + "self_attn.v_proj.bias"] = (Hkv * D,)
        s[p + "self_attn.o_proj.weight"] = (C, Hq * D)
        if cfg["qk_norm"]:
            s[p + "self_attn.q_norm.weight"] = (D,)
            s[p + "self_attn.k_norm.weight"] = (D,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        s[p + "mlp.gate_proj.weight"] = (Hid, C)
        s[p + "mlp.up_proj.weight"] = (Hid, C)
        s[p + "mlp.down_proj.weight"] = (C, Hid)
    s["model.norm.weight"] = (C,)
    if not cfg["tie_embeddings"]:
        s["lm_head.weight"] = (V, C)
    return s


def init_params(cfg, seed=0, std=0.02):
    """Random leaf tensors (requires_grad): N(0, std) for matrices, 1 for norms, 0 for biases."""
    g = torch.Generator().manual_seed(seed)
    dt = work_dtype(cfg)
    P = OrderedDict()
    for name, shape in param_shapes(cfg).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=dt)
        elif name.endswith(".bias"):
            t = torch.zeros(shape, dtype=dt)
        else:
            t = torch.randn(shape, generator=g, dtype=torch.float32).to(dt) * std
        P[name] = t.requires_grad_(True)
    return P


def params_from_arrays(cfg, arrays):
    """Leaf tensors from a name -> numpy dict; the set of names must match exactly."""
    want = param_shapes(cfg)
    missing = [n for n in want if n not in arrays]
    extra = [n for n in arrays if n not in want]
    if missing or extra:
        raise ValueError(f"weights: missing {missing[:5]}, unexpected {extra[:5]}")
    dt = work_dtype(cfg)
    P = OrderedDict()
    for name, shape in want.items():
        a = arrays[name]
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"weights: {name} has shape {list(a.shape)}, expected {list(shape)}")
        P[name] = torch.from_numpy(np.array(a)).to(dt).requires_grad_(True)
    return P


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T, D, theta, dtype):
    """cos, sin: (T, D/2). Angles in float32 as HF computes them, then cast."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2).float() / D))
    angle = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    return angle.to(dtype).cos(), angle.to(dtype).sin()


def apply_rope(x, cos, sin, style):
    """x: (B, T, H, D); rotates pairs (2i, 2i+1) [interleaved] or (i, i+D/2) [rotate_half]."""
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    if style == "interleaved":
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1)


def forward(cfg, P, ids):
    """ids: (B, T) int64 -> logits (B, T, V) in the working dtype."""
    B, T = ids.shape
    Hq, Hkv, D, eps = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"], cfg["norm_eps"]
    dt = work_dtype(cfg)
    act = ACTIVATIONS[cfg.get("hidden_act", "silu")]
    cos, sin = rope_cos_sin(T, D, cfg["rope_theta"], dt)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal = masked
    h = P["model.embed_tokens.weight"][ids]  # (B, T, C)
    for i in range(cfg["n_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        x = rmsnorm(h, P[p + "input_layernorm.weight"], eps)
        q = F.linear(x, P[a + "q_proj.weight"], P.get(a + "q_proj.bias")).view(B, T, Hq, D)
        k = F.linear(x, P[a + "k_proj.weight"], P.get(a + "k_proj.bias")).view(B, T, Hkv, D)
        v = F.linear(x, P[a + "v_proj.weight"], P.get(a + "v_proj.bias")).view(B, T, Hkv, D)
        if cfg["qk_norm"]:
            q = rmsnorm(q, P[a + "q_norm.weight"], eps)
            k = rmsnorm(k, P[a + "k_norm.weight"], eps)
        q = apply_rope(q, cos, sin, cfg["rope_style"]).transpose(1, 2)  # (B, Hq, T, D)
        k = apply_rope(k, cos, sin, cfg["rope_style"]).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.transpose(1, 2)
        if Hq != Hkv:  # query head j uses kv head j // (Hq / Hkv)
            k = k.repeat_interleave(Hq // Hkv, dim=1)
            v = v.repeat_interleave(Hq // Hkv, dim=1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))  # (B, Hq, T, T)
        att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, Hq * D)
        h = h + F.linear(o, P[a + "o_proj.weight"])
        x = rmsnorm(h, P[p + "post_attention_layernorm.weight"], eps)
        g = F.linear(x, P[p + "mlp.gate_proj.weight"])
        u = F.linear(x, P[p + "mlp.up_proj.weight"])
        h = h + F.linear(act(g) * u, P[p + "mlp.down_proj.weight"])
    x = rmsnorm(h, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    return F.linear(x, head)


def loss_fn(logits, targets):
    """Mean cross-entropy over targets != -100. targets: (B, T) int64."""
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)


def make_adamw(P, lr, betas, eps, weight_decay):
    """torch AdamW; weight decay only on parameters with ndim >= 2 (not norms or biases)."""
    decay = [t for t in P.values() if t.ndim >= 2]
    no_decay = [t for t in P.values() if t.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


# ---- golden run --------------------------------------------------------------------------

def run(in_dir, out_dir):
    with open(os.path.join(in_dir, "config.json")) as f:
        cfg = check_config(json.load(f))
    with open(os.path.join(in_dir, "train.json")) as f:
        tr = json.load(f)
    for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "steps"):
        if k not in tr:
            raise ValueError(f"train.json is missing '{k}'")
    arrays = read_safetensors(os.path.join(in_dir, "weights.safetensors"))
    batch = read_safetensors(os.path.join(in_dir, "batch.safetensors"))
    ids = torch.from_numpy(batch["input_ids"].astype(np.int64))
    targets = torch.from_numpy(batch["targets"].astype(np.int64))
    if ids.ndim != 2 or ids.shape != targets.shape:
        raise ValueError(f"batch: input_ids {list(ids.shape)} / targets {list(targets.shape)}")
    V = cfg["vocab_size"]
    if ids.numel() and (ids.min() < 0 or ids.max() >= V):
        raise ValueError("batch: input id out of range")
    ok = (targets == -100) | ((targets >= 0) & (targets < V))
    if not bool(ok.all()):
        raise ValueError("batch: target out of range")
    dt = work_dtype(cfg)

    out = OrderedDict()
    P = params_from_arrays(cfg, arrays)
    logits = forward(cfg, P, ids)
    loss = loss_fn(logits, targets)
    loss.backward()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(())
    for name, t in P.items():
        out["grad." + name] = t.grad.detach()

    P = params_from_arrays(cfg, arrays)
    opt = make_adamw(P, tr["lr"], (tr["beta1"], tr["beta2"]), tr["eps"], tr["weight_decay"])
    losses = []
    for _ in range(int(tr["steps"])):
        opt.zero_grad(set_to_none=True)
        l = loss_fn(forward(cfg, P, ids), targets)
        losses.append(l.item())
        l.backward()
        opt.step()
    out["adamw_losses"] = torch.tensor(losses, dtype=dt)
    for name, t in P.items():
        out["final." + name] = t.detach()

    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "outputs.safetensors"), out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: reference_llama.py IN_DIR OUT_DIR")
    torch.manual_seed(0)
    run(sys.argv[1], sys.argv[2])
