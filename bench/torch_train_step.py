#!/usr/bin/python3
"""PyTorch peer for the CPU training benchmark: full train steps of a tiny LLaMA.

One step = forward, cross-entropy, backward, AdamW step, zero_grad, on a fixed batch of random
token ids. The model is the golden reference's (tests/golden/reference_llama.py), so kiln and
this peer run the same math. --mode picks how PyTorch runs it:
  fp32          fp32 eager
  fp32-compile  fp32 with the forward + loss under torch.compile (inductor)
  bf16          bf16 autocast, eager (f32 weights and AdamW state; matmuls in bf16)
  bf16-compile  bf16 autocast with the forward + loss under torch.compile (inductor)
Prints one JSON line:
  {"peer":"pytorch","mode":...,"torch":...,"threads":N,"tok_per_s":...,"ms_per_step":...}
Example: /usr/bin/python3 bench/torch_train_step.py --threads 2 --config stories15M
"""
import argparse
import json
import os
import sys
import time

# llama2.c-style presets (interleaved RoPE, tied embeddings, no biases, no QK-norm).
PRESETS = {
    "stories15M": dict(vocab_size=32000, dim=288, n_layers=6, n_heads=6, n_kv_heads=6,
                       hidden_dim=768, seq=256),
    # kiln's shakespeare-char preset (models/config.cpp): 1,783,680 parameters. run_cpu_bench.sh
    # checks that both peers report the same parameter count before it prints a ratio.
    "shakespeare-char": dict(vocab_size=65, dim=192, n_layers=4, n_heads=4, n_kv_heads=4,
                             hidden_dim=512, seq=128),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="stories15M", choices=sorted(PRESETS))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, help="sequence length (default: the preset's)")
    ap.add_argument("--mode", default="fp32", choices=["fp32", "fp32-compile", "bf16", "bf16-compile"],
                    help="fp32 eager, fp32 + torch.compile, bf16 autocast eager, or bf16 "
                         "autocast + torch.compile")
    for k in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, dest=k,
                        help="override the preset's " + k)
    ap.add_argument("--passive-wait", action="store_true",
                    help="OMP_WAIT_POLICY=passive: idle OpenMP threads sleep instead of spinning "
                         "(much faster when other processes share the cores; slower on a quiet "
                         "machine)")
    args = ap.parse_args()

    # torch's GEMMs go to Debian's OpenBLAS (pthreads), which sizes its own pool from the
    # environment at load time: pin both pools to --threads before importing torch.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    if args.passive_wait:
        os.environ["OMP_WAIT_POLICY"] = "passive"
    global torch, ref
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "golden"))
    import reference_llama as ref
    torch.set_num_threads(args.threads)
    p = dict(PRESETS[args.config])
    for k in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim"):
        if getattr(args, k) is not None:
            p[k] = getattr(args, k)
    seq = args.seq or p.pop("seq")
    p.pop("seq", None)
    cfg = ref.check_config(dict(p, head_dim=p["dim"] // p["n_heads"], norm_eps=1e-5,
                                rope_theta=10000.0, rope_style="interleaved", qk_norm=False,
                                qkv_bias=False, tie_embeddings=True))

    torch.manual_seed(0)
    P = ref.init_params(cfg, seed=0, std=0.02)
    opt = ref.make_adamw(P, lr=5e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg["vocab_size"], (args.batch, seq), generator=g)
    targets = torch.randint(0, cfg["vocab_size"], (args.batch, seq), generator=g)

    def forward_loss():
        return ref.loss_fn(ref.forward(cfg, P, ids), targets)

    if args.mode.endswith("-compile"):
        forward_loss = torch.compile(forward_loss)

    def step():
        if args.mode.startswith("fp32"):
            loss = forward_loss()
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward_loss()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    load_before = os.getloadavg()[0]  # other work on the cores skews the figure; report it
    for _ in range(args.warmup):
        step()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        last = step()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0  # all threads: under load, closer to the work than dt
    n_params = sum(t.numel() for t in P.values())
    print(json.dumps({
        "peer": "pytorch", "mode": args.mode, "torch": torch.__version__, "threads": args.threads,
        "tok_per_s": round(args.batch * seq * args.steps / dt, 1),
        "ms_per_step": round(1000.0 * dt / args.steps, 2),
        "cpu_ms_per_step": round(1000.0 * cpu / args.steps, 2),
        "config": args.config, "batch": args.batch, "seq": seq, "params": n_params,
        "loss": round(last, 4), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "loadavg_1m": round(load_before, 2),
    }))


if __name__ == "__main__":
    main()
