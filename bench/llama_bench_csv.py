"""llama-bench's CSV output (`-o csv`) as the bench drivers collect it, read in one place.

run_decode_bench.sh and run_quant_bench.sh run llama-bench once per test inside each pair, one
repetition each (`-r 1`), and append what it prints to one file: a header row (starting with
`build_commit`) before each test's row. run_quant_bench.sh starts every line with the model kind
(`q8_0,` or `q4_k_m,`); read those with with_kind=True.

    PYTHONPATH=bench python3 -c 'import llama_bench_csv as l; print(l.best(l.read_rows(F)))'
"""
import csv


def read_rows(path, with_kind=False):
    """Each test's row: llama-bench's columns by name, plus
    kind       the line's first field (with_kind), else None;
    test       "prefill" when n_prompt > 0 (a pp test), else "decode" (tg, at depth n_depth);
    tok_per_s  avg_ts, the test's tokens per second."""
    rows, header = [], None
    with open(path, newline="") as f:
        for line in csv.reader(f):
            if not line:
                continue
            kind = None
            if with_kind:
                kind, line = line[0], line[1:]
            if line and line[0] == "build_commit":
                header = line
                continue
            if header is None:
                continue
            r = dict(zip(header, line))
            r["kind"] = kind
            r["test"] = "prefill" if int(r["n_prompt"]) > 0 else "decode"
            r["tok_per_s"] = float(r["avg_ts"])
            rows.append(r)
    return rows


def best(rows):
    """{kind: {"prefill": tok/s, "decode": tok/s, "decode_depth": n, "build": commit,
    "backends": ...}}: the best run of each test, as kiln's side reports the best of its pairs."""
    out = {}
    for r in rows:
        b = out.setdefault(r["kind"], {})
        b[r["test"]] = max(b.get(r["test"], 0.0), r["tok_per_s"])
        b.setdefault(r["test"] + "_runs", []).append(r["tok_per_s"])
        if r["test"] == "decode":
            b["decode_depth"] = int(r.get("n_depth", 0))
        b["build"], b["backends"] = r.get("build_commit", ""), r.get("backends", "")
    return out
