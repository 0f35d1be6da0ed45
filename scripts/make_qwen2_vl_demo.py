#!/usr/bin/python3
"""Build the Qwen2-VL demo: a small Qwen2-VL checkpoint around the bundled stories260K and a synthetic
shapes-and-colours dataset whose images come in several sizes and aspect ratios (so the number of image tokens
changes from image to image), the counterpart of scripts/make_mm_demo.py (the LLaVA demo), whose helpers it uses.

Usage (from the repository root):
    /usr/bin/python3 scripts/make_qwen2_vl_demo.py [--out demo/qwen2-vl-demo] [--train 8000] [--heldout 200] [--seed 0]
    swiftcpp train --recipe recipes/qwen2_vl_demo.yaml
    swiftcpp infer --model demo/qwen2-vl-demo --adapters output/qwen2_vl_demo/v0-.../checkpoint-N \\
                   --prompts-file demo/qwen2-vl-demo/heldout_prompts.jsonl --output heldout_out.jsonl --temperature 0
    /usr/bin/python3 scripts/score_mm_demo.py heldout_out.jsonl

Output folder (a Hugging Face Qwen2-VL checkpoint in the layout of ../shared/assets/reference/qwen2_vl/tiny-qwen2-vl,
plus data):
    config.json               Qwen2VLForConditionalGeneration: the language model at the top level with
                              models/stories260K/config.json's sizes (hidden 64, 5 layers, 8 heads, 4 KV heads,
                              head_dim 8, MLP 172, rope_theta 1e4, tied embeddings), vocab_size 520 (stories260K's
                              512 pieces + the 8 added tokens below), rope_scaling {"type": "mrope",
                              "mrope_section": MROPE_SECTION}, no sliding window; vision_config = VISION (a 2-block
                              ViT of width 64, patch 7, whose merger writes the LLM width 64)
    model.safetensors         model.*: stories260K's real weights (a Llama) as Qwen2: q/k/v biases of zeros;
                              embed_tokens (tied to the output layer, so no lm_head.weight) gets 8 new rows, each the
                              mean of the 512 trained rows (as make_mm_demo.py does); visual.*: random, seeded
                              (init_visual: make_mm_demo.py's CLIP rules mapped onto the Qwen2-VL tower)
    preprocessor_config.json  Qwen2VLImageProcessor, min_pixels 3136 (56 x 56), max_pixels 12544 (112 x 112), CLIP
                              mean/std, patch 7, merge 2, temporal patch 2: the demo's image sizes are multiples of
                              14 inside those bounds, so they are used as they are (one merged token per 14 x 14 px).
                              Patch 7 and width 64 (Qwen2-VL's own are 14 and 1280) give each random patch embedding
                              about the input the LLaVA demo's CLIP tower gets (8 x 8 px into width 64): at patch
                              14 and width 32 the frozen tower kept too little of a shape's outline (shape answers
                              63% after 1,000 steps, colours 100%)
    tokenizer.model           stories260K's sentencepiece model
    tokenizer_config.json, special_tokens_map.json, chat_template.json
                              LlamaTokenizer (no BOS added, as Qwen2's tokenizer) with Qwen2-VL's special tokens
                              added at 512-519 (ADDED), eos <|im_end|>, pad <|endoftext|>, and Qwen2-VL's chat
                              template (copied from the tiny reference; swiftcpp detects it as "qwen2")
    generation_config.json    generation stops at <|im_end|>: --generation-config qwen writes Qwen2-VL's ids (bos
                              <|endoftext|>, eos [<|im_end|>, <|endoftext|>]); the default, compat, writes bos <s>
                              and eos [</s>, <|im_end|>], because swiftcpp today reads the pieces of the BOS and
                              the first EOS from the sentencepiece model, which does not hold the added tokens
    img/NNNNN.png             RGB PNGs of one of the sizes in SIZES (h x w: 56x56 ... 112x56 px, 16 to 36 image
                              tokens): one shape (circle, square, triangle) in one colour (red, green, blue,
                              yellow) at a random place and size on a plain grey background, a little pixel noise;
                              img/00000.png .. the first --train are training images, the rest held out
    train.jsonl               ms-swift rows: {"messages": [{"role": "user", "content": "<image>What colour is the
                              shape?"}, {"role": "assistant", "content": "red"}, {"role": "user", "content": "What
                              shape is it?"}, {"role": "assistant", "content": "circle"}], "images":
                              ["img/00001.png"]}: both questions about each image, in random order
    val.jsonl                 the held-out images, one question each (colour and shape alternating)
    heldout_prompts.jsonl     `swiftcpp infer --prompts-file` rows: each held-out image asked both questions,
                              {"messages": [{"role": "user", "content": "<image>What colour is the shape?"}],
                              "images": ["img/08000.png"], "answer": "red", "kind": "colour"}; score the --output
                              with scripts/score_mm_demo.py
    heldout.jsonl, eval_task.yaml, eval_generate.yaml
                              the same questions as `swiftcpp eval` tasks (multiple choice; greedy generation with
                              exact match), as in the LLaVA demo

Everything is a function of --seed (numpy's default_rng). Files are written under temporary names and renamed.
Only numpy and the standard library are used.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_mm_demo as mm  # noqa: E402  (the LLaVA demo: PNG and safetensors writers, colours, shapes, rows)

REPO = mm.REPO
STORIES = mm.STORIES
REFERENCE = os.path.join(os.path.dirname(REPO), "shared", "assets", "reference", "qwen2_vl", "tiny-qwen2-vl")

# Qwen2-VL's special tokens in Qwen's order (there 151643..., without the object_ref / box / quad tokens), after
# stories260K's 512 pieces: exactly 8, so the vocabulary is 520, a multiple of 8, with no unused row.
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
         "<|image_pad|>", "<|video_pad|>"]
FIRST_ADDED = 512
TOKEN = {t: FIRST_ADDED + i for i, t in enumerate(ADDED)}
VOCAB = FIRST_ADDED + len(ADDED)  # 520

MROPE_SECTION = [2, 1, 1]  # head_dim 8: 4 rotary frequencies; 2 * (2 + 1 + 1) = 8. Text positions (n, n, n) are
                           # stories260K's plain RoPE.
VISION = {
    "depth": 2,
    "embed_dim": 64,
    "hidden_size": 64,  # the merger's output width = the language model's hidden size
    "hidden_act": "quick_gelu",
    "in_channels": 3,
    "mlp_ratio": 4,
    "model_type": "qwen2_vl",
    "num_heads": 2,
    "patch_size": 7,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
UNIT = VISION["patch_size"] * VISION["spatial_merge_size"]  # 14 px: one merged image token
MIN_PIXELS = (4 * UNIT) ** 2
MAX_PIXELS = (8 * UNIT) ** 2
# Image sizes (height, width) in pixels, all multiples of UNIT: 16, 24, 24, 36, 32 and 32 tokens. At a quarter of
# these (4-9 tokens) the demo reached 87.5% held-out: circles and squares stayed confused.
SIZES = [(4 * UNIT, 4 * UNIT), (4 * UNIT, 6 * UNIT), (6 * UNIT, 4 * UNIT), (6 * UNIT, 6 * UNIT), (4 * UNIT, 8 * UNIT),
         (8 * UNIT, 4 * UNIT)]


# ---------------------------------------------------------------------------------------------------------------
# The checkpoint


def reference_chat_template():
    """Qwen2-VL-Instruct's chat template, as the tiny reference checkpoint ships it."""
    path = os.path.join(REFERENCE, "tokenizer_config.json")
    try:
        with open(path) as fh:
            return json.load(fh)["chat_template"]
    except (OSError, KeyError, ValueError) as e:
        raise SystemExit("%s: cannot read the Qwen2-VL chat template (%s)" % (path, e))


def init_visual(rng, v):
    """The Qwen2-VL tower (`visual.*`) with make_mm_demo.py's CLIP initialisation carried over (D the width 64,
    L the depth): patch embedding N(0, 0.02); attention qkv N(0, D^-0.5 (2L)^-0.5), proj N(0, D^-0.5); fc1
    N(0, (2D)^-0.5), fc2 N(0, D^-0.5 (2L)^-0.5); LayerNorms weight 1, bias 0; linear biases 0; the merger's
    Linears N(0, 0.02) (the projector's rule). Drawn in the order listed in the file."""
    D, L = v["embed_dim"], v["depth"]
    F = D * v["mlp_ratio"]
    C, T, P = v["in_channels"], v["temporal_patch_size"], v["patch_size"]
    M = D * v["spatial_merge_size"] ** 2
    normal = lambda shape, std: (rng.standard_normal(shape) * std).astype(np.float32)
    zeros = lambda n: np.zeros((n,), np.float32)
    ones = lambda n: np.ones((n,), np.float32)
    in_std = D ** -0.5 * (2 * L) ** -0.5
    t = [("visual.patch_embed.proj.weight", normal((D, C, T, P, P), mm.INITIALIZER_RANGE))]
    for i in range(L):
        p = "visual.blocks.%d." % i
        t += [
            (p + "norm1.weight", ones(D)),
            (p + "norm1.bias", zeros(D)),
            (p + "norm2.weight", ones(D)),
            (p + "norm2.bias", zeros(D)),
            (p + "attn.qkv.weight", normal((3 * D, D), in_std)),
            (p + "attn.qkv.bias", zeros(3 * D)),
            (p + "attn.proj.weight", normal((D, D), D ** -0.5)),
            (p + "attn.proj.bias", zeros(D)),
            (p + "mlp.fc1.weight", normal((F, D), (2 * D) ** -0.5)),
            (p + "mlp.fc1.bias", zeros(F)),
            (p + "mlp.fc2.weight", normal((D, F), in_std)),
            (p + "mlp.fc2.bias", zeros(D)),
        ]
    t += [
        ("visual.merger.ln_q.weight", ones(D)),
        ("visual.merger.ln_q.bias", zeros(D)),
        ("visual.merger.mlp.0.weight", normal((M, M), mm.INITIALIZER_RANGE)),
        ("visual.merger.mlp.0.bias", zeros(M)),
        ("visual.merger.mlp.2.weight", normal((v["hidden_size"], M), mm.INITIALIZER_RANGE)),
        ("visual.merger.mlp.2.bias", zeros(v["hidden_size"])),
    ]
    return t


def language_model(text):
    """stories260K's tensors as a Qwen2 language model: zero q/k/v biases after each projection, the embedding
    matrix grown to VOCAB rows (each new row the mean of the trained ones), lm_head only when not tied."""
    lm = mm.read_safetensors(os.path.join(STORIES, "model.safetensors"))
    grow = lambda x: np.concatenate([x, np.repeat(x.mean(axis=0, keepdims=True), VOCAB - x.shape[0], axis=0)], axis=0)
    tensors = []
    for name, x in lm.items():
        if name == "model.embed_tokens.weight":
            # The added tokens start at the mean embedding: as likely as an average piece through the tied output
            # layer; <|image_pad|> is never read (its positions take image features).
            x = grow(x)
        if name == "lm_head.weight":
            if text["tie_word_embeddings"]:
                continue
            x = grow(x)
        tensors.append((name, x))
        for proj in ("q_proj", "k_proj", "v_proj"):
            if name.endswith("self_attn.%s.weight" % proj):
                tensors.append((name[: -len("weight")] + "bias", np.zeros((x.shape[0],), np.float32)))
    return tensors


def write_checkpoint(out, rng, seed, generation="compat"):
    with open(os.path.join(STORIES, "config.json")) as fh:
        text = json.load(fh)
    if text["vocab_size"] != FIRST_ADDED:
        raise SystemExit("%s: expected stories260K's vocabulary of 512" % STORIES)
    head_dim = text.get("head_dim", text["hidden_size"] // text["num_attention_heads"])
    if head_dim != text["hidden_size"] // text["num_attention_heads"] or 2 * sum(MROPE_SECTION) != head_dim:
        raise SystemExit("%s: head_dim %d does not fit Qwen2 (hidden / heads) or mrope_section %s"
                         % (STORIES, head_dim, MROPE_SECTION))
    if VISION["hidden_size"] != text["hidden_size"]:
        raise SystemExit("the vision merger's output width must be the language model's hidden size")
    config = {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": TOKEN["<|endoftext|>"],
        "eos_token_id": TOKEN["<|im_end|>"],
        "hidden_act": text["hidden_act"],
        "hidden_size": text["hidden_size"],
        "image_token_id": TOKEN["<|image_pad|>"],
        "initializer_range": mm.INITIALIZER_RANGE,
        "intermediate_size": text["intermediate_size"],
        "max_position_embeddings": text["max_position_embeddings"],
        "max_window_layers": text["num_hidden_layers"],
        "model_type": "qwen2_vl",
        "num_attention_heads": text["num_attention_heads"],
        "num_hidden_layers": text["num_hidden_layers"],
        "num_key_value_heads": text["num_key_value_heads"],
        "rms_norm_eps": text["rms_norm_eps"],
        "rope_scaling": {"type": "mrope", "mrope_section": MROPE_SECTION},
        "rope_theta": text["rope_theta"],
        "sliding_window": text["max_position_embeddings"],
        "tie_word_embeddings": text["tie_word_embeddings"],
        "torch_dtype": "float32",
        "transformers_version": "4.46.0",
        "use_cache": True,
        "use_sliding_window": False,
        "video_token_id": TOKEN["<|video_pad|>"],
        "vision_config": VISION,
        "vision_end_token_id": TOKEN["<|vision_end|>"],
        "vision_start_token_id": TOKEN["<|vision_start|>"],
        "vision_token_id": TOKEN["<|vision_pad|>"],
        "vocab_size": VOCAB,
    }
    tensors = language_model(text) + init_visual(rng, VISION)
    metadata = {"format": "pt", "generator": "swiftcpp scripts/make_qwen2_vl_demo.py", "seed": str(seed)}
    mm.write_atomic(os.path.join(out, "model.safetensors"), mm.safetensors_bytes(tensors, metadata))

    mm.write_json(os.path.join(out, "preprocessor_config.json"), {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": mm.CLIP_MEAN,
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": mm.CLIP_STD,
        "max_pixels": MAX_PIXELS,
        "merge_size": VISION["spatial_merge_size"],
        "min_pixels": MIN_PIXELS,
        "patch_size": VISION["patch_size"],
        "processor_class": "Qwen2VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"max_pixels": MAX_PIXELS, "min_pixels": MIN_PIXELS},
        "temporal_patch_size": VISION["temporal_patch_size"],
    })

    tmp = os.path.join(out, "tokenizer.model.tmp-%d" % os.getpid())
    shutil.copyfile(os.path.join(STORIES, "tokenizer.model"), tmp)
    os.replace(tmp, os.path.join(out, "tokenizer.model"))
    template = reference_chat_template()
    added = lambda content: {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": True}
    decoder = {"0": added("<unk>"), "1": added("<s>"), "2": added("</s>")}
    decoder.update({str(TOKEN[t]): added(t) for t in ADDED})
    mm.write_json(os.path.join(out, "tokenizer_config.json"), {
        "add_bos_token": False,  # Qwen2's tokenizer adds nothing; the template starts with <|im_start|>
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ADDED[1:],
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "legacy": True,
        "model_max_length": text["max_position_embeddings"],
        "pad_token": "<|endoftext|>",
        "padding_side": "right",
        "processor_class": "Qwen2VLProcessor",
        "sp_model_kwargs": {},
        "split_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
    })
    mm.write_json(os.path.join(out, "chat_template.json"), {"chat_template": template})
    mm.write_json(os.path.join(out, "special_tokens_map.json"), {
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>",
        "additional_special_tokens": ADDED[1:],
    })
    if generation == "qwen":
        # Qwen2-VL's own: bos <|endoftext|>, generation stops at <|im_end|> (or <|endoftext|>).
        bos, eos = TOKEN["<|endoftext|>"], [TOKEN["<|im_end|>"], TOKEN["<|endoftext|>"]]
    else:
        # "compat": swiftcpp (2026-12-03) looks up the piece of the BOS and of the first EOS id in the
        # sentencepiece model itself, which has no added tokens (ids >= 512 fail with "token id 512 is outside the
        # vocabulary [0, 512)"), so the ids it reads first are stories260K's <s> and </s>; generation still stops
        # at <|im_end|>, the second EOS, and no BOS is ever added (add_bos_token false). config.json keeps Qwen's
        # ids either way.
        bos, eos = 1, [2, TOKEN["<|im_end|>"]]
    mm.write_json(os.path.join(out, "generation_config.json"), {
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": TOKEN["<|endoftext|>"],
        "transformers_version": "4.46.0"})
    # config.json last: a folder with config.json is a finished checkpoint.
    mm.write_json(os.path.join(out, "config.json"), config)
    return sum(x.size for _, x in tensors)


# ---------------------------------------------------------------------------------------------------------------
# The data


def draw(rng, shape, colour, height, width):
    """One height x width RGB image: `shape` in `colour` on a plain grey, anti-aliased by 4x4 supersampling, plus
    Gaussian pixel noise; make_mm_demo.draw's rules, the shape's size a share of the shorter side."""
    k = 4  # supersampling
    size = rng.uniform(*mm.SIZE_RANGE) * min(height, width)  # side, diameter or triangle base, in pixels
    cx = rng.uniform(size / 2, width - size / 2)
    cy = rng.uniform(size / 2, height - size / 2)
    x, y = np.meshgrid((np.arange(width * k) + 0.5) / k, (np.arange(height * k) + 0.5) / k)
    if shape == "circle":
        inside = (x - cx) ** 2 + (y - cy) ** 2 <= (size / 2) ** 2
    elif shape == "square":
        inside = (np.abs(x - cx) <= size / 2) & (np.abs(y - cy) <= size / 2)
    else:  # an upright triangle: apex at the top centre, base at the bottom
        top, bottom = cy - size / 2, cy + size / 2
        half = (y - top) / size * (size / 2)
        inside = (y >= top) & (y <= bottom) & (np.abs(x - cx) <= half)
    cover = inside.reshape(height, k, width, k).mean(axis=(1, 3))[..., None]  # [h, w, 1]
    background = np.full(3, rng.uniform(*mm.BACKGROUND_RANGE))
    fill = np.clip(np.array(mm.COLOURS[colour], dtype=np.float64) + rng.uniform(-20, 20, 3), 0, 255)
    img = background * (1 - cover) + fill * cover + rng.normal(0, mm.NOISE_STD, (height, width, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def image_tokens(height, width):
    unit = VISION["patch_size"] * VISION["spatial_merge_size"]
    return (height // unit) * (width // unit)


def write_jsonl(path, rows):
    mm.write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8"))


def write_data(out, rng, n_train, n_heldout):
    os.makedirs(os.path.join(out, "img"), exist_ok=True)
    colours = sorted(mm.COLOURS)
    train, val, heldout, prompts = [], [], [], []
    tokens = []
    for i in range(n_train + n_heldout):
        shape = mm.SHAPES[rng.integers(len(mm.SHAPES))]
        colour = colours[rng.integers(len(colours))]
        height, width = SIZES[rng.integers(len(SIZES))]
        tokens.append(image_tokens(height, width))
        name = "img/%05d.png" % i
        mm.write_atomic(os.path.join(out, name), mm.png_bytes(draw(rng, shape, colour, height, width)))
        answers = {"colour": colour, "shape": shape}
        if i < n_train:
            # Both questions about the image, in random order: every image teaches a colour and a shape.
            kinds = ["colour", "shape"] if rng.integers(2) == 0 else ["shape", "colour"]
            train.append(mm.chat_row([(mm.QUESTIONS[k], answers[k]) for k in kinds], name))
            continue
        kind = "colour" if i % 2 == 0 else "shape"
        val.append(mm.chat_row([(mm.QUESTIONS[kind], answers[kind])], name))
        for kind, options in (("colour", colours), ("shape", mm.SHAPES)):
            heldout.append({"question": mm.QUESTIONS[kind], "options": options, "answer": answers[kind],
                            "kind": kind, "images": [name]})
            prompts.append({"messages": [{"role": "user", "content": "<image>" + mm.QUESTIONS[kind]}],
                            "images": [name], "answer": answers[kind], "kind": kind})
    for file, rows in (("train.jsonl", train), ("val.jsonl", val), ("heldout.jsonl", heldout),
                       ("heldout_prompts.jsonl", prompts)):
        write_jsonl(os.path.join(out, file), rows)
    mm.write_atomic(os.path.join(out, "eval_task.yaml"), (
        "# Held-out accuracy of the Qwen2-VL demo (scripts/make_qwen2_vl_demo.py): each held-out image asked both\n"
        "# questions, scored as multiple choice over the colours / shapes. Run with --apply-chat-template (the qwen2\n"
        "# template the recipe trains with):\n"
        "#   swiftcpp eval --model demo/qwen2-vl-demo [--adapters CHECKPOINT] \\\n"
        "#       --tasks demo/qwen2-vl-demo/eval_task.yaml --apply-chat-template\n"
        "name: qwen2_vl_demo_heldout\n"
        "data: heldout.jsonl\n"
        "prompt: \"<image>{question}\"\n"
        "choices: options\n"
        "answer: answer\n"
        "image_field: images\n").encode("utf-8"))
    mm.write_atomic(os.path.join(out, "eval_generate.yaml"), (
        "# The same held-out questions answered by greedy generation (stopping at <|im_end|>), exact match on the\n"
        "# word.\n"
        "name: qwen2_vl_demo_generate\n"
        "type: generation\n"
        "data: heldout.jsonl\n"
        "prompt: \"<image>{question}\"\n"
        "answer: \"{answer}\"\n"
        "max_new_tokens: 8\n"
        "answer_regex: \"([a-z]+)\"\n"
        "image_field: images\n").encode("utf-8"))
    return len(train), len(val), len(prompts), tokens


def main(argv=None):
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", default=os.path.join("demo", "qwen2-vl-demo"),
                    help="output folder (default demo/qwen2-vl-demo)")
    ap.add_argument("--train", type=int, default=8000, help="training images (both questions each)")
    ap.add_argument("--heldout", type=int, default=200, help="held-out images (two questions each)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tower, the merger and the data (default 0)")
    ap.add_argument("--generation-config", choices=["compat", "qwen"], default="compat",
                    help="generation_config.json's bos/eos: qwen = Qwen2-VL's (bos <|endoftext|>, eos [<|im_end|>, "
                         "<|endoftext|>]); compat (default) = bos <s>, eos [</s>, <|im_end|>], which today's swiftcpp "
                         "needs with a sentencepiece tokenizer whose special tokens are added ones")
    args = ap.parse_args(argv)
    if args.train < 1 or args.heldout < 1:
        ap.error("--train and --heldout must be positive")
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    params = write_checkpoint(args.out, rng, args.seed, args.generation_config)
    n_train, n_val, n_prompts, tokens = write_data(args.out, rng, args.train, args.heldout)
    counts = {n: tokens.count(n) for n in sorted(set(tokens))}
    print("%s: Qwen2-VL checkpoint (%d parameters), %d images of %s px (image tokens per image %s), %d training rows, "
          "%d validation rows, %d held-out prompts" % (
              args.out, params, len(tokens), ", ".join("%dx%d" % s for s in SIZES),
              ", ".join("%d: %d images" % (n, c) for n, c in counts.items()), n_train, n_val, n_prompts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
