#!/usr/bin/python3
"""PyTorch eager baseline for swiftcpp's training benchmark (LoRA or full fine-tuning, AdamW, float32 or bf16).

Run with Debian's interpreter (python3-torch 1.13 + numpy), on the batches file and LoRA init adapter that
swiftcpp_bench_train wrote (bench/run_train.sh does all of this):
    /usr/bin/python3 bench/baseline_train.py --model bench/models/bench25m --batches OUT/batches.jsonl \
        --adapter OUT/init_adapter --mode lora --dtype float32 --warmup 3 --steps 10 --threads 2 --runs 3

This is the program a competent PyTorch user would write: the plain eager Llama of bench/baseline_infer.py
(float32 RMSNorm, rotate-half rotary embeddings, grouped-query attention, SiLU-gated MLP, untied or tied lm_head;
the same helper functions are imported from there) with its weights as torch.nn.Parameters, the standard
torch.optim.AdamW, torch.autocast for bf16, torch.set_num_threads(--threads) (and OMP_NUM_THREADS, unless already
set). Attention is written with matmul + softmax (torch 1.13 has no scaled_dot_product_attention).

THE MEASUREMENT CONTRACT (swiftcpp_bench_train must follow it exactly, so the two are comparable)
  Model: the checkpoint in --model (config.json + model.safetensors, float32), read as float32 master weights.
  Training modes:
    lora: every projection named in the adapter's target_modules (the benchmark uses all of q_proj, k_proj, v_proj,
      o_proj, gate_proj, up_proj, down_proj; never lm_head or the embedding) computes
          y = x W^T + scale * (x A^T) B^T,   A [r, in], B [out, r],  scale = lora_alpha / r
      (lora_alpha / sqrt(r) when use_rslora). A and B are the only trainable tensors; their initial values are read
      from --adapter DIR (PEFT layout: DIR/adapter_config.json with r, lora_alpha, use_rslora, target_modules;
      DIR/adapter_model.safetensors with base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight [r,in]
      and ...lora_B.weight [out,r], likewise k_proj, v_proj, o_proj and mlp.gate_proj, up_proj, down_proj).
      No dropout (lora_dropout is ignored). Base weights have requires_grad False.
    full: every tensor of the checkpoint (embedding, norms, projections, lm_head) is trainable.
  Batches (--batches FILE): JSON Lines, one micro-batch per line, one micro-batch = one optimizer step:
      {"input_ids": B x T ints, "labels": B x T ints (already shifted: labels[b][t] is the id that position t
       must predict, or -100), "position_ids": B x T ints, "key_valid": B x T of 0/1 or null (null = all valid),
       "segment_ids": B x T ints or null (null = one segment per row)}
    Step i (0-based, counting warm-up steps) of every run uses line i mod (number of lines).
  Attention: query t of row b may attend to key s iff s <= t (row index, not position id), key_valid[b][s] = 1 and
    segment_ids[b][s] == segment_ids[b][t]. Scores are q.k / sqrt(head_dim); disallowed scores are set to the
    scores dtype's finfo.min (not -inf, so a fully masked row, e.g. a left-padding query, gives a uniform softmax and
    no NaN); softmax in float32. Rotary angles are taken at position_ids (rotate-half, HF default rope).
  Loss (float32): sum over every (b, t) with labels[b][t] != -100 of the cross-entropy of the float32 logits, divided
    by the number of such label tokens in the micro-batch (0 label tokens -> loss 0). The loss of step k is the
    value computed by step k's forward, before step k's update.
  Optimizer: torch.optim.AdamW(trainable, lr=--lr [1e-4], betas=(0.9, 0.999), eps=1e-8, weight_decay=0), constant
    lr, no gradient clipping unless --clip-grad-norm > 0 (total L2 norm over all trainable grads).
  Step: zero_grad(set_to_none=True) ... forward + loss, backward, optimizer.step(). A step is timed from just before
    its forward (mask construction included) to just after optimizer.step() returns, host-synchronous (CPU).
  dtype: float32 = everything float32. bf16 = torch.autocast("cpu", dtype=torch.bfloat16) around forward + loss,
    float32 master weights, grads and AdamW state: under autocast the matmuls (every projection, the LoRA products,
    q.k^T, probs.v and lm_head) take bf16 operands and produce bf16, while the embedding, residual stream, RMSNorm,
    rotary (promoted back to float32 by the float32 cos/sin), softmax and cross-entropy run in float32.
  Runs: --warmup untimed steps, then --steps timed steps = one run. --runs R repeats the whole run R times, each
    with a fresh model (re-read weights, re-read adapter) and a fresh optimizer; nothing is carried between runs.
  Tokens of a step = number of key_valid tokens (all B x T when key_valid is null), whether or not they carry a label.
    tokens_per_s of a run = sum of timed steps' tokens / sum of timed steps' seconds; reported: median over runs
    ("tokens_per_s"), min ("tokens_per_s_min"), max ("tokens_per_s_max").
  step_ms_median: median of the individual timed step times of all runs, in milliseconds.
  losses: the loss of every step of the FIRST run, warm-up steps included (warmup + steps values).
  peak_rss_mb: getrusage(RUSAGE_SELF).ru_maxrss / 1024 at the end of the program.
  matmul_gflops: the GEMM ceiling of the step's dtype measured by this process at --threads before the runs: after 2
    untimed calls, the best of 5 timings of 1024x1024 @ 1024x1024 with the product the step's matmuls use (here
    torch.mm, in float32 or, for bf16, on bfloat16 operands), 2 * 1024^3 / seconds / 1e9. swiftcpp times its own
    float32 product (oneDNN's sgemm where built).
  achieved_gflops: estimated training FLOPs of the timed steps / their seconds / 1e9, where for each
    step with N_tok = its key_valid tokens (padding tokens do no useful work and are not counted):
      N_mm   = parameters of all projection matrices in the layers + lm_head (embedding and norms excluded:
               a gather and elementwise work)
      N_lora = trainable LoRA parameters (r * (in + out) summed over the adapted projections)
      full:  6 * N_mm * N_tok;   lora: 4 * N_mm * N_tok + 6 * N_lora * N_tok
      plus attention: 12 * L * H * head_dim * sum over rows of (valid tokens of the row)^2
      (q.k^T and probs.v, 2 matmuls x 2 FLOP/MAC forward, x3 for forward + backward, over the full square of
      valid tokens, masked or not). Both implementations use this same formula, so achieved_gflops compares the
      same work; it is an estimate, not a count of what either program executes.
    achieved_gflops is reported for the median run (the median of the runs' values when --runs is even).

Output: one JSON line on stdout; diagnostics (per-step losses and times) go to stderr. Keys (swiftcpp_bench_train
prints the same keys, with "impl": "swiftcpp"; bench/report_train.py reads them):
  impl, mode ("lora"|"full"), dtype ("float32"|"bf16"), tokens_per_s, tokens_per_s_min, tokens_per_s_max,
  step_ms_median, losses [warmup + steps floats], peak_rss_mb, threads, torch (version string of the torch /
  LibTorch in use), blas [paths of the BLAS libraries mapped into the process], matmul_gflops, achieved_gflops,
  and for the report's settings line: model, batch, seq, warmup, steps, runs, lr,
  lora ({"r", "lora_alpha", "use_rslora", "scale", "target_modules"} or null in full mode).
  Extras printed here only: tokens_per_s_runs, trainable_params, torch_threads, omp_num_threads.
"""

import argparse
import json
import math
import os
import sys
import time

LORA_TARGETS = {
    "q_proj": ("self_attn", "wq"), "k_proj": ("self_attn", "wk"), "v_proj": ("self_attn", "wv"),
    "o_proj": ("self_attn", "wo"), "gate_proj": ("mlp", "wg"), "up_proj": ("mlp", "wu"),
    "down_proj": ("mlp", "wd"),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch eager Llama training baseline (see module docstring)")
    ap.add_argument("--model", required=True, help="Hugging Face checkpoint folder (config.json, model.safetensors)")
    ap.add_argument("--batches", required=True, help="JSON Lines file, one micro-batch (= one step) per line")
    ap.add_argument("--adapter", help="PEFT adapter folder with the LoRA init values (required for --mode lora)")
    ap.add_argument("--mode", choices=("lora", "full"), default="lora")
    ap.add_argument("--dtype", choices=("float32", "bf16"), default="float32")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--clip-grad-norm", type=float, default=0.0, help="clip the total grad norm (0 = off)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones (each run)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    return ap.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    # Must happen before torch (and its OpenMP runtime) is loaded.
    os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baseline_infer import (load_checkpoint, load_safetensors, loaded_blas, peak_rss_mb,  # noqa: E402
                            read_dims, rms_norm, rotate_half)


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------
class LoRALinear:
    """y = x W^T + scale * (x A^T) B^T; W frozen or trainable, A/B optional."""

    def __init__(self, weight, a=None, b=None, scale=0.0):
        self.weight, self.a, self.b, self.scale = weight, a, b, scale

    def __call__(self, x):
        y = F.linear(x, self.weight)
        if self.a is not None:
            y = y + self.scale * F.linear(F.linear(x, self.a), self.b)
        return y


class TrainLlama:
    def __init__(self, cfg, w, mode, adapter=None):
        self.cfg = cfg
        read_dims(self, cfg)
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias are not supported by this baseline")
        full = mode == "full"

        def param(t):
            return torch.nn.Parameter(t, requires_grad=full)

        self.base_params = []  # every checkpoint tensor, in load order
        self.embed = param(w.pop("model.embed_tokens.weight"))
        self.base_params.append(self.embed)
        names = (("ln1", "input_layernorm.weight"), ("wq", "self_attn.q_proj.weight"),
                 ("wk", "self_attn.k_proj.weight"), ("wv", "self_attn.v_proj.weight"),
                 ("wo", "self_attn.o_proj.weight"), ("ln2", "post_attention_layernorm.weight"),
                 ("wg", "mlp.gate_proj.weight"), ("wu", "mlp.up_proj.weight"), ("wd", "mlp.down_proj.weight"))
        self.layers = []
        for i in range(self.n_layers):
            p = "model.layers.%d." % i
            L = {}
            for k, n in names:
                L[k] = param(w.pop(p + n))
                self.base_params.append(L[k])
            self.layers.append(L)
        self.norm = param(w.pop("model.norm.weight"))
        self.base_params.append(self.norm)
        lm = w.pop("lm_head.weight", None)
        if cfg.get("tie_word_embeddings", False) and lm is None:
            self.lm_head = self.embed
        else:
            if lm is None:
                raise ValueError("lm_head.weight missing and tie_word_embeddings is false")
            self.lm_head = param(lm)
            self.base_params.append(self.lm_head)
        if w:
            raise ValueError("unused tensors in checkpoint: %s" % sorted(w)[:5])

        # Projections (LoRA-wrapped where the adapter targets them).
        self.lora_params = []
        self.n_lora = 0
        lora_w, scale, targets = {}, 0.0, set()
        if adapter is not None:
            lora_w, scale, targets = adapter
        for i, L in enumerate(self.layers):
            for mod, (blk, key) in LORA_TARGETS.items():
                a = b = None
                if mod in targets:
                    pre = "base_model.model.model.layers.%d.%s.%s." % (i, blk, mod)
                    try:
                        a = torch.nn.Parameter(lora_w.pop(pre + "lora_A.weight").contiguous())
                        b = torch.nn.Parameter(lora_w.pop(pre + "lora_B.weight").contiguous())
                    except KeyError as e:
                        raise ValueError("adapter lacks %s" % e)
                    out_f, in_f = L[key].shape
                    if a.shape[1] != in_f or b.shape[0] != out_f or a.shape[0] != b.shape[1]:
                        raise ValueError("layer %d %s: lora_A %s / lora_B %s do not fit weight %s"
                                         % (i, mod, tuple(a.shape), tuple(b.shape), tuple(L[key].shape)))
                    self.lora_params += [a, b]
                    self.n_lora += a.numel() + b.numel()
                L["p_" + key] = LoRALinear(L[key], a, b, scale)
        if lora_w:
            raise ValueError("unused tensors in adapter: %s" % sorted(lora_w)[:5])

        max_pos = cfg.get("max_position_embeddings", 2048)
        theta = float(cfg.get("rope_theta", 10000.0))
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.int64).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()
        self.max_pos = max_pos

        # Parameters of the matmul path (projections + lm_head), for the FLOP estimate.
        self.n_mm = sum(L[k].numel() for L in self.layers for _, (_, k) in LORA_TARGETS.items())
        self.n_mm += self.lm_head.numel()

    def trainable(self):
        return [p for p in self.base_params if p.requires_grad] + self.lora_params

    def _attention(self, L, x, cos, sin, allowed):
        B, T, _ = x.shape
        H, Hkv, G, Dh = self.n_heads, self.n_kv, self.group, self.head_dim
        q = L["p_wq"](x).view(B, T, H, Dh)
        k = L["p_wk"](x).view(B, T, Hkv, Dh)
        v = L["p_wv"](x).view(B, T, Hkv, Dh)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.transpose(1, 2)  # [B, Hkv, T, Dh]
        v = v.transpose(1, 2)
        # GQA without repeating K/V: query head h = j*G + g uses kv head j -> [B, Hkv, G*T, Dh].
        q = q.view(B, T, Hkv, G, Dh).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, Dh)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(Dh))  # [B, Hkv, G*T, T]
        scores = scores.view(B, Hkv, G, T, T).masked_fill(~allowed, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), dim=-1).view(B, Hkv, G * T, T)
        out = torch.matmul(probs, v)  # autocast casts probs to bf16 in bf16 mode
        out = out.view(B, Hkv, G, T, Dh).permute(0, 3, 1, 2, 4).reshape(B, T, H * Dh)
        return L["p_wo"](out)

    def forward(self, ids, pos, key_valid, seg):
        """ids/pos [B, T] int64, key_valid [B, T] bool or None, seg [B, T] int64 or None -> logits [B, T, V]."""
        B, T = ids.shape
        if int(pos.max()) >= self.max_pos or int(pos.min()) < 0:
            raise ValueError("position id outside [0, max_position_embeddings)")
        idx = torch.arange(T)
        allowed = (idx.view(1, T) <= idx.view(T, 1)).view(1, T, T)  # [q, k]
        if key_valid is not None:
            allowed = allowed & key_valid.view(B, 1, T)
        if seg is not None:
            allowed = allowed & (seg.view(B, T, 1) == seg.view(B, 1, T))
        allowed = allowed.expand(B, T, T).view(B, 1, 1, T, T)
        cos = self.cos[pos].view(B, T, 1, self.head_dim)
        sin = self.sin[pos].view(B, T, 1, self.head_dim)
        x = F.embedding(ids, self.embed)
        for L in self.layers:
            h = rms_norm(x, L["ln1"], self.eps)
            x = x + self._attention(L, h, cos, sin, allowed)
            h = rms_norm(x, L["ln2"], self.eps)
            x = x + L["p_wd"](F.silu(L["p_wg"](h)) * L["p_wu"](h))
        x = rms_norm(x, self.norm, self.eps)
        return F.linear(x, self.lm_head)


def load_adapter(folder):
    with open(os.path.join(folder, "adapter_config.json")) as fh:
        acfg = json.load(fh)
    r = int(acfg["r"])
    alpha = float(acfg.get("lora_alpha", r))
    scale = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
    targets = acfg.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    targets = set(targets or [])
    bad = targets - set(LORA_TARGETS)
    if bad:
        raise ValueError("unsupported target_modules %s (supported: %s)" % (sorted(bad), sorted(LORA_TARGETS)))
    w = load_safetensors(os.path.join(folder, "adapter_model.safetensors"))
    return (w, scale, targets), {"r": r, "lora_alpha": alpha, "use_rslora": bool(acfg.get("use_rslora")),
                                 "scale": scale, "target_modules": sorted(targets)}


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------
def load_batches(path):
    """-> list of dicts of tensors (ids, labels, pos int64 [B,T]; key_valid bool or None; seg int64 or None)."""
    out = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            ids = torch.tensor(rec["input_ids"], dtype=torch.int64)
            if ids.dim() != 2:
                raise ValueError("%s:%d: input_ids must be B x T" % (path, n))
            b = {"ids": ids, "labels": torch.tensor(rec["labels"], dtype=torch.int64),
                 "pos": torch.tensor(rec["position_ids"], dtype=torch.int64), "key_valid": None, "seg": None}
            if rec.get("key_valid") is not None:
                b["key_valid"] = torch.tensor(rec["key_valid"], dtype=torch.int64) != 0
            if rec.get("segment_ids") is not None:
                b["seg"] = torch.tensor(rec["segment_ids"], dtype=torch.int64)
            for k in ("labels", "pos", "key_valid", "seg"):
                if b[k] is not None and b[k].shape != ids.shape:
                    raise ValueError("%s:%d: %s has shape %s, input_ids %s"
                                     % (path, n, k, tuple(b[k].shape), tuple(ids.shape)))
            kv = b["key_valid"]
            b["tokens"] = int(kv.sum()) if kv is not None else ids.numel()
            row_valid = kv.sum(1) if kv is not None else torch.full((ids.shape[0],), ids.shape[1])
            b["sq_valid"] = int((row_valid.to(torch.int64) ** 2).sum())
            out.append(b)
    if not out:
        raise ValueError("%s: no batches" % path)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Benchmark
# ---------------------------------------------------------------------------------------------------------------
def step_loss(model, b, bf16):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model.forward(b["ids"], b["pos"], b["key_valid"], b["seg"])
        labels = b["labels"].view(-1)
        n_lab = int((labels != -100).sum())
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels, ignore_index=-100,
                               reduction="sum")
        loss = loss / max(n_lab, 1)
    return loss


def one_run(args, cfg, batches, n_steps):
    """Fresh model + optimizer, warm-up + timed steps. Returns (losses, step_seconds[timed], tokens[timed], model)."""
    _, w = load_checkpoint(args.model)
    adapter = load_adapter(args.adapter)[0] if args.mode == "lora" else None
    model = TrainLlama(cfg, w, args.mode, adapter)
    del w, adapter
    params = model.trainable()
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    bf16 = args.dtype == "bf16"
    losses, secs, toks = [], [], []
    for i in range(n_steps):
        b = batches[i % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_loss(model, b, bf16)
        loss.backward()
        if args.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip_grad_norm)
        opt.step()
        t1 = time.perf_counter()
        lv = float(loss.detach())
        losses.append(lv)
        if i >= args.warmup:
            secs.append(t1 - t0)
            toks.append(b["tokens"])
        print("step %d loss %.6f %.1f ms%s" % (i, lv, (t1 - t0) * 1e3, "" if i >= args.warmup else " (warm-up)"),
              file=sys.stderr)
    return losses, secs, toks, model


def matmul_ceiling(dtype, n=1024, reps=5):
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    c = torch.empty(n, n, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def main(args):
    if args.steps < 1 or args.warmup < 0 or args.runs < 1:
        raise SystemExit("need --steps >= 1, --warmup >= 0 and --runs >= 1")
    if args.mode == "lora" and not args.adapter:
        raise SystemExit("--mode lora needs --adapter DIR (the LoRA init values)")
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.model, "config.json")) as fh:
        cfg = json.load(fh)
    batches = load_batches(args.batches)
    lora_info = load_adapter(args.adapter)[1] if args.mode == "lora" else None
    gflops_ceiling = matmul_ceiling(torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    n_steps = args.warmup + args.steps

    run_tps, run_gflops, all_ms, first_losses, model = [], [], [], None, None
    for r in range(args.runs):
        model = None  # free the previous run's model before loading the next
        losses, secs, toks, model = one_run(args, cfg, batches, n_steps)
        if first_losses is None:
            first_losses = losses
        run_tps.append(sum(toks) / sum(secs))
        flops = 0.0
        for i in range(args.warmup, n_steps):
            b = batches[i % len(batches)]
            per_tok = (6.0 * model.n_mm if args.mode == "full" else 4.0 * model.n_mm + 6.0 * model.n_lora)
            attn = 12.0 * model.n_layers * model.n_heads * model.head_dim * b["sq_valid"]
            flops += per_tok * b["tokens"] + attn
        run_gflops.append(flops / sum(secs) / 1e9)
        all_ms += [s * 1e3 for s in secs]
        print("run %d: %.1f tokens/s" % (r, run_tps[-1]), file=sys.stderr)

    med_run = int(np.argsort(run_tps)[(len(run_tps) - 1) // 2]) if len(run_tps) % 2 else None
    b0 = batches[0]
    result = {
        "impl": "pytorch-eager",
        "model": args.model,
        "mode": args.mode,
        "dtype": args.dtype,
        "threads": args.threads,
        "batch": int(b0["ids"].shape[0]),
        "seq": int(b0["ids"].shape[1]),
        "warmup": args.warmup,
        "steps": args.steps,
        "runs": args.runs,
        "lr": args.lr,
        "tokens_per_s": float(np.median(run_tps)),
        "tokens_per_s_min": float(min(run_tps)),
        "tokens_per_s_max": float(max(run_tps)),
        "tokens_per_s_runs": run_tps,
        "step_ms_median": float(np.median(all_ms)),
        "losses": first_losses,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "matmul_gflops": gflops_ceiling,
        "achieved_gflops": run_gflops[med_run] if med_run is not None else float(np.median(run_gflops)),
        "trainable_params": sum(p.numel() for p in model.trainable()),
        "lora": lora_info,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "blas": loaded_blas(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
