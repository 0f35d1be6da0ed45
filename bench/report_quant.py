#!/usr/bin/env python3
"""Markdown tables from one bench/run_quant.sh results folder (standard library only).

    python3 bench/report_quant.py bench/results/quant-<stamp>
"""
import json
import pathlib
import re
import sys


def metric(results_json: pathlib.Path, name: str) -> float:
    for r in json.loads(results_json.read_text())["results"]:
        if r["metric"] == name:
            return r["value"]
    raise KeyError(f"{results_json}: no metric {name}")


def infer_figures(log: pathlib.Path):
    """(tokens/s, peak RSS MiB, peak tensor MiB) of one `swiftcpp infer` run."""
    text = log.read_text()
    m = re.search(r"peak memory: ([0-9.]+) MiB resident, ([0-9.]+) MiB of tensors", text)
    s = re.search(r"\(([0-9.]+) tokens/s\)", text)
    return float(s.group(1)), float(m.group(1)), float(m.group(2))


def weight_bytes(model_dir: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    print((out / "machine.txt").read_text().strip().replace("\n", "; "))
    print()
    labels = {
        "float": "float32",
        "int8-rtn": "int8 RTN (per channel)",
        "int4-rtn": "int4 RTN",
        "int4-gptq": "int4 GPTQ (act-order)",
    }
    for d in sorted(p for p in out.iterdir() if p.is_dir() and (p / "eval-float").is_dir()):
        log = (d / "quantize.log").read_text()
        group = re.search(r"as int4 \(symmetric, group (-?\d+)\)", log)
        gptq_s = re.search(r"gptq_seconds (\d+)", log)
        gptq_err = re.search(r"GPTQ on (\d+) samples \((\d+) tokens\)", log)
        base = metric(d / "eval-float/results.json", "token_perplexity")
        print(f"### {d.name}")
        print()
        if group:
            print(f"int4 group size {group.group(1)}; GPTQ calibration: {gptq_err.group(1)} samples, "
                  f"{gptq_err.group(2)} tokens, {gptq_s.group(1) if gptq_s else '?'} s")
            print()
        print("| weights | scored by | token perplexity | vs float | weight file MiB | decode tokens/s | peak RSS MiB "
              "| peak tensors MiB |")
        print("|---|---|---|---|---|---|---|---|")
        model_dir = pathlib.Path((d / "model_path.txt").read_text().strip())
        for v, label in labels.items():
            ppl = metric(d / f"eval-{v}/results.json", "token_perplexity")
            speed, rss, tensors = infer_figures(d / f"infer-{v}.log")
            src = d / v if v != "float" else model_dir
            size = f"{weight_bytes(src) / 2**20:.1f}"
            print(f"| {label} | swiftcpp | {ppl:.4f} | {ppl / base - 1:+.2%} | {size} | {speed:.1f} | {rss:.0f} "
                  f"| {tensors:.1f} |")
        for q in ["f32", "q8_0", "q4_0"]:
            f = d / f"llama-{q}.json"
            if not f.exists():
                continue
            r = json.loads(f.read_text())
            size = (d / f"{q}.gguf").stat().st_size / 2**20
            print(f"| GGUF {q} | llama.cpp | {r['token_perplexity']:.4f} | {r['token_perplexity'] / base - 1:+.2%} "
                  f"| {size:.1f} | | | |")
        print()
    train = {b: out / f"train-q{b}.json" for b in (0, 4)}
    if all(f.exists() for f in train.values()):
        lora, qlora = (json.loads(train[b].read_text()) for b in (0, 4))
        print("### QLoRA (int4 base, group 64) against LoRA, bench25m, batch 4 x 512, r 16")
        print()
        print("| base | tokens/s (median, min-max) | peak RSS while training MiB | first losses |")
        print("|---|---|---|---|")
        for label, r in (("float32 (LoRA)", lora), ("int4 (QLoRA)", qlora)):
            print(f"| {label} | {r['tokens_per_s']:.0f} ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}) "
                  f"| {r['train_peak_rss_mb']:.0f} | {', '.join(f'{x:.4f}' for x in r['losses'][:3])} |")
        print()
        print(f"QLoRA / LoRA: speed {qlora['tokens_per_s'] / lora['tokens_per_s']:.2f}x, "
              f"training peak RSS {qlora['train_peak_rss_mb'] / lora['train_peak_rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
