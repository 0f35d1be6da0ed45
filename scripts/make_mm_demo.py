#!/usr/bin/python3
"""Build the LLaVA demo: a small vision-language checkpoint around the bundled stories260K and a synthetic
shapes-and-colours dataset, so `swiftcpp train` and `swiftcpp eval` can show images being learned on a laptop.

Usage (from the repository root):
    /usr/bin/python3 scripts/make_mm_demo.py [--out demo/llava-demo] [--train 8000] [--heldout 200] [--seed 0]
    swiftcpp eval  --model demo/llava-demo --tasks demo/llava-demo/eval_task.yaml --apply-chat-template
    swiftcpp train --recipe recipes/llava_demo.yaml
    swiftcpp eval  --model demo/llava-demo --adapters output/llava_demo/v0-.../checkpoint-1000 \\
                   --tasks demo/llava-demo/eval_task.yaml,demo/llava-demo/eval_generate.yaml --apply-chat-template

Output folder (a Hugging Face LLaVA-1.5 checkpoint plus data):
    config.json               LlavaForConditionalGeneration: text_config = models/stories260K/config.json with
                              vocab_size 520 (stories260K's 512 pieces, <image> = 512, 7 unused rows, as
                              llava-hf pads vocabularies), vision_config = a small CLIP tower (VISION below),
                              projector_hidden_act gelu, vision_feature_layer -1, image_token_index 512
    model.safetensors         language_model.*: stories260K's real weights; embed_tokens (tied to the output
                              layer, as in stories260K) gets 8 new rows, each the mean of the 512 trained rows;
                              vision_tower.* and multi_modal_projector.*: random, seeded (CLIP's initialisation,
                              see init_vision; the projector normal(0, 0.02), biases 0)
    preprocessor_config.json  CLIPImageProcessor at the tower's image_size (shortest_edge and crop), CLIP mean/std
    tokenizer.model           stories260K's sentencepiece model
    tokenizer_config.json, special_tokens_map.json, generation_config.json
                              LlamaTokenizer with <image> as added special token 512 (the layout of the tiny
                              reference LLaVA in ../shared/assets/reference/llava/tiny-llava)
    img/NNNNN.png             IMAGE_SIZE x IMAGE_SIZE RGB PNGs: one shape (circle, square, triangle) in one colour
                              (red, green, blue, yellow) at a random place and size on a plain grey background,
                              with a little pixel noise; the first --train are training images, the rest held out
    train.jsonl               ms-swift rows: {"messages": [{"role": "user", "content": "<image>What colour is the
                              shape?"}, {"role": "assistant", "content": "red"}, {"role": "user", "content":
                              "What shape is it?"}, {"role": "assistant", "content": "circle"}], "images":
                              ["img/00001.png"]}: both questions about each image, in random order
    val.jsonl                 the held-out images, one question each (colour and shape alternating), in the same
                              form (the recipe's validation loss)
    heldout.jsonl             the held-out images for `swiftcpp eval`: both questions per image, with the choices
    eval_task.yaml            the custom multiple-choice eval task over heldout.jsonl (image_field: images)
    eval_generate.yaml        the same questions as a generation task (greedy, exact match on the answer word)
    warmup.jsonl              the GRPO demo's format warm-up (recipes/llava_grpo_demo.yaml): training images asked
                              their colour, each answered once with every colour (shuffled), so a short SFT teaches
                              the answer's form while its content stays at chance, uniform over the four colours
    grpo.jsonl                GRPO prompts: each training image asked its colour, the right colour as "target"
                              (rewarded by recipes/rewards/mentions_target.sh)
    grpo_val.jsonl            the held-out images as GRPO prompts (eval_reward)

Everything is a function of --seed (numpy's default_rng). Files are written under temporary names and renamed.
Only numpy and the standard library are used (PNGs are encoded here with zlib).
"""

import argparse
import json
import os
import shutil
import struct
import sys
import zlib

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORIES = os.path.join(REPO, "models", "stories260K")

IMAGE_TOKEN = 512
VOCAB = 520  # 512 pieces + <image> + 7 unused rows (a multiple of 8)

IMAGE_SIZE = 32
VISION = {
    "model_type": "clip_vision_model",
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": IMAGE_SIZE,
    "patch_size": 8,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "num_channels": 3,
    "projection_dim": 64,
}
INITIALIZER_RANGE = 0.02  # CLIP's and the projector's (text_config.initializer_range)

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

COLOURS = {  # RGB of each named colour, jittered per image
    "red": (215, 40, 40),
    "green": (40, 170, 60),
    "blue": (45, 75, 215),
    "yellow": (230, 205, 40),
}
SHAPES = ["circle", "square", "triangle"]
SIZE_RANGE = (0.55, 0.9)  # a shape's size (side, diameter, triangle base and height) as a share of the image side
BACKGROUND_RANGE = (90, 200)  # grey level of the plain background
NOISE_STD = 4.0  # Gaussian pixel noise
QUESTIONS = {"colour": "What colour is the shape?", "shape": "What shape is it?"}


# ---------------------------------------------------------------------------------------------------------------
# Files


def write_atomic(path, data):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def write_json(path, obj):
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode("utf-8"))


def png_bytes(rgb):
    """An RGB uint8 array [H, W, 3] as a PNG file (8-bit truecolour, no interlace, filter 0 on every row)."""
    h, w, _ = rgb.shape

    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    rows = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + chunk(b"IEND", b""))


def read_safetensors(path):
    """{name: float32 array} of an F32 safetensors file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        data = fh.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit("%s: %s is %s, expected F32" % (path, name, info["dtype"]))
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(info["shape"]).copy()
    return out


def safetensors_bytes(tensors, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, x in tensors:
        raw = np.ascontiguousarray(x, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * ((-len(head)) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


# ---------------------------------------------------------------------------------------------------------------
# The checkpoint


def init_vision(rng, v, text_hidden):
    """The CLIP tower and projector, initialised as transformers' CLIPPreTrainedModel and LlavaPreTrainedModel do
    (factor 1): class_embedding N(0, D^-0.5); patch and position embeddings N(0, 0.02); attention q/k/v
    N(0, D^-0.5 (2L)^-0.5), out_proj N(0, D^-0.5); fc1 N(0, (2D)^-0.5), fc2 N(0, D^-0.5 (2L)^-0.5); LayerNorms
    weight 1, bias 0; linear biases 0; projector weights N(0, 0.02). Drawn in the order listed in the file."""
    D, F, L = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    C, P, S = v["num_channels"], v["patch_size"], v["image_size"]
    positions = (S // P) ** 2 + 1
    normal = lambda shape, std: (rng.standard_normal(shape) * std).astype(np.float32)
    zeros = lambda n: np.zeros((n,), np.float32)
    ones = lambda n: np.ones((n,), np.float32)
    in_std = D ** -0.5 * (2 * L) ** -0.5
    e = "vision_tower.vision_model."
    t = [
        (e + "embeddings.class_embedding", normal((D,), D ** -0.5)),
        (e + "embeddings.patch_embedding.weight", normal((D, C, P, P), INITIALIZER_RANGE)),
        (e + "embeddings.position_embedding.weight", normal((positions, D), INITIALIZER_RANGE)),
        (e + "pre_layrnorm.weight", ones(D)),
        (e + "pre_layrnorm.bias", zeros(D)),
    ]
    for i in range(L):
        p = e + "encoder.layers.%d." % i
        for proj in ("q_proj", "k_proj", "v_proj"):
            t += [(p + "self_attn.%s.weight" % proj, normal((D, D), in_std)), (p + "self_attn.%s.bias" % proj, zeros(D))]
        t += [
            (p + "self_attn.out_proj.weight", normal((D, D), D ** -0.5)),
            (p + "self_attn.out_proj.bias", zeros(D)),
            (p + "layer_norm1.weight", ones(D)),
            (p + "layer_norm1.bias", zeros(D)),
            (p + "mlp.fc1.weight", normal((F, D), (2 * D) ** -0.5)),
            (p + "mlp.fc1.bias", zeros(F)),
            (p + "mlp.fc2.weight", normal((D, F), in_std)),
            (p + "mlp.fc2.bias", zeros(D)),
            (p + "layer_norm2.weight", ones(D)),
            (p + "layer_norm2.bias", zeros(D)),
        ]
    t += [(e + "post_layernorm.weight", ones(D)), (e + "post_layernorm.bias", zeros(D))]
    t += [
        ("multi_modal_projector.linear_1.weight", normal((text_hidden, D), INITIALIZER_RANGE)),
        ("multi_modal_projector.linear_1.bias", zeros(text_hidden)),
        ("multi_modal_projector.linear_2.weight", normal((text_hidden, text_hidden), INITIALIZER_RANGE)),
        ("multi_modal_projector.linear_2.bias", zeros(text_hidden)),
    ]
    return t


def write_checkpoint(out, rng, seed):
    with open(os.path.join(STORIES, "config.json")) as fh:
        text = json.load(fh)
    if text["vocab_size"] != IMAGE_TOKEN:
        raise SystemExit("%s: expected stories260K's vocabulary of 512" % STORIES)
    text_config = {k: v for k, v in text.items() if k not in ("architectures", "torch_dtype")}
    text_config["vocab_size"] = VOCAB
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "ignore_index": -100,
        "image_token_index": IMAGE_TOKEN,
        "pad_token_id": 0,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "tie_word_embeddings": text["tie_word_embeddings"],
        "text_config": text_config,
        "vision_config": VISION,
        "torch_dtype": "float32",
        "transformers_version": "4.40.2",
    }

    lm = read_safetensors(os.path.join(STORIES, "model.safetensors"))
    tensors = []
    for name, x in lm.items():
        if name == "model.embed_tokens.weight":
            # New rows (<image> and the padding rows) start at the mean embedding: as likely as an average piece
            # through the tied output layer, and never read for <image> (its positions take image features).
            mean = x.mean(axis=0, keepdims=True)
            x = np.concatenate([x, np.repeat(mean, VOCAB - x.shape[0], axis=0)], axis=0)
        if name == "lm_head.weight":
            if text["tie_word_embeddings"]:
                continue
            mean = x.mean(axis=0, keepdims=True)
            x = np.concatenate([x, np.repeat(mean, VOCAB - x.shape[0], axis=0)], axis=0)
        tensors.append(("language_model." + name, x))
    tensors += init_vision(rng, VISION, text["hidden_size"])
    metadata = {"format": "pt", "generator": "swiftcpp scripts/make_mm_demo.py", "seed": str(seed)}
    write_atomic(os.path.join(out, "model.safetensors"), safetensors_bytes(tensors, metadata))

    write_json(os.path.join(out, "preprocessor_config.json"), {
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "CLIPImageProcessor",
        "image_std": CLIP_STD,
        "processor_class": "LlavaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": IMAGE_SIZE},
    })
    shutil.copyfile(os.path.join(STORIES, "tokenizer.model"), os.path.join(out, "tokenizer.model"))
    added = lambda content: {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": True}
    write_json(os.path.join(out, "tokenizer_config.json"), {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {"0": added("<unk>"), "1": added("<s>"), "2": added("</s>"),
                                 str(IMAGE_TOKEN): added("<image>")},
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": text["max_position_embeddings"],
        "padding_side": "right",
        "processor_class": "LlavaProcessor",
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer",
    })
    write_json(os.path.join(out, "special_tokens_map.json"), {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
        "additional_special_tokens": ["<image>"],
    })
    write_json(os.path.join(out, "generation_config.json"),
               {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "transformers_version": "4.40.2"})
    # config.json last: a folder with config.json is a finished checkpoint.
    write_json(os.path.join(out, "config.json"), config)
    return sum(x.size for _, x in tensors)


# ---------------------------------------------------------------------------------------------------------------
# The data


def draw(rng, shape, colour):
    """One IMAGE_SIZE x IMAGE_SIZE RGB image: `shape` in `colour` on a plain grey, anti-aliased by 4x4
    supersampling, plus Gaussian pixel noise (std 4)."""
    s = IMAGE_SIZE
    k = 4  # supersampling
    size = rng.uniform(*SIZE_RANGE) * s  # side, diameter or triangle base, in pixels
    cx = rng.uniform(size / 2, s - size / 2)
    cy = rng.uniform(size / 2, s - size / 2)
    coords = (np.arange(s * k) + 0.5) / k
    x, y = np.meshgrid(coords, coords)
    if shape == "circle":
        inside = (x - cx) ** 2 + (y - cy) ** 2 <= (size / 2) ** 2
    elif shape == "square":
        inside = (np.abs(x - cx) <= size / 2) & (np.abs(y - cy) <= size / 2)
    else:  # an upright triangle: apex at the top centre, base at the bottom
        top, bottom = cy - size / 2, cy + size / 2
        half = (y - top) / size * (size / 2)
        inside = (y >= top) & (y <= bottom) & (np.abs(x - cx) <= half)
    cover = inside.reshape(s, k, s, k).mean(axis=(1, 3))[..., None]  # [s, s, 1]
    background = np.full(3, rng.uniform(*BACKGROUND_RANGE))
    fill = np.clip(np.array(COLOURS[colour], dtype=np.float64) + rng.uniform(-20, 20, 3), 0, 255)
    img = background * (1 - cover) + fill * cover + rng.normal(0, NOISE_STD, (s, s, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def write_data(out, rng, n_train, n_heldout):
    os.makedirs(os.path.join(out, "img"), exist_ok=True)
    colours = sorted(COLOURS)
    train, val, heldout = [], [], []
    for i in range(n_train + n_heldout):
        shape = SHAPES[rng.integers(len(SHAPES))]
        colour = colours[rng.integers(len(colours))]
        name = "img/%05d.png" % (i + 1)
        write_atomic(os.path.join(out, name), png_bytes(draw(rng, shape, colour)))
        answers = {"colour": colour, "shape": shape}
        if i < n_train:
            # Both questions about the image, in random order: every image teaches a colour and a shape.
            kinds = ["colour", "shape"] if rng.integers(2) == 0 else ["shape", "colour"]
            train.append(chat_row([(QUESTIONS[k], answers[k]) for k in kinds], name))
            continue
        kind = "colour" if i % 2 == 0 else "shape"
        val.append(chat_row([(QUESTIONS[kind], answers[kind])], name))
        for kind, options in (("colour", colours), ("shape", SHAPES)):
            heldout.append({"question": QUESTIONS[kind], "options": options, "answer": answers[kind],
                            "kind": kind, "images": [name]})
    # The GRPO demo's rows, from a generator of their own so the rows above stay as they were.
    grpo_rng = np.random.default_rng(int(rng.integers(2**31)) + 1)
    warmup, grpo, grpo_val = [], [], []
    for i, row in enumerate(train):
        image = row["images"][0]
        colour = next(m["content"] for m, q in zip(row["messages"][1::2], row["messages"][0::2])
                      if q["content"].endswith(QUESTIONS["colour"]))
        prompt = [{"role": "user", "content": "<image>" + QUESTIONS["colour"]}]
        if i < len(train) // 4:
            warmup.extend({"messages": prompt + [{"role": "assistant", "content": c}], "images": [image]}
                          for c in colours)
        grpo.append({"messages": prompt, "images": [image], "target": colour})
    warmup = [warmup[k] for k in grpo_rng.permutation(len(warmup))]
    for item in heldout:
        if item["kind"] == "colour":
            grpo_val.append({"messages": [{"role": "user", "content": "<image>" + QUESTIONS["colour"]}],
                             "images": item["images"], "target": item["answer"]})
    for file, rows in (("train.jsonl", train), ("val.jsonl", val), ("heldout.jsonl", heldout),
                       ("warmup.jsonl", warmup), ("grpo.jsonl", grpo), ("grpo_val.jsonl", grpo_val)):
        write_atomic(os.path.join(out, file), "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8"))
    write_atomic(os.path.join(out, "eval_task.yaml"), (
        "# Held-out accuracy of the LLaVA demo (scripts/make_mm_demo.py): each held-out image asked both questions,\n"
        "# scored as multiple choice over the colours / shapes. Run with --apply-chat-template (the llava template\n"
        "# the recipe trains with):\n"
        "#   swiftcpp eval --model demo/llava-demo [--adapters CHECKPOINT] --tasks demo/llava-demo/eval_task.yaml \\\n"
        "#       --apply-chat-template\n"
        "name: llava_demo_heldout\n"
        "data: heldout.jsonl\n"
        "prompt: \"<image>{question}\"\n"
        "choices: options\n"
        "answer: answer\n"
        "image_field: images\n").encode("utf-8"))
    write_atomic(os.path.join(out, "eval_generate.yaml"), (
        "# The same held-out questions answered by greedy generation (stopping at </s>), exact match on the word.\n"
        "name: llava_demo_generate\n"
        "type: generation\n"
        "data: heldout.jsonl\n"
        "prompt: \"<image>{question}\"\n"
        "answer: \"{answer}\"\n"
        "max_new_tokens: 8\n"
        "answer_regex: \"([a-z]+)\"\n"
        "image_field: images\n").encode("utf-8"))
    return len(train), len(val), len(heldout)


def chat_row(turns, image):
    """An ms-swift row: the image placeholder opens the first user turn; `turns` are (question, answer) pairs."""
    messages = []
    for j, (question, answer) in enumerate(turns):
        messages.append({"role": "user", "content": ("<image>" if j == 0 else "") + question})
        messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, "images": [image]}


def main(argv=None):
    global IMAGE_SIZE
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", default=os.path.join("demo", "llava-demo"), help="output folder (default demo/llava-demo)")
    ap.add_argument("--train", type=int, default=8000, help="training images (both questions each)")
    ap.add_argument("--heldout", type=int, default=200, help="held-out images (two eval questions each)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tower, the projector and the data (default 0)")
    ap.add_argument("--image-size", type=int, default=IMAGE_SIZE, help="image side in pixels (default %(default)s)")
    ap.add_argument("--patch-size", type=int, default=VISION["patch_size"], help="CLIP patch side (default %(default)s)")
    ap.add_argument("--vision-hidden", type=int, default=VISION["hidden_size"], help="CLIP width (default %(default)s)")
    ap.add_argument("--vision-layers", type=int, default=VISION["num_hidden_layers"],
                    help="CLIP layers (default %(default)s)")
    args = ap.parse_args(argv)
    if args.image_size % args.patch_size != 0 or args.vision_hidden % VISION["num_attention_heads"] != 0:
        ap.error("--image-size must be a multiple of --patch-size, --vision-hidden of %d" % VISION["num_attention_heads"])
    IMAGE_SIZE = args.image_size
    VISION.update({"image_size": args.image_size, "patch_size": args.patch_size, "hidden_size": args.vision_hidden,
                   "intermediate_size": 4 * args.vision_hidden, "projection_dim": args.vision_hidden,
                   "num_hidden_layers": args.vision_layers})
    if args.train < 1 or args.heldout < 1:
        ap.error("--train and --heldout must be positive")
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    params = write_checkpoint(args.out, rng, args.seed)
    n_train, n_val, n_eval = write_data(args.out, rng, args.train, args.heldout)
    print("%s: LLaVA checkpoint (%d parameters, %dx%d images, %d image tokens each), %d training rows, %d validation "
          "rows, %d held-out eval items" % (args.out, params, IMAGE_SIZE, IMAGE_SIZE,
                                             (IMAGE_SIZE // VISION["patch_size"]) ** 2, n_train, n_val, n_eval))
    return 0


if __name__ == "__main__":
    sys.exit(main())
