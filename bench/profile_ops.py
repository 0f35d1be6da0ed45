#!/usr/bin/python3
"""Operator time table from the chrome://tracing files of swiftcpp_bench_train --profile PREFIX.

    /usr/bin/python3 bench/profile_ops.py PREFIX.step0.json [PREFIX.step1.json ...] [--top 30]

LibTorch's legacy profiler records every operator call with its start and duration per thread; an operator's
self time is its duration minus that of the operators it called (nested intervals on the same thread). Prints,
per operator name, the calls and the self and total milliseconds per step, sorted by self time, and the share of
the step. Timings include the profiler's own overhead (a few microseconds a call).
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    self_us = collections.Counter()
    total_us = collections.Counter()
    calls = collections.Counter()
    step_us = 0.0
    for path in a.traces:
        with open(path) as f:
            events = json.load(f)
        if isinstance(events, dict):
            events = events.get("traceEvents", [])
        by_thread = collections.defaultdict(list)
        for e in events:
            if e.get("ph") == "X" and "dur" in e:
                by_thread[e.get("tid", 0)].append((float(e["ts"]), float(e["dur"]), e["name"]))
        first, last = None, None
        for evs in by_thread.values():
            evs.sort(key=lambda x: (x[0], -x[1]))
            stack = []  # [end, name, child time]
            for ts, dur, name in evs:
                while stack and stack[-1][0] <= ts:
                    end, n, child = stack.pop()
                    self_us[n] -= child
                while stack and ts + dur > stack[-1][0]:  # overlap without nesting: treat as sibling
                    end, n, child = stack.pop()
                    self_us[n] -= child
                if stack:
                    stack[-1][2] += dur
                stack.append([ts + dur, name, 0.0])
                self_us[name] += dur
                total_us[name] += dur
                calls[name] += 1
                first = ts if first is None else min(first, ts)
                last = ts + dur if last is None else max(last, ts + dur)
            while stack:
                end, n, child = stack.pop()
                self_us[n] -= child
        if first is not None:
            step_us += last - first
    steps = len(a.traces)
    print("| operator | calls/step | self ms/step | share of step | total ms/step |")
    print("|---|---|---|---|---|")
    for name, us in self_us.most_common(a.top):
        print("| %s | %.0f | %.1f | %.1f%% | %.1f |" % (name, calls[name] / steps, us / steps / 1e3,
                                                      100 * us / max(step_us, 1), total_us[name] / steps / 1e3))
    print("\nstep (first to last event): %.1f ms; operators' self time: %.1f ms" %
          (step_us / steps / 1e3, sum(self_us.values()) / steps / 1e3))


if __name__ == "__main__":
    main()
