#!/usr/bin/python3
"""Build the preference demo data: pairs whose preference a tiny model can learn and carry to unseen prompts.

stories260K (260K parameters, trained on children's stories) cannot judge which of two real assistant answers is
better: on LLaMA-Factory's dpo_en_demo its held-out reward accuracy stays at chance (docs/recipes.md). This script
makes pairs with preferences it can learn from the same answers. Each dpo_en_demo row gives two pairs, one from its
chosen answer and one from its rejected answer (a pair is skipped when the change leaves the answer as it was):
    fluency.jsonl   chosen: the answer; rejected: the same answer with the words of each line shuffled (the same
                    words, no fluency). A token-level preference: DPO learns it in a few dozen steps.
    shouting.jsonl  chosen: the answer; rejected: the same answer in capitals. A preference a reward model's one
                    score at the last token can read; stories260K's last-token state does not tell fluent from
                    shuffled text (docs/recipes.md).

Usage (from the repository root):
    /usr/bin/python3 scripts/make_preference_demo.py [--source tests/data/preference/dpo_en_demo.json]
                                                     [--out demo/preference] [--seed 0]
    swiftcpp rlhf --recipe recipes/dpo.yaml dataset=demo/preference/fluency.jsonl
    swiftcpp rlhf --recipe recipes/rm.yaml dataset=demo/preference/shouting.jsonl

Output: JSON Lines in ms-swift's preference form, {"messages": [{"role": "user", "content": PROMPT},
{"role": "assistant", "content": CHOSEN}], "rejected_response": REJECTED}, where PROMPT is the row's human turn.
Deterministic for a given --seed. Only the Python standard library is used.
"""
import argparse
import json
import os
import random
import sys


def shuffle_words(text, rng):
    lines = []
    for line in text.split("\n"):
        words = line.split(" ")
        rng.shuffle(words)
        lines.append(" ".join(words))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default="tests/data/preference/dpo_en_demo.json")
    ap.add_argument("--out", default="demo/preference")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.source, encoding="utf-8") as f:
        rows = json.load(f)
    kinds = {"fluency": lambda answer: shuffle_words(answer, rng), "shouting": lambda answer: answer.upper()}
    os.makedirs(args.out, exist_ok=True)
    for kind, make_rejected in kinds.items():
        pairs = []
        for i, row in enumerate(rows):
            turns = row.get("conversations")
            if not isinstance(turns, list) or not turns or turns[-1].get("from") != "human":
                sys.exit(f"{args.source}[{i}]: expected conversations ending with a human turn")
            prompt = turns[-1]["value"]
            for side in ("chosen", "rejected"):
                answer = row[side]["value"] if isinstance(row[side], dict) else row[side]
                rejected = make_rejected(answer)
                if rejected == answer:
                    continue
                pairs.append({"messages": [{"role": "user", "content": prompt},
                                           {"role": "assistant", "content": answer}],
                              "rejected_response": rejected})
        out = os.path.join(args.out, kind + ".jsonl")
        tmp = out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for p in pairs:
                f.write(json.dumps(p, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
        print(f"{out}: {len(pairs)} pairs from {len(rows)} rows")


if __name__ == "__main__":
    main()
