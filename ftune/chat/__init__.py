"""Chat templates: the built-in ones by name (Jinja files shipped in ftune/chat/templates/), and how
`data.chat_template` is read (a built-in name, a Jinja string, or nothing: the tokenizer's own).

Light: plain files and strings, no jinja2 or transformers at import. Both sides use it: the recipe rules
check the value, the worker's data stage renders with it.
"""

from __future__ import annotations

import re
from importlib import resources

BUILTIN: tuple[str, ...] = ("llama3", "chatml", "mistral", "gemma", "phi3", "qwen", "qwen3", "alpaca", "hermes")

# The token that ends an assistant turn in each built-in template (eos_token where the template writes it),
# i.e. the token generation must learn to emit so that it stops.
END_OF_TURN: dict[str, str] = {
    "llama3": "<|eot_id|>",
    "chatml": "<|im_end|>",
    "qwen": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "mistral": "eos_token",
    "gemma": "<end_of_turn>",
    "phi3": "<|end|>",
    "alpaca": "eos_token",
    "hermes": "<|im_end|>",
}
# End-of-turn markers of common templates, counted as stops when they are one token of the tokenizer.
KNOWN_STOPS: tuple[str, ...] = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|eom_id|>",
                                "<|endoftext|>", "</s>", "<eos>")


def is_jinja(value: str) -> bool:
    """A Jinja template (as opposed to a built-in's name) holds an expression or a statement."""
    return "{{" in value or "{%" in value


def builtin(name: str) -> str:
    """The text of the built-in template `name` (one of BUILTIN)."""
    if name not in BUILTIN:
        raise KeyError(name)
    text = resources.files(__package__).joinpath("templates", f"{name}.jinja").read_text(encoding="utf-8")
    return text.rstrip("\n")


# `{% generation %}...{% endgeneration %}`: transformers' marks of the text an assistant turn trains on
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_ANY_GENERATION_TAG = re.compile(r"\{%-?\s*(?:end)?generation\s*-?%\}")


def spans_sibling(name: str) -> str:
    """The built-in template `name` with each turn's output wrapped in `{%- generation -%}` tags
    (templates/NAME.spans.jinja): rendered only to find the answer spans in one render
    (ftune.datafiles.spans). The shipped text stays tag-free, since it travels into final/, merged folders and GGUF
    exports, whose Jinja may not know the tag; `strip_generation_tags` of the sibling is the shipped text (tested)."""
    if name not in BUILTIN:
        raise KeyError(name)
    text = resources.files(__package__).joinpath("templates", f"{name}.spans.jinja").read_text(encoding="utf-8")
    return text.rstrip("\n")


def strip_generation_tags(text: str) -> str:
    return _ANY_GENERATION_TAG.sub("", text)


def resolve(value: str | None) -> str | None:
    """`data.chat_template` as Jinja text: a built-in's file, the string itself, or None (the tokenizer's own)."""
    if not value:
        return None
    return builtin(value) if value in BUILTIN else value
