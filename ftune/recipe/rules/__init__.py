"""Cross-field rules: checks the schema alone can't express, run after the Recipe validates.

Each module (`core`, `train`, `data`, `quantization`, `distributed`, `preference`, `plugins`, `rl`, `tools`,
`distill`, `vision_combinations`) exposes `RULES`, a list of functions
`rule(recipe) -> Iterable[Problem]` (`Problem.at(path, message, hint)`, the one problem type of every check).
The path is the dotted key as the user wrote it (`peft.r`, not pydantic's `peft.lora.r`); the loader locates it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ftune.errors import Problem

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe


Rule = Callable[["Recipe"], Iterable[Problem]]

# Rule modules, in the order their violations are reported.
MODULES: tuple[str, ...] = (
    "ftune.recipe.rules.core",
    "ftune.recipe.rules.train",
    "ftune.recipe.rules.data",
    "ftune.recipe.rules.quantization",
    "ftune.recipe.rules.distributed",
    "ftune.recipe.rules.plugins",
    "ftune.recipe.rules.preference",
    "ftune.recipe.rules.rl",
    "ftune.recipe.rules.distill",
    "ftune.recipe.rules.tools",
    "ftune.recipe.rules.vision_combinations",
)


def all_rules() -> list[Rule]:
    """Every registered rule, module by module."""
    rules: list[Rule] = []
    for name in MODULES:
        rules.extend(importlib.import_module(name).RULES)
    return rules


def check(recipe: Recipe) -> list[Problem]:
    """Run every rule on a validated recipe; all problems, in rule order."""
    return [v for rule in all_rules() for v in rule(recipe)]
