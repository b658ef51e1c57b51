"""The bundled catalog of base-model configs, so that `ftune plan` works offline for known models.

`ftune/catalog/<org>--<name>.json` holds the structural facts of one base model's config.json. A hub
id finds its entry by exact id, or by name when its org is the original's or a known mirror's: the
name is compared case-insensitively, without a `Meta-` prefix and without suffixes that mark a
variant of the same architecture (`-Instruct`, `-it`, `-chat`, `-Base`, unsloth's `-bnb-4bit`, ...).
Suffixes that change the model (`-128k`, `-1M`, `-GPTQ`, `-AWQ`, ...) are never stripped.

Vision-language models live apart, in `ftune/catalog/vision/`, and are looked up for `model.task:
image-text-to-text` only: `google/gemma-3-4b-it` is the whole vision-language model there and its text decoder
in the text catalog, so each task plans what it loads.
"""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path

CATALOG = Path(__file__).resolve().parent.parent / "catalog"
VISION_CATALOG = CATALOG / "vision"
VISION_TASK = "image-text-to-text"

MIRROR_ORGS = ("NousResearch", "unsloth", "mistral-community")
"""Orgs that re-upload base models under the original name (unsloth also adds the suffixes below)."""

VARIANT_SUFFIXES = ("-unsloth-bnb-4bit", "-bnb-4bit", "-unsloth", "-instruct", "-chat", "-hf", "-base", "-it", "-pt")
"""Name suffixes of variants with the base's architecture: instruction/chat tuning, base and pretrained
tags, unsloth's bitsandbytes uploads (the recipe's `quantization` decides the planned layout)."""

NAME_ALIASES = {
    "mistral-7b-instruct-v0.1": "mistral-7b-v0.1",
    "mistral-7b-instruct-v0.3": "mistral-7b-v0.3",
    "mixtral-8x7b-instruct-v0.1": "mixtral-8x7b-v0.1",
}
"""Variants whose name puts the tag mid-name (Mistral's `-Instruct-v0.3`), as name keys."""


def name_key(name: str) -> str:
    """`Meta-Llama-3.1-8B-Instruct-bnb-4bit` -> `llama-3.1-8b`: the name as the catalog compares it."""
    key = name.lower().removeprefix("meta-")
    stripped = True
    while stripped:
        stripped = False
        for suffix in VARIANT_SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key, stripped = key[: -len(suffix)], True
    return NAME_ALIASES.get(key, key)


@cache
def entries(vision: bool = False) -> dict[str, Path]:
    """Catalog ids (`org/name`, as the hub spells them) -> their config files; `vision`: the vision-language
    catalog (for `model.task: image-text-to-text`)."""
    folder = VISION_CATALOG if vision else CATALOG
    return {f.stem.replace("--", "/", 1): f for f in sorted(folder.glob("*.json"))}


@cache
def by_name(vision: bool = False) -> dict[str, str]:
    """Name keys -> catalog ids. Each key names one entry (a test checks it)."""
    return {name_key(i.split("/", 1)[1]): i for i in entries(vision)}


def lookup(model_id: str, vision: bool = False) -> tuple[str, Path] | None:
    """The catalog entry (id, config file) for a hub id, or None; `vision`: in the vision-language catalog."""
    ids = {i.lower(): i for i in entries(vision)}
    if model_id.lower() in ids:
        found = ids[model_id.lower()]
        return found, entries(vision)[found]
    org, sep, name = model_id.partition("/")
    if not sep or "/" in name:
        return None
    found = by_name(vision).get(name_key(name))
    if found is None:
        return None
    orgs = {found.split("/", 1)[0].lower(), *(m.lower() for m in MIRROR_ORGS)}
    return (found, entries(vision)[found]) if org.lower() in orgs else None


def near(model_id: str, n: int = 3, vision: bool = False) -> list[str]:
    """Catalog ids closest to `model_id` by name, best first; never empty (the closest ones, however far)."""
    org, _, rest = model_id.rpartition("/")
    name = name_key(rest)
    names = by_name(vision)
    close = [names[k] for k in difflib.get_close_matches(name, list(names), n=n, cutoff=0.6)]
    same_org = [i for i in entries(vision) if org and i.split("/", 1)[0].lower() == org.lower()]
    same_org.sort(key=lambda i: -difflib.SequenceMatcher(None, name, name_key(i.split("/", 1)[1])).ratio())
    anything = [names[k] for k in difflib.get_close_matches(name, list(names), n=n, cutoff=0.0)]
    return list(dict.fromkeys(same_org + close + anything))[:n]  # same_org is sorted by the same likeness
