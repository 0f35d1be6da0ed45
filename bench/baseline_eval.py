#!/usr/bin/python3
"""PyTorch eager baseline for swiftcpp's evaluation benchmark (MMLU log-likelihood scoring).

Run with Debian's interpreter (python3-torch 1.13 + numpy), on the requests file that `swiftcpp eval
--dump-requests FILE` wrote (bench/run_eval.sh does all of this):
    /usr/bin/python3 bench/baseline_eval.py --model bench/models/bench25m-llama2tok --requests OUT/requests.jsonl \
        --batch-size 8 --threads 2 --runs 1 --output OUT/baseline.json

This is what lm-evaluation-harness's Hugging Face backend (lm_eval/models/huggingface.py, `_loglikelihood_tokens`,
with its default logits cache) does, written as eager PyTorch on the plain Llama of bench/baseline_infer.py
(imported from there: the same checkpoint reader, float32 model, rotary tables and causal attention):
  Requests (--requests FILE): JSON Lines, one item per line, in item order:
      {"context": [ids, BOS included], "continuations": [[ids], [ids], ...]}
    the exact token ids swiftcpp scored; this program does no tokenisation. A request is (context, continuation).
  Rows: one forward row per distinct key context + continuation[:-1] (lm-eval's Collator group_by="contexts"):
    every one-token continuation of a context shares one row, which is the context itself (MMLU: one row per
    question for its 4 answers ` A`..` D`); a longer continuation gets its own row, context + continuation[:-1].
    Row input = (context + continuation)[-(max_length + 1):][:-1] (lm-eval's left truncation; max_length defaults
    to the model's max_position_embeddings). Each key is represented by its first request in item order.
  Order and batches: rows sorted by (-len(context + continuation), tuple(context + continuation)) of that request
    (lm-eval's _collate), then cut into batches of --batch-size rows in that order.
  Forward: each batch is right-padded with id 0 to its longest row and run through the full model with no KV cache
    and no attention mask beyond the causal one (lm-eval passes no attention_mask for causal models: with right
    padding the real positions never see a padding key), lm_head on every position, then
    F.log_softmax(logits, dim=-1) over the whole [B, T, vocab] tensor, as lm-eval does.
  Scoring: a continuation of length n scores at the row's last n real positions: the log-probs of its tokens are
    gathered and summed (float32), and is_greedy = every token is the argmax there. Results go back to item order.
  Threads: torch.set_num_threads(--threads) (and OMP_NUM_THREADS, unless already set); torch.inference_mode().
  Timing: one run = building the rows from the loaded requests, every batch, and the per-request sums back in item
    order (host-synchronous, CPU); reading the requests file and loading the model are not timed. --runs R repeats
    the run R times in this process (bench/run_eval.sh starts a fresh process per run instead, as it does for
    swiftcpp). items_per_s of a run = items / seconds; reported: median, min, max over runs.
  peak_rss_mb: getrusage(RUSAGE_SELF).ru_maxrss / 1024 at the end of the program.

Output: one JSON line on stdout (and in --output FILE when given); diagnostics go to stderr. Keys:
  impl ("pytorch-eager"), model, threads, batch_size, max_length, runs, items, requests, rows, truncated_rows
  (rows cut to max_length from the left), tokens (real tokens forwarded), padded_tokens (batch x padded length,
  summed), items_per_s {median, min, max}, seconds [per run], peak_rss_mb, loglikelihoods [per item: one float per
  continuation] and is_greedy (same shape) of the first run, torch_version, torch_threads, omp_num_threads,
  blas [BLAS libraries mapped into the process].
"""

import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch eager lm-eval-style log-likelihood baseline (see docstring)")
    ap.add_argument("--model", required=True, help="Hugging Face checkpoint folder (config.json, model.safetensors)")
    ap.add_argument("--requests", required=True, help="JSON Lines from swiftcpp eval --dump-requests")
    ap.add_argument("--batch-size", type=int, default=8, help="rows per forward")
    ap.add_argument("--max-length", type=int, default=0, help="model input length (0 = max_position_embeddings)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--output", help="also write the JSON result to this file")
    return ap.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    # Must happen before torch (and its OpenMP runtime) is loaded.
    os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baseline_infer import Llama, load_checkpoint, loaded_blas, peak_rss_mb, stats  # noqa: E402


def load_requests(path):
    """-> list of (context ids, [continuation ids, ...]) in item order."""
    items = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ctx = [int(t) for t in row["context"]]
                conts = [[int(t) for t in c] for c in row["continuations"]]
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit("%s:%d: not a request row (%s)" % (path, n, e))
            if not ctx or not conts or any(not c for c in conts):
                raise SystemExit("%s:%d: empty context or continuation" % (path, n))
            items.append((ctx, conts))
    if not items:
        raise SystemExit("%s: no requests" % path)
    return items


def build_rows(items, max_length):
    """lm-eval's grouping and order. -> list of rows, each {"inp": ids, "reqs": [(item, choice, cont ids)]}."""
    by_key = {}
    for i, (ctx, conts) in enumerate(items):
        for j, cont in enumerate(conts):
            full = ctx + cont
            key = tuple(full[:-1])
            row = by_key.get(key)
            if row is None:
                by_key[key] = row = {"inp": full[-(max_length + 1):][:-1], "sort": (-len(full), tuple(full)),
                                     "truncated": len(full) - 1 > max_length, "reqs": []}
            row["reqs"].append((i, j, cont))
    return sorted(by_key.values(), key=lambda r: r["sort"])


def score(model, items, batch_size, max_length):
    """One timed run. -> (loglikelihoods, is_greedy, rows, real tokens, padded tokens, truncated rows)."""
    rows = build_rows(items, max_length)
    ll = [[None] * len(conts) for _, conts in items]
    greedy = [[None] * len(conts) for _, conts in items]
    n_tok = n_pad = 0
    for b in range(0, len(rows), batch_size):
        chunk = rows[b:b + batch_size]
        T = max(len(r["inp"]) for r in chunk)
        ids = torch.zeros((len(chunk), T), dtype=torch.int64)
        for k, r in enumerate(chunk):
            ids[k, :len(r["inp"])] = torch.tensor(r["inp"], dtype=torch.int64)
        n_tok += sum(len(r["inp"]) for r in chunk)
        n_pad += ids.numel()
        multi_logits = F.log_softmax(model.forward(ids, use_cache=False), dim=-1)  # [B, T, V]
        for k, r in enumerate(chunk):
            inplen = len(r["inp"])
            for i, j, cont in r["reqs"]:
                n = len(cont)
                lp = multi_logits[k, inplen - n:inplen]  # [n, V]
                want = torch.tensor(cont, dtype=torch.int64)
                ll[i][j] = float(torch.gather(lp, 1, want.unsqueeze(-1)).sum())
                greedy[i][j] = bool((lp.argmax(dim=-1) == want).all())
    return ll, greedy, len(rows), n_tok, n_pad, sum(r["truncated"] for r in rows)


def main(args):
    if args.batch_size < 1 or args.runs < 1:
        raise SystemExit("need --batch-size >= 1 and --runs >= 1")
    torch.set_num_threads(args.threads)
    items = load_requests(args.requests)
    cfg, w = load_checkpoint(args.model)
    model = Llama(cfg, w)
    del w
    max_length = args.max_length or model.max_pos
    if max_length > model.max_pos:
        raise SystemExit("--max-length %d exceeds max_position_embeddings %d" % (max_length, model.max_pos))
    vocab = cfg["vocab_size"]
    bad = [t for ctx, conts in items for t in ctx + [x for c in conts for x in c] if not 0 <= t < vocab]
    if bad:
        raise SystemExit("%s: token id %d outside the model's vocabulary (%d)" % (args.requests, bad[0], vocab))

    secs, first = [], None
    with torch.inference_mode():
        for r in range(args.runs):
            t0 = time.perf_counter()
            res = score(model, items, args.batch_size, max_length)
            secs.append(time.perf_counter() - t0)
            if first is None:
                first = res
            print("run %d: %d items in %.2f s = %.2f items/s (%d rows, %d tokens, %d with padding)"
                  % (r, len(items), secs[-1], len(items) / secs[-1], res[2], res[3], res[4]), file=sys.stderr)
    ll, greedy, n_rows, n_tok, n_pad, n_trunc = first
    result = {
        "impl": "pytorch-eager",
        "model": args.model,
        "threads": args.threads,
        "batch_size": args.batch_size,
        "max_length": max_length,
        "runs": args.runs,
        "items": len(items),
        "requests": sum(len(c) for _, c in items),
        "rows": n_rows,
        "truncated_rows": n_trunc,
        "tokens": n_tok,
        "padded_tokens": n_pad,
        "items_per_s": stats([len(items) / s for s in secs]),
        "seconds": secs,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "loglikelihoods": ll,
        "is_greedy": greedy,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "blas": loaded_blas(),
    }
    line = json.dumps(result)
    if args.output:
        tmp = args.output + ".tmp-%d" % os.getpid()
        with open(tmp, "w") as fh:
            fh.write(line + "\n")
        os.replace(tmp, args.output)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
