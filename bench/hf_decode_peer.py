#!/usr/bin/env python3
"""The PyTorch peers of kiln's GPU decode (scripts/gpu_check.sh, stage decode).

  python3 bench/hf_decode_peer.py --model DIR [--prompt-len 64] [--new-tokens 128]
                                  [--copy-gib 2] [--copies 10] [--runs 2]

1. The roofline: a device-to-device copy through PyTorch, two --copy-gib GiB buffers, --copies
   copies after one warm-up, timed with CUDA events; GB/s counts bytes read and written.
2. Hugging Face transformers on the same folder kiln decodes: AutoModelForCausalLM in bf16 with
   SDPA, prompt ids 1..--prompt-len, --new-tokens new tokens, greedy, cache_implementation
   "static" (transformers compiles the decode step for a static cache on the first run). The
   last of --runs runs is timed (the first includes compiling); then a prefill alone
   (max_new_tokens 1) is timed, so that decode_tok_s = (new - 1) / (t_generate - t_prefill)
   compares with kiln's decode rate (which excludes the prefill), and
   tok_per_s_with_prefill = new / t_generate with the figure quoted for the first H200 run.
After each phase one JSON line goes to stdout, each holding everything so far, so a run stopped
by its time limit still leaves what it measured (the last line is the result).
Timings never run with synchronous launches: CUDA_LAUNCH_BLOCKING is set to 0 before torch
loads (the line records what it was).
"""
import argparse
import json
import os
import sys
import time

INHERITED_LAUNCH_BLOCKING = os.environ.get("CUDA_LAUNCH_BLOCKING", "unset")
os.environ["CUDA_LAUNCH_BLOCKING"] = "0"

res = {"peer": "hf_decode_peer", "env": {"CUDA_LAUNCH_BLOCKING": "0",
                                         "CUDA_LAUNCH_BLOCKING_inherited": INHERITED_LAUNCH_BLOCKING}}


def emit(**kw):
    res.update(kw)
    print(json.dumps(res), flush=True)


def copy_bandwidth(torch, gib, copies):
    n = int(gib * (1 << 30))
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty(n, dtype=torch.uint8, device="cuda")
    a.fill_(1)
    b.copy_(a)  # warm-up
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(copies):
        b.copy_(a)
    stop.record()
    torch.cuda.synchronize()
    s = start.elapsed_time(stop) / 1e3
    del a, b
    torch.cuda.empty_cache()
    return {"copy_bytes": n, "copies": copies, "copy_s": round(s, 6),
            "copy_gbs": round(2 * n * copies / s / 1e9, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face folder (config.json, safetensors)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--copy-gib", type=float, default=2.0)
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--runs", type=int, default=2, help="generate runs; the last is timed")
    a = p.parse_args()

    t0 = time.perf_counter()
    import torch
    if not torch.cuda.is_available():
        emit(error="torch sees no CUDA device")
        return 2
    emit(torch=torch.__version__, card=torch.cuda.get_device_name(0),
         import_torch_s=round(time.perf_counter() - t0, 2))
    emit(**copy_bandwidth(torch, a.copy_gib, a.copies))

    t = time.perf_counter()
    import transformers
    from transformers import AutoModelForCausalLM
    kw = dict(attn_implementation="sdpa", device_map="cuda")
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, **kw)
    except TypeError:  # transformers before 4.56 names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16, **kw)
    model.eval()
    torch.cuda.synchronize()
    emit(transformers=transformers.__version__, load_s=round(time.perf_counter() - t, 2),
         dtype=str(next(model.parameters()).dtype), attn_implementation="sdpa",
         cache_implementation="static", prompt_tokens=a.prompt_len, new_tokens=a.new_tokens)

    ids = torch.arange(1, a.prompt_len + 1, dtype=torch.long, device="cuda").unsqueeze(0)
    mask = torch.ones_like(ids)

    extra = {}  # disable_compile=True once compiling has failed

    def generate(new):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, num_beams=1,
                             cache_implementation="static", **extra)  # no_grad inside
        torch.cuda.synchronize()
        return time.perf_counter() - t, out.shape[1] - ids.shape[1], out[0, ids.shape[1]:]

    try:  # the first run compiles the static-cache decode step (transformers does it itself)
        first = generate(a.new_tokens)
    except Exception as e:  # noqa: BLE001 -- recorded; the eager static cache is still a peer
        emit(compile_error=f"{type(e).__name__}: {e}"[-1000:])
        extra["disable_compile"] = True
        first = generate(a.new_tokens)
    emit(compiled=getattr(model, "_compiled_call", None) is not None and not extra,
         first_run_s=round(first[0], 3))

    runs = [round(first[0], 4)]
    s, n, toks = first
    emit(run_s=runs, generated=n)
    for _ in range(max(1, a.runs) - 1):
        s, n, toks = generate(a.new_tokens)
        runs.append(round(s, 4))
        emit(run_s=runs, generated=n)
    emit(generate_s=round(s, 4), tok_per_s_with_prefill=round(n / s, 2),
         first_tokens=[int(x) for x in toks[:32]])
    pre = [generate(1)[0] for _ in range(2)]  # prefill + the first token; the second timed
    prefill_s = pre[-1]
    decode_s = s - prefill_s
    emit(prefill_s=round(prefill_s, 4), decode_s=round(decode_s, 4),
         decode_tok_s=round((n - 1) / decode_s, 2) if decode_s > 0 else None,
         peak_bytes=torch.cuda.max_memory_allocated())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # the line says what failed; the exit status says that it did
        emit(error=f"{type(e).__name__}: {e}"[-2000:])
        raise
