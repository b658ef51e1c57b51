"""An importer's "not imported" reasons are checked against the recipe language as it is now: a reason may not
say ftune lacks something the schema has (`(no streaming)` while `data.streaming` exists), and every ftune key a
reason or a mapping row names must exist. A feature added to the schema fails here until the importers use it."""

from __future__ import annotations

import re
import typing

import pytest
from pydantic import BaseModel

from ftune.importers import axolotl, llama_factory, torchtune
from ftune.importers._core import Skip
from ftune.methods import config_classes
from ftune.recipe.schema import Recipe

SECTIONS = "model|data|peft|quantization|distributed|train|eval|checkpoint|output"
DOTTED = re.compile(rf"\b(?:{SECTIONS})\.[a-z_]+(?:\.[a-z_]+)*")
LACKS = re.compile(r"\b(?:has no|have no|no|without) ([A-Za-z][\w-]*)")


def _fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(f"{prefix}{name}")
        for arg in [field.annotation, *typing.get_args(field.annotation)]:
            for inner in [arg, *typing.get_args(arg)]:
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    out |= _fields(inner, f"{prefix}{name}.")
    return out


KEYS = _fields(Recipe) | {f"peft.{k}" for config in config_classes() for k in _fields(config)}
NAMES = {k.rsplit(".", 1)[-1] for k in KEYS}


def _skips():
    for module in (axolotl, llama_factory, torchtune):
        for key, entry in module.TABLE.items():
            if isinstance(entry, Skip):
                yield pytest.param(entry.reason, id=f"{module.PEER}:{key}")


@pytest.mark.parametrize("reason", list(_skips()))
def test_a_reason_names_only_keys_that_exist(reason):
    missing = [k for k in DOTTED.findall(reason) if re.sub(r"\.(\d+|N)\b", "", k) not in KEYS]
    assert not missing, f"{reason!r} names keys the schema doesn't have: {missing}"


@pytest.mark.parametrize("reason", list(_skips()))
def test_a_reason_never_says_ftune_lacks_a_key_it_has(reason):
    claimed = [w for w in LACKS.findall(reason) if w.lower().replace("-", "_") in NAMES]
    assert not claimed, f"{reason!r} says ftune has no {claimed}, but the schema has them: import them"
