#!/usr/bin/env python3
"""A bounded load generator for OpenAI-compatible servers (kiln serve, llama.cpp's llama-server).

    bench/serve_load.py --url http://127.0.0.1:8080 --concurrency 1,8,32 --requests-per-stream 2

Each level runs `concurrency` client threads; each thread sends `requests-per-stream` streaming
/v1/completions requests one after another (the same prompt of --prompt-tokens token ids, seed =
thread, max_tokens --max-tokens, ignore_eos so every request generates exactly max_tokens;
temperature 0.8, top_k 40, top_p 0.95, min_p 0.05: llama-server's defaults, sent to both). From
the SSE stream it takes the time to first token and every inter-token gap. Per level it prints
and returns aggregate tokens/s (generated tokens over the level's wall time), TTFT p50/p99 and
inter-token latency p50/p99. Standard library only; every request has a timeout, so a stuck
server ends the run instead of hanging it.
"""
import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def one_request(url, prompt, max_tokens, seed, timeout):
    # llama-server's default sampling, stated, so both servers sample the same way.
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": True,
                       "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    stamps = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            ev = json.loads(line[6:])
            ch = ev.get("choices") or [{}]
            # llama-server sends one event per token (text may be empty for a partial UTF-8
            # sequence); kiln one per token with text. Count events that carry a token.
            if ch[0].get("finish_reason") is None or ch[0].get("text"):
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError("no tokens streamed")
    ttft = stamps[0] - t0
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return ttft, gaps, len(stamps)


def run_level(url, n, per_stream, prompt, max_tokens, timeout):
    ttfts, gaps, tokens, errors = [], [], [0], []
    lock = threading.Lock()

    def worker(i):
        for j in range(per_stream):
            try:
                t, g, k = one_request(url, prompt, max_tokens, 1000 * i + j, timeout)
            except Exception as e:  # a failed request is reported, not hidden
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                ttfts.append(t)
                gaps.extend(g)
                tokens[0] += k

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "concurrency": n,
        "requests": n * per_stream,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "generated_tokens": tokens[0],
        "wall_s": wall,
        "aggregate_tokens_per_s": tokens[0] / wall if wall > 0 else 0,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(gaps, 50),
        "itl_p99_s": percentile(gaps, 99),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    prompt = [100 + (7 * i) % 5000 for i in range(a.prompt_tokens)]
    out = []
    for n in [int(x) for x in a.concurrency.split(",")]:
        r = run_level(a.url, n, a.requests_per_stream, prompt, a.max_tokens, a.timeout)
        out.append(r)
        print(f"{n:3d} streams: {r['aggregate_tokens_per_s']:8.2f} tok/s  "
              f"ttft p50 {r['ttft_p50_s']*1e3:7.1f} ms p99 {r['ttft_p99_s']*1e3:7.1f} ms  "
              f"itl p50 {r['itl_p50_s']*1e3:6.1f} ms p99 {r['itl_p99_s']*1e3:6.1f} ms  "
              f"errors {r['errors']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if any(r["errors"] for r in out) else 0


if __name__ == "__main__":
    sys.exit(main())
