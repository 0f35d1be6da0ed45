#!/usr/bin/python3
"""Render swiftcpp's chat-template fixtures with Python's jinja2, the engine Hugging Face transformers uses.

Usage:
    /usr/bin/python3 scripts/make_template_fixtures.py [--shared ../shared] [--out tests/data/chat_templates/fixtures.json]

Needs Debian's python3-jinja2 (scripts/setup.sh installs it). For each template family below, every conversation
in CONVERSATIONS is rendered with and without add_generation_prompt, and the result is written as

    {family: [{"name", "messages", "add_generation_prompt", "expected" | "error"}]}

"expected" is the rendered text; "error" is the message of the exception the template raised through
raise_exception(). tests/unit/test_template.cpp renders every case with swiftcpp's C++ templates and compares
byte for byte (or expects a ConfigError containing the message).

Template sources:
    qwen2_5, llama3, gemma, phi3: the real chat templates under <shared>/assets/chat_templates/.
    chatml, qwen2, llama2, mistral, llava: tests/data/chat_templates/<family>.jinja, written from the public format
        descriptions (each file says where its format comes from).
    default, raw: tests/data/chat_templates/<family>.jinja, swiftcpp's own definitions.

The environment copies what transformers sets up for chat templates: an ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, a raise_exception() global, and render variables
messages, tools=None, documents=None, add_generation_prompt, bos_token, eos_token (the family's own values).
strftime_now is deliberately NOT defined: recent transformers define it, and Llama 3.2's template then writes
today's date into the system header; without it the template falls back to its fixed date "26 Jul 2024", which is
what swiftcpp renders (a training set must not change with the day it is rendered). The output is deterministic:
the same inputs always give the same bytes.
"""

import argparse
import json
import os
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL = os.path.join(ROOT, "tests", "data", "chat_templates")

# family -> (template file, bos_token, eos_token); "{shared}" is the shared assets folder.
FAMILIES = {
    "chatml": (os.path.join(LOCAL, "chatml.jinja"), "", "<|im_end|>"),
    "qwen2": (os.path.join(LOCAL, "qwen2.jinja"), "", "<|im_end|>"),
    "qwen2_5": ("{shared}/Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>"),
    "llama3": ("{shared}/meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "llama2": (os.path.join(LOCAL, "llama2.jinja"), "<s>", "</s>"),
    "mistral": (os.path.join(LOCAL, "mistral.jinja"), "<s>", "</s>"),
    "gemma": ("{shared}/google-gemma-2-2b-it.jinja", "<bos>", "<eos>"),
    "phi3": ("{shared}/microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
    "llava": (os.path.join(LOCAL, "llava.jinja"), "<s>", "</s>"),
    "default": (os.path.join(LOCAL, "default.jinja"), "", ""),
    "raw": (os.path.join(LOCAL, "raw.jinja"), "", ""),
}


def msg(role, content):
    return {"role": role, "content": content}


SYSTEM = "You are a careful assistant."
# Leading/trailing spaces and newlines, tabs, unicode (including U+3000 and U+00A0, which Python's str.strip() and
# Jinja's trim treat as whitespace), emoji and inner newlines.
TRICKY_USER = "  Line one\nLine two\t \n"
TRICKY_ASSISTANT = "\n Grüße, 世界! 🙂\nSecond line.  \n\n"
TRICKY_SYSTEM = "\u3000 Be terse.\u00a0\n"

CONVERSATIONS = [
    ("single_user", [msg("user", "Hello!")]),
    ("single_round", [msg("user", "Hello!"), msg("assistant", "Hi there.")]),
    ("system_user", [msg("system", SYSTEM), msg("user", "What is 2+2?")]),
    ("system_round", [msg("system", SYSTEM), msg("user", "What is 2+2?"), msg("assistant", "4")]),
    ("three_rounds_system", [
        msg("system", SYSTEM),
        msg("user", "Name a colour."), msg("assistant", "Blue."),
        msg("user", "Another one."), msg("assistant", "Green."),
        msg("user", "And a third?"), msg("assistant", "Red."),
    ]),
    ("three_rounds", [
        msg("user", "Count to one."), msg("assistant", "1"),
        msg("user", "Now to two."), msg("assistant", "1 2"),
        msg("user", "Three?"), msg("assistant", "1 2 3"),
    ]),
    ("ends_with_user", [
        msg("system", SYSTEM),
        msg("user", "First question"), msg("assistant", "First answer"),
        msg("user", "Second question"),
    ]),
    ("whitespace_unicode", [
        msg("system", TRICKY_SYSTEM),
        msg("user", TRICKY_USER), msg("assistant", TRICKY_ASSISTANT),
        msg("user", " café ☕ "),
    ]),
    ("whitespace_unicode_no_system", [
        msg("user", TRICKY_USER), msg("assistant", TRICKY_ASSISTANT), msg("user", " café ☕ "),
    ]),
    ("empty_contents", [msg("system", ""), msg("user", ""), msg("assistant", "")]),
    ("empty_contents_no_system", [msg("user", ""), msg("assistant", "")]),
    ("system_only", [msg("system", SYSTEM)]),
    ("system_in_middle", [
        msg("user", "Hi"), msg("assistant", "Hello"),
        msg("system", "Switch to French."), msg("user", "Thanks"),
    ]),
    ("system_after_user", [msg("user", "Hi"), msg("system", "Be brief."), msg("user", "Again")]),
    ("two_users", [msg("user", "One"), msg("user", "Two")]),
    ("assistant_first", [msg("assistant", "I speak first."), msg("user", "OK")]),
]


class TemplateRaised(Exception):
    """What raise_exception() throws; any other exception is a bug in this script or a template and aborts."""


def raise_exception(message):
    raise TemplateRaised(message)


def make_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env


def render_family(env, path, bos, eos):
    with open(path, encoding="utf-8") as f:
        template = env.from_string(f.read())
    cases = []
    for name, messages in CONVERSATIONS:
        for add_generation_prompt in (False, True):
            case = {"name": name, "messages": messages, "add_generation_prompt": add_generation_prompt}
            try:
                case["expected"] = template.render(messages=messages, tools=None, documents=None,
                                                   add_generation_prompt=add_generation_prompt,
                                                   bos_token=bos, eos_token=eos)
            except TemplateRaised as e:
                case["error"] = str(e)
            cases.append(case)
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=os.path.join(os.path.dirname(ROOT), "shared"),
                        help="the shared folder holding assets/chat_templates (default: ../shared)")
    parser.add_argument("--out", default=os.path.join(LOCAL, "fixtures.json"))
    args = parser.parse_args()

    shared_templates = os.path.join(args.shared, "assets", "chat_templates")
    env = make_environment()
    fixtures = {}
    for family, (path, bos, eos) in FAMILIES.items():
        path = path.format(shared=shared_templates)
        if not os.path.exists(path):
            sys.exit(f"error: template file {path} is missing (pass --shared)")
        fixtures[family] = render_family(env, path, bos, eos)

    # One case per line: compact, and a changed rendering shows up as a one-line diff.
    families = []
    for family, cases in fixtures.items():
        lines = ",\n".join("  " + json.dumps(case, ensure_ascii=False) for case in cases)
        families.append(f" {json.dumps(family)}: [\n{lines}\n ]")
    text = "{\n" + ",\n".join(families) + "\n}\n"
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {len(v)}" for k, v in fixtures.items()))


if __name__ == "__main__":
    main()
