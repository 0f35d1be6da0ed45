#!/usr/bin/python3
"""Markdown report for bench/run_eval.sh: swiftcpp eval vs the PyTorch eager (lm-eval method) baseline on MMLU.

Usage: report_eval.py --command "CMD" [--task mmlu] --run SWIFTCPP_DIR TIME_LOG BASELINE.json [--run ...]
One --run per benchmark run. SWIFTCPP_DIR is a `swiftcpp eval --output-dir` folder (results.json with the task
(--task, default mmlu): items, requests, tokens, seconds, encode_seconds, num_fewshot; samples_<task>.jsonl with
"loglikelihoods" per item, in item order); TIME_LOG is what `/usr/bin/time -v -o TIME_LOG` wrote around it ("-" =
none: peak RSS n/a); BASELINE.json is the output of bench/baseline_eval.py (its last line that parses as a JSON
object).
swiftcpp items/s: total = items / seconds (tokenisation + model), model only = items / (seconds - encode_seconds).
The baseline gets token ids and does no tokenisation, so model only / baseline is the like-for-like ratio.
The check compares every item's log-likelihoods, run by run: max |swiftcpp - PyTorch| over all items and choices,
flagged above 1e-3. Exit status 2 when the check fails (the report is still printed).
"""

import argparse
import datetime
import json
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import blas_line, cpu_model, load_result, ratio  # noqa: E402

LL_TOL = 1e-3


def fmt_rate(x):
    """Items/s are small numbers (about 1 on the dev machine): three significant digits."""
    if x is None:
        return "n/a"
    return "%.0f" % x if x >= 100 else "%.3g" % x


def stats(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    if not xs:
        return None
    return {"median": float(np.median(xs)), "min": float(min(xs)), "max": float(max(xs))}


def fmt_stats(s):
    if not s:
        return "n/a"
    return "%s [%s-%s]" % (fmt_rate(s["median"]), fmt_rate(s["min"]), fmt_rate(s["max"]))


def fmt_num(x, fmt="%.0f"):
    return fmt % x if isinstance(x, (int, float)) else "n/a"


def load_swiftcpp(folder, task_name):
    path = os.path.join(folder, "results.json")
    with open(path) as fh:
        res = json.load(fh)
    task = next((t for t in res.get("tasks", []) if t.get("task") == task_name), None)
    if task is None:
        raise SystemExit("%s: no task %r in \"tasks\"" % (path, task_name))
    for key in ("items", "seconds", "encode_seconds"):
        if not isinstance(task.get(key), (int, float)):
            raise SystemExit("%s: task %s lacks %r" % (path, task_name, key))
    lls = []
    spath = os.path.join(folder, "samples_%s.jsonl" % task_name)
    if os.path.exists(spath):
        with open(spath) as fh:
            for ln in fh:
                if ln.strip():
                    lls.append([float(x) for x in json.loads(ln)["loglikelihoods"]])
    return res, task, lls


def time_rss_mb(path):
    """Peak RSS in MB from /usr/bin/time -v output, or None."""
    if path == "-" or not os.path.exists(path):
        return None
    with open(path, errors="replace") as fh:
        m = re.search(r"Maximum resident set size \(kbytes\):\s*(\d+)", fh.read())
    return int(m.group(1)) / 1024.0 if m else None


def ll_diff(a, b):
    """-> (max |a - b| or None, values compared, note, argmax agreements, items compared)."""
    if not a or not b:
        return None, 0, "no log-likelihoods", 0, 0
    if len(a) != len(b):
        return float("inf"), 0, "%d vs %d items" % (len(a), len(b)), 0, 0
    worst, n, agree = 0.0, 0, 0
    for x, y in zip(a, b):
        if len(x) != len(y):
            return float("inf"), n, "an item has %d vs %d choices" % (len(x), len(y)), agree, 0
        for u, v in zip(x, y):
            if not (math.isfinite(u) and math.isfinite(v)):
                return float("inf"), n, "non-finite log-likelihood", agree, 0
            worst = max(worst, abs(u - v))
            n += 1
        agree += int(np.argmax(x) == np.argmax(y))
    return worst, n, "", agree, len(a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", default="bash bench/run_eval.sh")
    ap.add_argument("--task", default="mmlu", help="the task of results.json to report (default: mmlu)")
    ap.add_argument("--run", nargs=3, action="append", required=True,
                    metavar=("SWIFTCPP_DIR", "TIME_LOG", "BASELINE"))
    args = ap.parse_args()

    runs = []
    for sdir, tlog, bpath in args.run:
        res, task, lls = load_swiftcpp(sdir, args.task)
        runs.append({"res": res, "task": task, "lls": lls, "rss": time_rss_mb(tlog), "b": load_result(bpath)})

    warnings = []
    t0, b0 = runs[0]["task"], runs[0]["b"]
    sw_total = stats([r["task"]["items"] / r["task"]["seconds"] for r in runs])
    sw_model = stats([r["task"]["items"] / (r["task"]["seconds"] - r["task"]["encode_seconds"]) for r in runs])
    base = stats([(r["b"].get("items_per_s") or {}).get("median") for r in runs])
    sw_rss = stats([r["rss"] for r in runs])
    b_rss = stats([r["b"].get("peak_rss_mb") for r in runs])
    enc_share = stats([r["task"]["encode_seconds"] / r["task"]["seconds"] for r in runs])

    for r in runs:
        t, b = r["task"], r["b"]
        if b.get("items") != t["items"]:
            warnings.append("WARNING: swiftcpp scored %s items, the baseline %s" % (t["items"], b.get("items")))
        if t.get("requests") is not None and b.get("requests") is not None and t["requests"] != b["requests"]:
            warnings.append("WARNING: swiftcpp scored %s requests, the baseline %s" % (t["requests"], b["requests"]))
    blas = sorted({lib for r in runs for lib in r["b"].get("blas") or []})
    if blas and not any("openblas" in lib.lower() for lib in blas):
        warnings.append("WARNING: PyTorch did not load OpenBLAS (BENCHMARKS.md requires it)")

    out = []
    out.append("Evaluation benchmark (%s), %s UTC"
               % (args.task, datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M")))
    out.append("")
    out.append("- Machine: %s, %d cores, BLAS %s" % (cpu_model(), os.cpu_count() or 0, blas_line()))
    out.append("- Command: `%s`" % args.command)
    model = os.path.basename(os.path.normpath(str(b0.get("model", "?"))))
    out.append("- Settings: model %s, %s-shot, %s items (%s requests, %s tokens in prompts + answers), batch %s, "
               "%s threads, float32; items/s = median [min-max] over %d run(s), each a fresh process"
               % (model, t0.get("num_fewshot", "?"), t0["items"], t0.get("requests", "?"), t0.get("tokens", "?"),
                  b0.get("batch_size", "?"), b0.get("threads", "?"), len(runs)))
    out.append("- PyTorch %s, eager, lm-eval's Hugging Face method: one full forward per distinct context "
               "(%s rows, %s of them cut from the left to %s tokens as lm-eval does; %s tokens forwarded, %s with "
               "right padding), log_softmax over the vocabulary at every position; BLAS %s"
               % (b0.get("torch_version", "?"), b0.get("rows", "?"), b0.get("truncated_rows", "?"),
                  b0.get("max_length", "?"), b0.get("tokens", "?"), b0.get("padded_tokens", "?"),
                  ", ".join(blas) or "none reported"))
    out.append("")
    out.append("| program | items/s | vs PyTorch | peak RSS MB |")
    out.append("|---|---|---|---|")
    out.append("| swiftcpp eval, total (tokenisation %s%% of its time) | %s | %s | %s |"
               % (fmt_num(100 * enc_share["median"], "%.1f") if enc_share else "n/a", fmt_stats(sw_total),
                  ratio(sw_total and sw_total["median"], base and base["median"]),
                  fmt_num(sw_rss and sw_rss["median"])))
    out.append("| swiftcpp eval, model only | %s | %s | |"
               % (fmt_stats(sw_model), ratio(sw_model and sw_model["median"], base and base["median"])))
    out.append("| PyTorch eager (lm-eval method), token ids given | %s | 1.00x | %s |"
               % (fmt_stats(base), fmt_num(b_rss and b_rss["median"])))

    # Log-likelihood check, run by run.
    worst, n_vals, agree, n_items, notes = 0.0, 0, 0, 0, []
    fail = False
    for k, r in enumerate(runs):
        d, n, why, ag, ni = ll_diff(r["lls"], r["b"].get("loglikelihoods"))
        if d is None:
            notes.append("run %d: %s" % (k + 1, why))
            continue
        if why:
            notes.append("run %d: %s" % (k + 1, why))
        worst, n_vals = max(worst, d), n_vals + n
        agree, n_items = agree + ag, n_items + ni
        fail |= d > LL_TOL
    out.append("")
    if n_vals == 0 and not notes:
        out.append("Log-likelihood check: n/a")
    else:
        verdict = "ok" if not fail else "**above the %g tolerance**" % LL_TOL
        out.append("Log-likelihood check: max |swiftcpp - PyTorch| = %.3g over %d values (%d run(s) x items x "
                   "choices): %s; same predicted answer on %d of %d items%s"
                   % (worst, n_vals, len(runs), verdict, agree, n_items,
                      "; " + "; ".join(notes) if notes else ""))
        if fail or (notes and n_vals == 0):
            fail = True
            warnings.append("WARNING: swiftcpp and PyTorch log-likelihoods differ (max %.3g)%s"
                            % (worst, "; " + "; ".join(notes) if notes else ""))
    out.append("")
    out.append("Speed ratios > 1 mean swiftcpp is faster. swiftcpp total = items / (tokenisation + model time); "
               "model only leaves out its tokenisation, which the baseline never does (it reads swiftcpp's token "
               "ids). Peak RSS: swiftcpp from /usr/bin/time -v, PyTorch from getrusage; both include the model.")
    if warnings:
        out.append("")
        out.extend(warnings)
    print("\n".join(out))
    return 2 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
