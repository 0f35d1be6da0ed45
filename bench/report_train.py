#!/usr/bin/python3
"""Markdown report for bench/run_train.sh: swiftcpp vs the PyTorch eager baseline, one row per training case.

Usage: report_train.py --command "CMD" --case NAME SWIFTCPP.json BASELINE.json [--case ...]
NAME is MODE-BATCHING-DTYPE (e.g. lora-padding-float32); BASELINE.json may be "-" (no baseline run). Each result
file holds the stdout of one benchmark program; its last line that parses as a JSON object is used (keys, see
bench/baseline_train.py: impl, mode, dtype, tokens_per_s, tokens_per_s_min, tokens_per_s_max, step_ms_median,
losses, peak_rss_mb, threads, torch, blas, matmul_gflops, achieved_gflops; optional: batch, seq, warmup, steps,
runs, lora). The loss check compares the two programs' per-step losses (all steps both have, warm-up included):
max over steps of |swiftcpp - pytorch| / |pytorch|, flagged above 1e-3 (float32) or 2e-2 (bf16).
Exit status 2 when a loss check fails (the report is still printed).
"""

import argparse
import datetime
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import blas_line, cpu_model, fmt_rate, load_result, ratio  # noqa: E402

LOSS_TOL = {"float32": 1e-3, "bf16": 2e-2}


def fmt_stats(r):
    if not r or r.get("tokens_per_s") is None:
        return "n/a"
    return "%s [%s-%s]" % (fmt_rate(r.get("tokens_per_s")), fmt_rate(r.get("tokens_per_s_min")),
                           fmt_rate(r.get("tokens_per_s_max")))


def fmt_num(x, fmt="%.0f"):
    return fmt % x if isinstance(x, (int, float)) else "n/a"


def fmt_flops(r):
    if not r:
        return "n/a"
    a, c = r.get("achieved_gflops"), r.get("matmul_gflops")
    if not isinstance(a, (int, float)):
        return "n/a"
    if isinstance(c, (int, float)) and c > 0:
        return "%.1f (%.0f%% of %.0f)" % (a, 100.0 * a / c, c)
    return "%.1f" % a


def flat_strings(x):
    """A string, or a (possibly nested) list of strings -> list of strings."""
    if isinstance(x, str):
        return [x] if x else []
    if isinstance(x, (list, tuple)):
        return [s for item in x for s in flat_strings(item)]
    return []


def protocol(r):
    return (r.get("warmup"), r.get("steps"), r.get("runs"))


def loss_diff(s, b):
    """-> (max relative difference or None, steps compared, note)."""
    ls, lb = s.get("losses") or [], b.get("losses") or []
    n = min(len(ls), len(lb))
    if n == 0:
        return None, 0, "no losses"
    worst = 0.0
    for x, y in zip(ls[:n], lb[:n]):
        try:
            x, y = float(x), float(y)
        except (TypeError, ValueError):
            return float("inf"), n, "non-numeric loss"
        if not (math.isfinite(x) and math.isfinite(y)):
            return float("inf"), n, "non-finite loss"
        worst = max(worst, abs(x - y) / max(abs(y), 1e-12))
    return worst, n, ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", default="bash bench/run_train.sh")
    ap.add_argument("--case", nargs=3, action="append", required=True, metavar=("NAME", "SWIFTCPP", "BASELINE"))
    ap.add_argument("--openblas", nargs=2, action="append", default=[], metavar=("NAME", "SWIFTCPP"),
                    help="swiftcpp's result for case NAME with its float32 products on LibTorch's at::mm (OpenBLAS)")
    args = ap.parse_args()

    cases = []
    for name, sp, bp in args.case:
        parts = name.split("-")
        if len(parts) != 3:
            raise SystemExit("case name %r is not MODE-BATCHING-DTYPE" % name)
        cases.append({"name": name, "mode": parts[0], "batching": parts[1], "dtype": parts[2],
                      "s": load_result(sp), "b": None if bp == "-" else load_result(bp)})

    warnings = []
    first = cases[0]["s"]
    torch_versions = sorted({c["b"].get("torch") for c in cases if c["b"] and c["b"].get("torch")})
    lora = next((c["s"].get("lora") or (c["b"] or {}).get("lora") for c in cases if c["mode"] == "lora"), None)
    out = []
    out.append("Training benchmark, %s UTC" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"))
    out.append("")
    out.append("- Machine: %s, %d cores, BLAS %s" % (cpu_model(), os.cpu_count() or 0, blas_line()))
    out.append("- Command: `%s`" % args.command)
    out.append("- Settings: model %s, batch %s x %s tokens, %s threads, AdamW lr %s; %s warm-up + %s timed steps, "
               "tokens/s = median [min-max] over %s run(s) (tokens = non-padding tokens)"
               % (os.path.basename(os.path.normpath(str(first.get("model", "?")))), first.get("batch", "?"),
                  first.get("seq", "?"), first.get("threads", "?"), first.get("lr", "?"), first.get("warmup", "?"),
                  first.get("steps", "?"), first.get("runs", "?")))
    if isinstance(lora, dict):
        out.append("- LoRA: r %s, alpha %s%s, on %s" % (lora.get("r"), lora.get("lora_alpha"),
                                                    ", rsLoRA" if lora.get("use_rslora") else "",
                                                    ", ".join(lora.get("target_modules") or []) or "?"))
    gemms = sorted({c["s"].get("gemm") for c in cases if c["s"].get("gemm")})
    out.append("- swiftcpp float32 products: %s (oneDNN's sgemm; bf16 autocast products go through LibTorch's oneDNN "
               "matmul in both programs; PyTorch's float32 ones through OpenBLAS)" % (", ".join(gemms) or "n/a"))
    out.append("- PyTorch: %s (eager, torch.optim.AdamW, torch.autocast for bf16)" % (", ".join(torch_versions) or "n/a"))
    for label, key in (("swiftcpp", "s"), ("PyTorch", "b")):
        libs = sorted({lib for c in cases if c[key] for lib in flat_strings(c[key].get("blas"))})
        out.append("- BLAS loaded by %s: %s" % (label, ", ".join(libs) or "none reported"))
        if libs and not any("openblas" in lib.lower() for lib in libs):
            warnings.append("WARNING: %s did not load OpenBLAS (BENCHMARKS.md requires it)" % label)
    out.append("")
    out.append("| case | swiftcpp tok/s | PyTorch tok/s | swiftcpp / PyTorch | peak RSS MB swiftcpp | "
               "peak RSS MB PyTorch | GFLOP/s swiftcpp (of ceiling) | GFLOP/s PyTorch (of ceiling) | "
               "max rel loss diff (steps) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    loss_fail = False
    notes = set()
    for c in cases:
        s, b = c["s"], c["b"]
        for key, want in (("mode", c["mode"]), ("dtype", c["dtype"])):
            for label, r in (("swiftcpp", s), ("PyTorch", b)):
                if r and r.get(key) is not None and r.get(key) != want:
                    warnings.append("WARNING: %s: %s reports %s %s" % (c["name"], label, key, r.get(key)))
        base_rate = fmt_stats(b)
        if b:
            # Not "seq": the baseline reports the longest row of the batches it read (the same file), swiftcpp the
            # row capacity it packed to.
            for key in ("threads", "batch"):
                if s.get(key) is not None and b.get(key) is not None and s.get(key) != b.get(key):
                    warnings.append("WARNING: %s: %s differs (swiftcpp %s, PyTorch %s)"
                                    % (c["name"], key, s.get(key), b.get(key)))
            if None not in protocol(b) and protocol(b) != protocol(s):
                base_rate += " (%s+%s steps x %s run%s)" % (b["warmup"], b["steps"], b["runs"],
                                                             "" if b["runs"] == 1 else "s")
                notes.add("(W+S steps x R runs): the baseline's protocol on that row (warm-up + timed steps x "
                          "runs), shown where it differs from swiftcpp's (bf16 rows with BF16_BASELINE=short); "
                          "the loss check covers the steps both programs ran.")
            d, n, why = loss_diff(s, b)
            tol = LOSS_TOL.get(c["dtype"], 1e-3)
            if d is None:
                loss = "n/a (%s)" % why
            elif d > tol:
                loss_fail = True
                loss = "**%.2g > %g** (%d)%s" % (d, tol, n, " " + why if why else "")
                warnings.append("WARNING: %s: swiftcpp and PyTorch losses differ by up to %.3g relative over %d "
                                "steps (tolerance %g)%s" % (c["name"], d, n, tol, "; " + why if why else ""))
            else:
                loss = "%.2g ok (%d)" % (d, n)
        else:
            loss = "n/a (no baseline)"
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c["name"], fmt_stats(s), base_rate,
            ratio(s.get("tokens_per_s"), (b or {}).get("tokens_per_s")),
            fmt_num(s.get("peak_rss_mb")), fmt_num((b or {}).get("peak_rss_mb")),
            fmt_flops(s), fmt_flops(b), loss))

    # The same swiftcpp steps with their float32 products on OpenBLAS (the kernel PyTorch's float32 products use).
    openblas = {name: load_result(path) for name, path in args.openblas}
    if openblas:
        out.append("")
        out.append("swiftcpp with its float32 products through LibTorch's at::mm (OpenBLAS, as PyTorch) instead of "
                   "oneDNN's sgemm, same batches, same run:")
        out.append("")
        out.append("| case | swiftcpp (OpenBLAS products) tok/s | / PyTorch | oneDNN / OpenBLAS products | "
                   "GFLOP/s (of ceiling) | max rel loss diff vs PyTorch |")
        out.append("|---|---|---|---|---|---|")
        for c in cases:
            o = openblas.get(c["name"])
            if not o:
                continue
            d, n, why = loss_diff(o, c["b"]) if c["b"] else (None, 0, "no baseline")
            out.append("| %s | %s | %s | %s | %s | %s |" % (
                c["name"], fmt_stats(o), ratio(o.get("tokens_per_s"), (c["b"] or {}).get("tokens_per_s")),
                ratio(c["s"].get("tokens_per_s"), o.get("tokens_per_s")), fmt_flops(o),
                "n/a (%s)" % why if d is None else "%.2g (%d)" % (d, n)))

    # bf16 / float32 speed ratios, per implementation.
    by = {(c["mode"], c["batching"], c["dtype"]): c for c in cases}
    pairs = [(m, bt) for (m, bt, dt) in by if dt == "float32" and (m, bt, "bf16") in by]
    if pairs:
        out.append("")
        out.append("| mode-batching | swiftcpp bf16 / float32 | PyTorch bf16 / float32 |")
        out.append("|---|---|---|")
        for m, bt in pairs:
            f32, bf = by[(m, bt, "float32")], by[(m, bt, "bf16")]
            out.append("| %s-%s | %s | %s |" % (
                m, bt, ratio(bf["s"].get("tokens_per_s"), f32["s"].get("tokens_per_s")),
                ratio((bf["b"] or {}).get("tokens_per_s"), (f32["b"] or {}).get("tokens_per_s"))))

    out.append("")
    out.append("Speed ratios > 1 mean swiftcpp is faster. GFLOP/s is the estimated training work of the timed steps "
               "(formula in bench/baseline_train.py) per second, against the GEMM ceiling of the row's dtype that each "
               "program measured in the same run with the product its step uses (1024^3; swiftcpp float32: oneDNN's "
               "sgemm, PyTorch float32: OpenBLAS; bf16: LibTorch's oneDNN bf16 matmul in both). The loss check is max over steps of |swiftcpp - PyTorch| / |PyTorch|, "
               "warm-up steps included; tolerance %g (float32), %g (bf16)." % (LOSS_TOL["float32"], LOSS_TOL["bf16"]))
    for n in sorted(notes):
        out.append("")
        out.append(n)
    if warnings:
        out.append("")
        out.extend(warnings)
    print("\n".join(out))
    return 2 if loss_fail else 0


if __name__ == "__main__":
    sys.exit(main())
