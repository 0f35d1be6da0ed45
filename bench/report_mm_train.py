#!/usr/bin/python3
"""Markdown tables of bench/run_mm_train.sh's results.

Usage:
    /usr/bin/python3 bench/report_mm_train.py OUT --models NAME... --cases CASE... --rounds N

OUT holds one `<model>.<case>.r<round>.json` (swiftcpp_bench_mm_train's output, one model load) with its
`.load-start` / `.load-end` beside it for every model, case and round. Prints
  1. the step: per model and case, the step time as the median [min-max] of the rounds, tokens/s and images/s
     from the median, and the tower counts;
  2. the split: the median of every profiled step of all rounds, pooled, in ms and as a share of the profiled step;
  3. side by side: each model against the first, per case, as the median [min-max] of the per-round ratios of the
     step time and of each part (the models alternate within a round, so each ratio compares runs back to back).
Only the standard library is used.
"""

import argparse
import json
import os
import statistics
import sys


def load(out, name, case, rounds):
    runs = []
    for k in range(1, rounds + 1):
        base = os.path.join(out, "%s.%s.r%d" % (name, case, k))
        with open(base + ".json") as fh:
            r = json.load(fh)
        r["load"] = [open("%s.load-%s" % (base, w)).read().split()[0] for w in ("start", "end")]
        runs.append(r)
    return runs


def med_range(values, fmt="%.0f"):
    return (fmt + " [" + fmt + "-" + fmt + "]") % (statistics.median(values), min(values), max(values))


def span(pair):
    return str(pair[0]) if pair[0] == pair[1] else "%s-%s" % pair


def tower(r):
    return r["split"]["tower_fwd_ms"] + r["split"]["tower_bwd_ms"]


def projector(r):
    return r["split"]["projector_fwd_ms"] + r["split"]["projector_bwd_ms"]


def lm(r):
    return r["split"]["lm_fwd_ms"] + r["split"]["lm_bwd_ms"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--cases", nargs="+", required=True)
    ap.add_argument("--rounds", type=int, required=True)
    args = ap.parse_args(argv)
    data = {(m, c): load(args.out, m, c, args.rounds) for m in args.models for c in args.cases}

    first = data[(args.models[0], args.cases[0])][0]
    profiled = sum(r["split"]["steps"] for r in data[(args.models[0], args.cases[0])])
    print("Batch %d (one image each, every sample %d tokens: %d tokens a step), %d threads, per round and model "
          "%d warm-up + %d timed steps, %d rounds with the models alternating; split: median of %d profiled steps "
          "(%d a round), pooled over the rounds." % (
              first["batch"], first["sample_tokens"], first["tokens_per_step"], first["threads"], first["warmup"],
              first["steps"], args.rounds, profiled, first["profiled_steps"]))
    print()
    for m in args.models:
        r = data[(m, args.cases[0])][0]
        print("- %s (%s, %s; ranges `%s` / `%s`): image tokens %s (%s)" % (
            m, r["model_type"], r["image_processor"], r["tower_range"], r["projector_range"],
            ", ".join(str(i["tokens"]) for i in r["images"]), ", ".join(i["file"] for i in r["images"])))
    print()

    print("| model | case | trainable | image tokens a step | tower input a step | step ms, median [min-max] of "
          "rounds | tokens/s | images/s | tower runs / step | tower input rows / rows in the step "
          "| load average (1 min), start-end over the rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in args.cases:
        for m in args.models:
            rs = data[(m, c)]
            r = rs[0]
            steps = [x["step_ms_median"] for x in rs]
            step = statistics.median(steps)
            image_tokens = span((r["image_tokens_per_step_min"], r["image_tokens_per_step_max"]))
            rows = span((r["step_rows_min"], r["step_rows_max"]))
            runs = span((min(x["tower_runs_per_step_min"] for x in rs), max(x["tower_runs_per_step_max"] for x in rs)))
            seen = span((min(x["tower_rows_per_step_min"] for x in rs), max(x["tower_rows_per_step_max"] for x in rs)))
            match = all(x["tower_rows_equal_step_rows"] for x in rs)
            loads = [float(v) for x in rs for v in x["load"]]
            print("| %s | %s | %.2fM | %s | %s %s | %s | %.0f | %.2f | %s | %s / %s%s | %.2f-%.2f |" % (
                m, r["case"], r["trainable_parameters"] / 1e6, image_tokens, rows, r["tower_rows_unit"],
                med_range(steps), r["tokens_per_step"] / (step / 1e3), r["batch"] / (step / 1e3), runs, seen, rows,
                "" if match else " (MISMATCH)", min(loads), max(loads)))
    print()

    print("Split of the step: median of the pooled profiled steps, in ms, with the share of the profiled step.")
    print()
    print("| model | case | profiled step ms (vs unprofiled) | tower forward | tower backward "
          "| projector / merger forward + backward | language model forward | language model backward "
          "| optimizer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in args.cases:
        for m in args.models:
            rs = data[(m, c)]
            pooled = [s for x in rs for s in x["split"]["per_step"]]
            med = lambda key: statistics.median(s[key] for s in pooled)
            total = med("step_ms")
            cell = lambda ms: "%.0f (%.1f%%)" % (ms, 100.0 * ms / total)
            unprof = statistics.median(x["step_ms_median"] for x in rs)
            print("| %s | %s | %.0f (%+.1f%%) | %s | %s | %s | %s | %s | %s |" % (
                m, rs[0]["case"], total, 100.0 * (total / unprof - 1), cell(med("tower_fwd_ms")),
                cell(med("tower_bwd_ms")), cell(med("projector_fwd_ms") + med("projector_bwd_ms")),
                cell(med("lm_fwd_ms")), cell(med("lm_bwd_ms")), cell(med("optimizer_ms"))))
    print()

    if len(args.models) > 1:
        ref = args.models[0]
        print("Side by side: each model against %s, per case; median [min-max] of the %d per-round ratios "
              "(step: unprofiled step times; parts: each round's median profiled split)." % (ref, args.rounds))
        print()
        print("| case | model / %s | step time | tower (forward + backward) | projector / merger "
              "| language model (forward + backward) | optimizer |" % ref)
        print("|---|---|---|---|---|---|---|")
        for c in args.cases:
            for m in args.models[1:]:
                pairs = list(zip(data[(m, c)], data[(ref, c)]))
                ratio = lambda f: med_range([f(a) / f(b) if f(b) > 0 else float("nan") for a, b in pairs], "%.2f")
                print("| %s | %s | %s | %s | %s | %s | %s |" % (
                    data[(m, c)][0]["case"], m, ratio(lambda r: r["step_ms_median"]), ratio(tower),
                    ratio(projector), ratio(lm), ratio(lambda r: r["split"]["optimizer_ms"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
