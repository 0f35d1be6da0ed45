#!/usr/bin/python3
"""Score the vision-language demos' greedy answers: the JSONL that `swiftcpp infer --prompts-file ... --output OUT`
writes (each input row with its "answer", plus the model's "response").

Usage:
    /usr/bin/python3 scripts/score_mm_demo.py OUT.jsonl [--json]

A row is correct when the first word of its "response" (leading whitespace skipped, trailing punctuation
.,;:!? dropped) equals its "answer" exactly. Prints the accuracy over all rows and, when rows carry a "kind"
(colour, shape), per kind; --json prints the same as one JSON object. Exits 0 when scored, 1 on malformed input
(a line that is not a JSON object, a missing or non-string "response" or "answer", no rows at all), 2 on bad usage.
Standard library only.
"""

import argparse
import json
import sys


def first_word(text):
    words = text.split()
    return words[0].rstrip(".,;:!?") if words else ""


def score(path):
    """(total, correct, {kind: [total, correct]}); raises ValueError naming the line on malformed input."""
    total = correct = 0
    kinds = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = "%s:%d" % (path, number)
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError("%s: not JSON (%s)" % (where, e))
            if not isinstance(row, dict):
                raise ValueError("%s: expected a JSON object" % where)
            for key in ("response", "answer"):
                if not isinstance(row.get(key), str):
                    raise ValueError("%s: '%s' is missing or not a string" % (where, key))
            kind = row.get("kind")
            if kind is not None and not isinstance(kind, str):
                raise ValueError("%s: 'kind' must be a string" % where)
            ok = first_word(row["response"]) == row["answer"]
            total += 1
            correct += ok
            if kind is not None:
                k = kinds.setdefault(kind, [0, 0])
                k[0] += 1
                k[1] += ok
    if total == 0:
        raise ValueError("%s: no rows" % path)
    return total, correct, kinds


def main(argv=None):
    ap = argparse.ArgumentParser(description="Exact-match accuracy of the first word of each response.")
    ap.add_argument("output", help="the JSONL written by swiftcpp infer --prompts-file ... --output")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)
    try:
        total, correct, kinds = score(args.output)
    except (OSError, ValueError) as e:
        print("score_mm_demo: %s" % e, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"accuracy": correct / total, "correct": correct, "total": total,
                          "kinds": {k: {"accuracy": c / n, "correct": c, "total": n} for k, (n, c) in sorted(kinds.items())}}))
        return 0
    print("accuracy %.1f%% (%d/%d)" % (100.0 * correct / total, correct, total))
    for kind, (n, c) in sorted(kinds.items()):
        print("  %-8s %.1f%% (%d/%d)" % (kind, 100.0 * c / n, c, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
