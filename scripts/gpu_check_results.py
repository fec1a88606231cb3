#!/usr/bin/env python3
"""scripts/gpu_check.sh's results: results.json, summary.md and logs.tar.gz in OUTDIR, rewritten
after every step from the work folder, so that a killed command still returns what ran.

The work folder (gpu_check.sh writes it):
  logs/NAME.log   a step's output;  logs/NAME.rc  "exit_status seconds how kind limit"
                  (how: done, timeout, deadline (cut by the deadline) or killed);  logs/NAME.xml  gtest XML (gtest steps)
  notes.txt, gpus.csv, manifest.env, libdirs, missing_libs, not_run (steps the deadline skipped)

  gpu_check_results.py --work W --out O --status S ...   write the three files
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
        f"{work}/{n}" for n in ("notes.txt", "manifest.env", "gpus.csv", "libdirs", "not_run")]
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
    res = {
        "schema": 2, "status": a.status, "date": a.started, "seconds": a.seconds,
        "host": socket.gethostname(), "commit": a.commit, "bundle": manifest,
        "stages": a.stages.split(), "gpu_found": gpu_found, "gpus": gpus,
        "card": gpus[0]["name"] if gpus else None,
        "cuda_lib_dirs": [d for d in read_text(f"{work}/libdirs").strip().split(":") if d],
        "missing_libs": read_text(f"{work}/missing_libs").split(),
        "steps": steps, "not_run": not_run, "totals": totals, "notes": notes,
    }
    write_atomic(f"{out}/results.json", json.dumps(res, indent=2) + "\n")

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
        md += ["", "Not run (deadline): " + ", ".join(not_run)]
    skipped = [t for s in steps.values() for t in s.get("skipped_tests", [])]
    if skipped:
        md += ["", "Skipped tests:", *[f"- {t}" for t in skipped[:30]]]
    if notes:
        md += ["", "Notes:", *[f"- {n}" for n in notes]]
    md += ["", "Logs: logs.tar.gz (logs/STEP.log, STEP.xml, STEP.rc)."]
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
