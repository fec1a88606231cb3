#!/usr/bin/env python3
"""scripts/gpu_check.sh's results: results.json, summary.md and logs.tar.gz in OUTDIR, rewritten
after every step from the work folder, so that a killed command still returns what ran.

The work folder (gpu_check.sh writes it):
  logs/NAME.log   a step's output;  logs/NAME.rc  "exit_status seconds how kind limit"
                  (how: done, timeout, deadline (cut by the deadline) or killed);  logs/NAME.xml  gtest XML (gtest steps)
  logs/NAME.env   the step's VAR=value words, the last line the CUDA_LAUNCH_BLOCKING it ran with
  notes.txt, gpus.csv, manifest.env, libdirs, missing_libs, not_run (steps the deadline skipped),
  nvidia-smi.txt, libs.txt (ldd, RPATH, the probe's lines), decode.txt (the decode stage's
  random folder: dir=, reused=, paused_s=)

  gpu_check_results.py --work W --out O --status S ...   write the three files (and
                                                          decode_8b.json once a decode step ran)
  gpu_check_results.py --work W --verdict                 print ok, failed or incomplete
Standard library only (the GPU machine has a bare Python).
"""
import argparse
import glob
import io
import json
import os
import re
import socket
import sys
import tarfile
import xml.etree.ElementTree as ET

# A skip message that names CUDA, a GPU or a device: on a GPU machine such a test should have
# run, so its skip is a failure, unless the test says it is meant to skip there.
CUDA_SKIP = re.compile(r"cuda|gpu|device", re.I)
EXPECTED_SKIP = "[expected-skip]"
ARCHIVE_LIMIT = 8 << 20  # bytes: the logs archive must come back (16 MiB per file, and margin)


def classify_skip(message, gpu_found):
    """'expected' (the marker), 'cuda' (a CUDA skip: a failure on a GPU machine) or 'other'."""
    if EXPECTED_SKIP in message:
        return "expected"
    if CUDA_SKIP.search(message):
        return "cuda_fail" if gpu_found else "cuda"
    return "other"


def parse_gtest_xml(path, gpu_found):
    r = {"passed": 0, "failed": 0, "skipped": 0, "cuda_skipped": 0, "expected_skipped": 0,
         "total": 0, "failed_tests": [], "skipped_tests": []}
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        r["xml_error"] = str(e)
        return r
    for case in root.iter("testcase"):
        if case.get("status") == "notrun":
            continue  # DISABLED_ tests
        name = f"{case.get('classname')}.{case.get('name')}"
        r["total"] += 1
        if case.find("failure") is not None or case.find("error") is not None:
            r["failed"] += 1
            r["failed_tests"].append(name)
            continue
        sk = case.find("skipped")
        if case.get("result") == "skipped" or sk is not None:
            msg = " ".join(((sk.get("message") or sk.text or "") if sk is not None else "").split())
            r["skipped"] += 1
            r["skipped_tests"].append(f"{name}: {msg[:200]}")
            kind = classify_skip(msg, gpu_found)
            if kind == "expected":
                r["expected_skipped"] += 1
            elif kind in ("cuda", "cuda_fail"):
                r["cuda_skipped"] += 1
                if kind == "cuda_fail":
                    r["failed_tests"].append(f"{name} (skipped on a GPU machine: {msg[:160]})")
            continue
        r["passed"] += 1
    return r


def sanitizer_summary(log):
    """(errors or None, guard violations) from a compute-sanitizer log."""
    m = re.search(r"ERROR SUMMARY: (\d+) error", log) or \
        re.search(r"RACECHECK SUMMARY: (\d+) hazard", log)
    return (int(m.group(1)) if m else None), log.count("guard bytes overwritten")


def read_text(path, limit=None):
    try:
        with open(path, errors="replace") as f:
            return f.read() if limit is None else f.read(limit)
    except OSError:
        return ""


def read_env(path):
    """logs/NAME.env as a dict (the last CUDA_LAUNCH_BLOCKING line is the one the step ran with)."""
    env = {}
    for line in read_text(path).splitlines():
        k, sep, v = line.strip().partition("=")
        if sep:
            env[k] = v
    return env


def collect_steps(work, gpu_found):
    steps = {}
    for rc_file in sorted(glob.glob(f"{work}/logs/*.rc"), key=os.path.getmtime):
        name = os.path.basename(rc_file)[:-3]
        f = read_text(rc_file).split()
        rc, secs = int(f[0]), int(f[1])
        how = f[2] if len(f) > 2 else "done"
        kind = f[3] if len(f) > 3 else "cmd"
        s = {"kind": kind, "exit_code": rc, "seconds": secs, "how": how}
        if len(f) > 4:
            s["limit"] = int(f[4])
        if os.path.exists(f"{work}/logs/{name}.env"):
            s["env"] = read_env(f"{work}/logs/{name}.env")
        ok = rc == 0
        if kind == "gtest":
            xml = f"{work}/logs/{name}.xml"
            if os.path.exists(xml):
                s.update(parse_gtest_xml(xml, gpu_found))
                ok = ok and s["failed"] == 0 and not (gpu_found and s["cuda_skipped"])
            else:
                s["note"] = "no gtest XML: it crashed or was stopped before writing it"
                ok = False
        elif kind == "sanitizer":
            errors, guards = sanitizer_summary(read_text(f"{work}/logs/{name}.log"))
            s["errors"], s["guard_violations"] = errors, guards
            ok = ok and errors == 0 and guards == 0
        s["result"] = "pass" if ok else how if how in ("timeout", "deadline", "killed") else "fail"
        steps[name] = s
    return steps


def verdict(work):
    steps = collect_steps(work, gpu_found=os.path.exists(f"{work}/gpus.csv"))
    if any(s["result"] not in ("pass", "deadline") for s in steps.values()):
        return "failed"
    if read_text(f"{work}/not_run").strip():
        return "incomplete"
    return "ok" if steps else "incomplete"


def compact(data, head=64 << 10, tail=192 << 10):
    """A log cut to its head and tail when longer than both (the middle is rarely the news)."""
    if len(data) <= head + tail:
        return data
    cut = len(data) - head - tail
    return data[:head] + f"\n... [{cut} bytes cut by gpu_check] ...\n".encode() + data[-tail:]


def write_archive(work, path):
    """logs/*.log|xml|rc and the notes as a .tar.gz under ARCHIVE_LIMIT (no training outputs)."""
    files = sorted(glob.glob(f"{work}/logs/*")) + [
        f"{work}/{n}" for n in ("notes.txt", "manifest.env", "gpus.csv", "libdirs", "not_run",
                                "nvidia-smi.txt", "libs.txt", "decode.txt")]
    for head, tail in ((64 << 10, 192 << 10), (16 << 10, 48 << 10), (4 << 10, 12 << 10)):
        tmp = path + ".tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for f in files:
                if not os.path.isfile(f) or not f.endswith((".log", ".xml", ".rc", ".txt", ".env",
                                                             ".csv", "libdirs", "not_run")):
                    continue
                with open(f, "rb") as fh:
                    data = compact(fh.read(), head, tail)
                info = tarfile.TarInfo("logs/" + os.path.basename(f))
                info.size = len(data)
                info.mtime = int(os.path.getmtime(f))
                tar.addfile(info, io.BytesIO(data))
        if os.path.getsize(tmp) <= ARCHIVE_LIMIT:
            break
    os.replace(tmp, path)  # atomic: a kill never leaves half an archive


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def num(pattern, text, cast=float):
    m = re.search(pattern, text)
    return cast(m.group(1)) if m else None


def parse_kiln_generate(log):
    """The figures of `kiln generate` output (tokens/s, bytes per token, the generated ids)."""
    r = {
        "load_s": num(r"loaded \S+ from .* in ([0-9.]+) s", log),
        "prompt_tokens": num(r"--- (\d+) prompt tokens", log, int),
        "new_tokens": num(r"prompt tokens, (\d+) new", log, int),
        "ttft_ms": num(r"time to first token\s+([0-9.]+) ms", log),
        "prefill_tok_s": num(r"prefill\s+([0-9.]+) tokens/s", log),
        "decode_tok_s": num(r"decode\s+([0-9.]+) tokens/s", log),
        "decode_tokens": num(r"decode\s+[0-9.]+ tokens/s \((\d+) tokens in", log, int),
        "decode_s": num(r"decode\s+[0-9.]+ tokens/s \(\d+ tokens in ([0-9.]+) s\)", log),
        "bytes_per_token_mb": num(r"= ([0-9.]+) MB ->", log),
        "decode_gbs": num(r"-> ([0-9.]+) GB/s at the decode rate", log),
    }
    if r["new_tokens"] and r["ttft_ms"] is not None and r["decode_s"] is not None:
        r["tok_per_s_with_prefill"] = round(r["new_tokens"] / (r["ttft_ms"] / 1e3 + r["decode_s"]), 2)
    m = re.search(r"^[0-9 ]+\| ([0-9 ]+)", log, re.M)  # "prompt ids | generated ids"
    if m:
        r["first_tokens"] = [int(x) for x in m.group(1).split()[:32]]
    return r


def last_json_line(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def ratio(x, y, nd=3):
    return round(x / y, nd) if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else None


def decode_report(work, steps, card, commit):
    """decode_8b.json's content (None before any decode step ran): kiln's Qwen3-8B decode, HF
    transformers' static-cache decode of the same folder, the copy roofline and the ratios."""
    if not any(n in steps for n in ("decode_write", "decode_kiln", "decode_kiln_cublaslt",
                                    "decode_kiln_generic_attention", "decode_hf")):
        return None
    info = read_env(f"{work}/decode.txt")  # dir=, reused=, paused_s= (the last one counts)
    w = steps.get("decode_write", {})
    rep = {"bench": "decode_8b", "card": card, "commit": commit,
           "model": "Qwen3-8B config (data/qwen/Qwen3-8B/config.json), random bf16 weights",
           "prompt_ids": "1..64", "sampling": "greedy",
           "folder": {"dir": info.get("dir"), "reused": info.get("reused") == "1",
                      "write_result": w.get("result"), "write_s": w.get("seconds"),
                      "write_paused_s": int(info.get("paused_s", 0))},
           "kiln": None, "kiln_cublaslt": None, "kiln_generic_attention": None, "kiln_q8_0": None,
           "kiln_q4_k_m": None, "kiln_q4_k_m_warp": None,
           "hf": None, "copy_gbs": None,
           "ratios": {}}
    for key, step in (("kiln", "decode_kiln"), ("kiln_cublaslt", "decode_kiln_cublaslt"),
                      ("kiln_generic_attention", "decode_kiln_generic_attention"),
                      ("kiln_q8_0", "decode_kiln_q8_0"), ("kiln_q4_k_m", "decode_kiln_q4_k_m"),
                      ("kiln_q4_k_m_warp", "decode_kiln_q4_k_m_warp")):
        k = steps.get(step)
        if k:
            rep[key] = dict(parse_kiln_generate(read_text(f"{work}/logs/{step}.log")),
                            result=k["result"], env=k.get("env"), seconds=k["seconds"])
    h = steps.get("decode_hf")
    if h:
        line = last_json_line(read_text(f"{work}/logs/decode_hf.log")) or {}
        rep["hf"] = dict(line, result=h["result"], env=dict(h.get("env") or {}, **line.get("env", {})),
                         seconds=h["seconds"])
        rep["copy_gbs"] = line.get("copy_gbs")
    sv = steps.get("serve_8b")
    if sv:  # kiln serve on the same folder (scripts/gpu_serve_check.sh load)
        line = last_json_line(read_text(f"{work}/logs/serve_8b.log")) or {}
        rep["serve"] = dict(line, result=sv["result"], seconds=sv["seconds"])
    kd, hd = rep["kiln"] or {}, rep["hf"] or {}
    bpt = kd.get("bytes_per_token_mb")
    if bpt and hd.get("decode_tok_s"):
        hd["decode_gbs"] = round(bpt * hd["decode_tok_s"] / 1e3, 1)
    rep["ratios"] = {k: v for k, v in {
        "decode_tok_s_kiln_over_hf": ratio(kd.get("decode_tok_s"), hd.get("decode_tok_s")),
        "tok_per_s_with_prefill_kiln_over_hf": ratio(kd.get("tok_per_s_with_prefill"),
                                                     hd.get("tok_per_s_with_prefill")),
        "kiln_decode_gbs_over_copy": ratio(kd.get("decode_gbs"), rep["copy_gbs"]),
        "hf_decode_gbs_over_copy": ratio(hd.get("decode_gbs"), rep["copy_gbs"]),
        "decode_tok_s_kiln_gemv_over_cublaslt": ratio(kd.get("decode_tok_s"),
                                                      (rep["kiln_cublaslt"] or {}).get("decode_tok_s")),
        "decode_tok_s_kiln_decode_attention_over_generic": ratio(
            kd.get("decode_tok_s"), (rep["kiln_generic_attention"] or {}).get("decode_tok_s")),
        "decode_tok_s_kiln_q8_0_over_bf16": ratio((rep["kiln_q8_0"] or {}).get("decode_tok_s"),
                                                  kd.get("decode_tok_s")),
        "kiln_q8_0_decode_gbs_over_copy": ratio((rep["kiln_q8_0"] or {}).get("decode_gbs"),
                                                rep["copy_gbs"]),
        "decode_tok_s_kiln_q4_k_m_over_bf16": ratio((rep["kiln_q4_k_m"] or {}).get("decode_tok_s"),
                                                    kd.get("decode_tok_s")),
        "kiln_q4_k_m_decode_gbs_over_copy": ratio((rep["kiln_q4_k_m"] or {}).get("decode_gbs"),
                                                  rep["copy_gbs"]),
        "decode_tok_s_q4_k_m_rows_over_warp": ratio((rep["kiln_q4_k_m"] or {}).get("decode_tok_s"),
                                                    (rep["kiln_q4_k_m_warp"] or {}).get("decode_tok_s")),
    }.items() if v is not None}
    a, b = kd.get("first_tokens"), hd.get("first_tokens")
    if a and b:  # the same weights, greedy: the first generated ids should agree
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        rep["first_tokens_agree"] = f"{n} of {min(len(a), len(b))}"
    return rep


def decode_markdown(rep):
    kd, hd = rep["kiln"] or {}, rep["hf"] or {}
    f = lambda v, fmt="{:.1f}": "" if v is None else fmt.format(v)
    md = ["", "## Qwen3-8B decode (random bf16 folder, 64 prompt ids, 128 new tokens, greedy)", "",
          "| peer | result | decode tok/s | tok/s with prefill | decode GB/s | of copy |",
          "| --- | --- | --- | --- | --- | --- |"]
    for name, d, key in (("kiln", kd, "kiln_decode_gbs_over_copy"),
                         ("kiln, cuBLASLt GEMVs (KILN_CUDA_GEMV=0)", rep.get("kiln_cublaslt") or {},
                          None),
                         ("kiln, generic attention for decode (KILN_CUDA_DECODE_ATTENTION=0)",
                          rep.get("kiln_generic_attention") or {}, None),
                         ("kiln, Q8_0 weights (quantized GEMV)", rep.get("kiln_q8_0") or {},
                          "kiln_q8_0_decode_gbs_over_copy"),
                         ("kiln, Q4_K_M weights (quantized GEMV)", rep.get("kiln_q4_k_m") or {},
                          "kiln_q4_k_m_decode_gbs_over_copy"),
                         ("kiln, Q4_K_M, one row per warp (KILN_CUDA_QGEMV_ROWS=0)",
                          rep.get("kiln_q4_k_m_warp") or {}, None),
                         ("HF transformers, static cache", hd, "hf_decode_gbs_over_copy")):
        if d:
            md.append(f"| {name} | {d.get('result', '')}{' (' + d['error'][:80] + ')' if d.get('error') else ''} "
                      f"| {f(d.get('decode_tok_s'))} | {f(d.get('tok_per_s_with_prefill'))} "
                      f"| {f(d.get('decode_gbs'))} | {f(rep['ratios'].get(key) if key else None, '{:.3f}')} |")
    fo = rep["folder"]
    md += ["", f"- copy roofline (PyTorch d2d, read + write): {f(rep['copy_gbs'])} GB/s",
           "- ratios: " + (", ".join(f"{k} {v}" for k, v in rep["ratios"].items()) or "none yet"),
           f"- folder: {fo['dir']}, " + ("reused" if fo["reused"] else
                                         f"written in {fo['write_s']} s ({fo['write_result']}; "
                                         f"paused {fo['write_paused_s']} s for timing steps)")]
    sv = rep.get("serve") or {}
    if sv.get("levels"):
        md.append("- kiln serve (64-token prompts, 64 new each): " + ", ".join(
            f"{l['concurrency']} streams {l['aggregate_tokens_per_s']:.1f} tok/s "
            f"(TTFT p50 {l['ttft_p50_s'] * 1e3:.0f} ms, errors {l['errors']})" for l in sv["levels"])
            + "".join(f"; {n} over 1 stream {sv[f'tok_s_{n}_over_1']}x" for n in (8, 32)
                      if f"tok_s_{n}_over_1" in sv))
    elif sv:
        md.append(f"- kiln serve: {sv.get('result')}")
    if "first_tokens_agree" in rep:
        md.append(f"- first generated ids, kiln vs HF: {rep['first_tokens_agree']} agree")
    return md


def write(a):
    work, out = a.work, a.out
    gpu_found = a.gpu_found == "1"
    gpus = []
    for line in read_text(f"{work}/gpus.csv").splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 4:
            gpus.append({"name": f[0], "driver": f[1], "memory": f[2], "compute_cap": f[3]})
    manifest = {}
    for line in read_text(f"{work}/manifest.env").splitlines():
        k, _, v = line.strip().partition("=")
        if k:
            manifest[k.replace("KILN_BUNDLE_", "").lower()] = v.strip("'")
    steps = collect_steps(work, gpu_found)
    not_run = read_text(f"{work}/not_run").split()
    notes = [n for n in read_text(f"{work}/notes.txt").splitlines() if n]
    keys = ("passed", "failed", "skipped", "cuda_skipped", "expected_skipped", "total")
    totals = {k: sum(s.get(k, 0) for s in steps.values()) for k in keys}
    probe = sorted({line for line in read_text(f"{work}/libs.txt").splitlines()
                    if line.startswith("probe:")})
    card = gpus[0]["name"] if gpus else None
    decode = decode_report(work, steps, card, a.commit)
    res = {
        "schema": 3, "status": a.status, "date": a.started, "seconds": a.seconds,
        "host": socket.gethostname(), "commit": a.commit, "bundle": manifest,
        "stages": a.stages.split(), "gpu_found": gpu_found, "gpus": gpus,
        "card": card,
        "cuda_lib_dirs": [d for d in read_text(f"{work}/libdirs").strip().split(":") if d],
        "missing_libs": read_text(f"{work}/missing_libs").split(),
        "probe": probe,
        "timing_env": {n: s.get("env", {}).get("CUDA_LAUNCH_BLOCKING") for n, s in steps.items()
                       if s["kind"] == "bench"},
        "steps": steps, "not_run": not_run, "totals": totals, "notes": notes,
        "decode_8b": decode,
    }
    write_atomic(f"{out}/results.json", json.dumps(res, indent=2) + "\n")
    if decode is not None:
        write_atomic(f"{out}/decode_8b.json", json.dumps(decode, indent=2) + "\n")

    md = [f"# kiln gpu_check: {a.status}", "",
          f"- stages: {a.stages}; date {a.started} ({a.seconds} s), host {res['host']}",
          f"- commit: {a.commit} (bundle built from {manifest.get('commit', '?')} on "
          f"{manifest.get('date', '?')}, {manifest.get('nvcc', '?')})",
          "- GPU: " + (", ".join(f"{g['name']} (driver {g['driver']}, {g['memory']})"
                                 for g in gpus) or "none found"),
          "- CUDA libraries from: " + (", ".join(res["cuda_lib_dirs"]) or "the system paths")
          + (f"; missing: {' '.join(res['missing_libs'])}" if res["missing_libs"] else ""), ""]
    if steps:
        md += ["| step | result | passed | failed | skipped (CUDA) | errors | seconds |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, s in steps.items():
            err = s.get("errors")
            md.append(f"| {name} | {s['result']} | {s.get('passed', '')} | {s.get('failed', '')} "
                      f"| {s.get('skipped', '')}"
                      + (f" ({s['cuda_skipped']})" if s.get("skipped") else "")
                      + f" | {'' if err is None else err} | {s['seconds']} |")
        md.append(f"| **all** | | {totals['passed']} | {totals['failed']} | {totals['skipped']} "
                  f"({totals['cuda_skipped']}) | | {a.seconds} |")
    failed = [f"{n}: {t}" for n, s in steps.items() for t in s.get("failed_tests", [])]
    failed += [f"{n}: {s['result']} (exit {s['exit_code']})" for n, s in steps.items()
               if s["result"] not in ("pass", "deadline") and not s.get("failed_tests")]
    if failed:
        md += ["", "Failed:", *[f"- {t}" for t in failed[:60]]]
    if not_run:
        md += ["", "Not run (deadline): " + ", ".join(dict.fromkeys(not_run))]
    if res["timing_env"]:
        md += ["", "Timing steps ran with: " + ", ".join(
            f"{n} CUDA_LAUNCH_BLOCKING={v}" for n, v in res["timing_env"].items())]
    if decode is not None:
        md += decode_markdown(decode)
    if probe:
        md += ["", "Libraries loaded (the probe; libs.txt and nvidia-smi.txt are in logs.tar.gz):",
               *[f"- {p}" for p in probe[:12]]]
    skipped = [t for s in steps.values() for t in s.get("skipped_tests", [])]
    if skipped:
        md += ["", "Skipped tests:", *[f"- {t}" for t in skipped[:30]]]
    if notes:
        md += ["", "Notes:", *[f"- {n}" for n in notes]]
    md += ["", "Logs: logs.tar.gz (logs/STEP.log, STEP.xml, STEP.rc, STEP.env; logs/libs.txt, "
           "logs/nvidia-smi.txt)."]
    write_atomic(f"{out}/summary.md", "\n".join(md) + "\n")
    write_archive(work, f"{out}/logs.tar.gz")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--out")
    p.add_argument("--verdict", action="store_true")
    p.add_argument("--status", default="running")
    p.add_argument("--started", default="")
    p.add_argument("--seconds", type=int, default=0)
    p.add_argument("--gpu-found", default="0")
    p.add_argument("--stages", default="")
    p.add_argument("--commit", default="unknown")
    a = p.parse_args()
    if a.verdict:
        print(verdict(a.work))
        return 0
    if not a.out:
        p.error("--out is needed")
    write(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
