#!/usr/bin/python3
"""Markdown report for bench/run_pytorch.sh: one table of results, one of swiftcpp/PyTorch ratios.

Usage: report.py --command "CMD" RESULT.json...
Each result file holds the stdout of one benchmark program; its last line that parses as a JSON object is used
(keys: impl, model, threads, prompt_len, new_tokens, prefill_tok_s, decode_tok_s {median,min,max}, peak_rss_mb,
generated_ids). Rows keep the order of the files. Exit status 2 when swiftcpp and a baseline generated
different ids (the report is still printed).
"""

import argparse
import datetime
import json
import os
import platform
import sys

BLAS_LINK = "/usr/lib/x86_64-linux-gnu/libblas.so.3"


def load_result(path):
    with open(path) as fh:
        lines = [ln.strip() for ln in fh if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("{"):
            try:
                return json.loads(ln)
            except ValueError:
                continue
    raise SystemExit("%s: no JSON result line" % path)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for ln in fh:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def blas_line():
    if os.path.exists(BLAS_LINK):
        return os.path.realpath(BLAS_LINK)
    return "unknown"


def fmt_rate(x):
    if x is None:
        return "n/a"
    return "%.0f" % x if x >= 100 else "%.1f" % x


def fmt_stats(s):
    if not isinstance(s, dict):
        return "n/a"
    return "%s [%s-%s]" % (fmt_rate(s.get("median")), fmt_rate(s.get("min")), fmt_rate(s.get("max")))


def ratio(a, b):
    try:
        return "%.2fx" % (float(a) / float(b))
    except (TypeError, ValueError, ZeroDivisionError):
        return "n/a"


def model_name(r):
    return os.path.basename(os.path.normpath(str(r.get("model", "?"))))


def first_mismatch(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", default="bash bench/run_pytorch.sh")
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    results = [load_result(p) for p in args.results]

    torch_versions = sorted({r["torch_version"] for r in results if r.get("torch_version")})
    first = results[0]
    out = []
    out.append("Inference benchmark, %s UTC" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"))
    out.append("")
    out.append("- Machine: %s, %d cores, BLAS %s" % (cpu_model(), os.cpu_count() or 0, blas_line()))
    out.append("- Command: `%s`" % args.command)
    out.append("- Settings: batch 1, greedy, prompt %s tokens, %s new tokens, %s threads, median of %s runs "
               "after 1 warm-up" % (first.get("prompt_len"), first.get("new_tokens"), first.get("threads"),
                                    first.get("runs", "?")))
    out.append("- PyTorch: %s" % (", ".join(torch_versions) or "n/a"))
    out.append("")
    out.append("| model | impl | prefill tok/s (median [min-max]) | decode tok/s (median [min-max]) | peak RSS MB |")
    out.append("|---|---|---|---|---|")
    for r in results:
        rss = r.get("peak_rss_mb")
        out.append("| %s | %s | %s | %s | %s |" % (model_name(r), r.get("impl", "?"), fmt_stats(r.get("prefill_tok_s")),
                                                  fmt_stats(r.get("decode_tok_s")),
                                                  "%.0f" % rss if isinstance(rss, (int, float)) else "n/a"))

    out.append("")
    out.append("| model | swiftcpp / baseline | prefill | decode | peak RSS | same generated ids |")
    out.append("|---|---|---|---|---|---|")
    warnings = []
    models = []
    for r in results:
        if model_name(r) not in models:
            models.append(model_name(r))
    for m in models:
        rows = [r for r in results if model_name(r) == m]
        ours = [r for r in rows if r.get("impl") == "swiftcpp"]
        base = [r for r in rows if r.get("impl") != "swiftcpp"]
        if not ours:
            continue
        s = ours[0]
        for b in base:
            same = s.get("generated_ids") == b.get("generated_ids")
            if not same:
                i = first_mismatch(s.get("generated_ids") or [], b.get("generated_ids") or [])
                warnings.append("WARNING: %s: swiftcpp and %s generated different ids (first difference at new "
                                "token %s)" % (m, b.get("impl"), i))
            if "prompt_ids" in s and "prompt_ids" in b and s["prompt_ids"] != b["prompt_ids"]:
                warnings.append("WARNING: %s: swiftcpp and %s used different prompt ids" % (m, b.get("impl")))
            for key in ("threads", "prompt_len", "new_tokens"):
                if s.get(key) != b.get(key):
                    warnings.append("WARNING: %s: %s differs (swiftcpp %s, %s %s)"
                                    % (m, key, s.get(key), b.get("impl"), b.get(key)))
            out.append("| %s | %s | %s | %s | %s | %s |" % (
                m, b.get("impl"),
                ratio((s.get("prefill_tok_s") or {}).get("median"), (b.get("prefill_tok_s") or {}).get("median")),
                ratio((s.get("decode_tok_s") or {}).get("median"), (b.get("decode_tok_s") or {}).get("median")),
                ratio(s.get("peak_rss_mb"), b.get("peak_rss_mb")),
                "yes" if same else "NO"))
    out.append("")
    out.append("Speed ratios > 1 mean swiftcpp is faster; the RSS ratio < 1 means swiftcpp uses less memory.")
    if warnings:
        out.append("")
        out.extend(warnings)
    print("\n".join(out))
    return 2 if any("generated different ids" in w for w in warnings) else 0


if __name__ == "__main__":
    sys.exit(main())
