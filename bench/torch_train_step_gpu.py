#!/usr/bin/env python3
"""PyTorch peer for the GPU training benchmark: train steps of kiln's LLaMA presets on CUDA.

The model is kiln's llama2.c-style decoder (models/config.cpp): RMSNorm (eps 1e-5), interleaved
RoPE (theta 10000), bias-free q/k/v/o projections, SwiGLU MLP with llama2.c's hidden size, tied
embeddings. It runs as PyTorch is normally used for speed: fp32 parameters under bf16 autocast,
F.scaled_dot_product_attention(is_causal=True) (the flash backend), AdamW(fused=True) with
kiln's settings (lr 5e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices only),
eager or torch.compile. One step = forward, cross-entropy, backward, optimizer step,
zero_grad(set_to_none=True), on a fixed batch of random token ids.

Prints one JSON line:
  {"peer":"pytorch","mode":"eager"|"compile","tok_per_s":...,"mfu":...,"peak_bytes":...}
peak_bytes is torch.cuda.max_memory_allocated over the timed steps (reset after warm-up, as
kiln's tracker is), peak_reserved_bytes the caching allocator's reserved peak, and
driver_used_bytes the device's used memory (torch.cuda.mem_get_info) at the end, context
included. MFU uses kiln's convention (models/mfu.h): 6N + 12 L H Dh T FLOPs per token.

--batch 0 searches the largest power of two <= --max-batch that runs (out-of-memory halves it).
Example: python3 bench/torch_train_step_gpu.py --config stories42M --seq 1024 --batch 0 --compile
"""
import argparse
import gc
import json
import math
import time

PRESETS = {
    # name: vocab, dim, layers, heads, kv heads, context (hidden: llama2.c's rule below)
    "stories260K": dict(vocab_size=512, dim=64, n_layers=5, n_heads=8, n_kv_heads=4, seq=512,
                        hidden_dim=172),
    "stories15M": dict(vocab_size=32000, dim=288, n_layers=6, n_heads=6, n_kv_heads=6, seq=256),
    "stories42M": dict(vocab_size=32000, dim=512, n_layers=8, n_heads=8, n_kv_heads=8, seq=1024),
    "stories110M": dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=12,
                        seq=1024),
}

# Dense bf16 peaks by device name, kiln's table (models/mfu.cpp).
def bf16_peak_tflops(name):
    if "H100" in name:
        if "PCIe" in name:
            return 756.0
        if "NVL" in name:
            return 0.0
        return 989.4
    if "H200" in name:
        return 0.0 if "NVL" in name else 989.4
    return 0.0


def llama2c_hidden_dim(dim, multiple=32):
    h = 2 * (4 * dim) // 3
    return multiple * ((h + multiple - 1) // multiple)


def build(torch, cfg):
    nn, F = torch.nn, torch.nn.functional
    D = cfg["dim"] // cfg["n_heads"]

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * self.weight).to(x.dtype)

    def rope(x, cos, sin):
        # x: (B, T, H, D); interleaved pairs (x[2i], x[2i+1]) rotate by position * freq_i.
        x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
        return out.flatten(-2).to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            C, H, Hkv = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"]
            self.H, self.Hkv = H, Hkv
            self.attention_norm = RMSNorm(C, 1e-5)
            self.wq = nn.Linear(C, H * D, bias=False)
            self.wk = nn.Linear(C, Hkv * D, bias=False)
            self.wv = nn.Linear(C, Hkv * D, bias=False)
            self.wo = nn.Linear(H * D, C, bias=False)
            self.ffn_norm = RMSNorm(C, 1e-5)
            hidden = cfg["hidden_dim"]
            self.w1 = nn.Linear(C, hidden, bias=False)
            self.w2 = nn.Linear(hidden, C, bias=False)
            self.w3 = nn.Linear(C, hidden, bias=False)

        def forward(self, x, cos, sin):
            B, T, C = x.shape
            h = self.attention_norm(x)
            q = rope(self.wq(h).view(B, T, self.H, D), cos, sin)
            k = rope(self.wk(h).view(B, T, self.Hkv, D), cos, sin)
            v = self.wv(h).view(B, T, self.Hkv, D)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True,
                                               enable_gqa=self.Hkv != self.H)
            x = x + self.wo(a.transpose(1, 2).reshape(B, T, self.H * D))
            h = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["dim"])
            self.layers = nn.ModuleList([Block() for _ in range(cfg["n_layers"])])
            self.norm = RMSNorm(cfg["dim"], 1e-5)
            self.output = nn.Linear(cfg["dim"], cfg["vocab_size"], bias=False)
            self.output.weight = self.tok_embeddings.weight  # tied, as llama2.c
            freqs = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
            ang = torch.outer(torch.arange(cfg["max_seq_len"]).float(), freqs)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * cfg["n_layers"]) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, ids, targets):
            T = ids.shape[1]
            x = self.tok_embeddings(ids)
            cos, sin = self.cos[:T], self.sin[:T]
            for layer in self.layers:
                x = layer(x, cos, sin)
            logits = self.output(self.norm(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))

    return Llama()


def flops_per_token(cfg, seq):
    # kiln's matmul_params: every parameter but the input table, the tied head counted once.
    C, L, H, V = cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["vocab_size"]
    D = C // H
    per_layer = C * H * D + 2 * C * cfg["n_kv_heads"] * D + H * D * C + 3 * C * cfg["hidden_dim"] + 2 * C
    n = L * per_layer + C + V * C
    return 6.0 * n + 12.0 * L * H * D * seq, n


def run(torch, args, cfg, seq, batch, steps, warmup):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = build(torch, cfg).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=5e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev).manual_seed(1)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), device=dev, generator=g)
    targets = torch.randint(0, cfg["vocab_size"], (batch, seq), device=dev, generator=g)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t_compile = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t_compile
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        last = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    free_b, total_b = torch.cuda.mem_get_info()
    name = torch.cuda.get_device_name()
    fpt, n_matmul = flops_per_token(cfg, seq)
    peak = args.peak_tflops or bf16_peak_tflops(name)
    tps = batch * seq * steps / dt
    return {
        "peer": "pytorch", "torch": torch.__version__, "mode": "compile" if args.compile else "eager",
        "device": "cuda", "card": name, "dtype": "bf16-autocast",
        "tok_per_s": round(tps, 1), "ms_per_step": round(1000.0 * dt / steps, 3),
        "config": args.config, "batch": batch, "seq": seq,
        "params": sum(p.numel() for p in model.parameters()), "matmul_params": n_matmul,
        "flops_per_token": fpt, "peak_tflops": peak,
        "mfu": round(tps * fpt / (peak * 1e12), 4) if peak else 0.0,
        "loss": round(float(last.item()), 4), "steps": steps, "warmup": warmup,
        "warmup_s": round(warm_s, 2),
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "driver_used_bytes": total_b - free_b, "driver_total_bytes": total_b,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="stories15M", choices=sorted(PRESETS))
    ap.add_argument("--seq", type=int, help="sequence length (default: the preset's context)")
    ap.add_argument("--batch", type=int, default=0, help="0: largest power of two that fits")
    ap.add_argument("--max-batch", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    args = ap.parse_args()
    import torch
    assert torch.cuda.is_available(), "no CUDA device"
    torch.backends.cuda.matmul.allow_tf32 = True
    p = dict(PRESETS[args.config])
    p["max_seq_len"] = p.pop("seq")
    p.setdefault("hidden_dim", llama2c_hidden_dim(p["dim"]))
    seq = args.seq or p["max_seq_len"]
    assert seq <= p["max_seq_len"], f"--seq {seq} exceeds the context {p['max_seq_len']}"

    if args.batch > 0:
        candidates = [args.batch]
    else:
        b = 1
        while b * 2 <= args.max_batch:
            b *= 2
        candidates = []
        while b >= 1:
            candidates.append(b)
            b //= 2
    refused = []
    for b in candidates:
        oom = False
        try:
            res = run(torch, args, p, seq, b, args.steps, args.warmup)
            if args.batch == 0:
                res["batch_search"] = {"max_batch": args.max_batch, "refused": refused}
            print(json.dumps(res), flush=True)
            return 0
        except torch.cuda.OutOfMemoryError:
            oom = True
        except RuntimeError as e:  # compiled kernels report it as a plain RuntimeError
            if "out of memory" not in str(e).lower():
                raise
            oom = True
        if oom:
            # Outside the except block: the traceback (and the model it holds) is gone now.
            refused.append(b)
            gc.collect()
            torch.cuda.empty_cache()
            if args.compile:
                torch._dynamo.reset()
    print(json.dumps({"peer": "pytorch", "oom": True, "refused": refused}), flush=True)
    return 3


if __name__ == "__main__":
    raise SystemExit(main())
