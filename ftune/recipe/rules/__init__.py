"""Cross-field rules: checks the schema alone can't express, run after the Recipe validates.

Each module (`core`, `quantization`, `distributed`) exposes `RULES`, a list of functions
`rule(recipe) -> Iterable[Violation]`. A violation names the dotted key path as the user wrote it
(`peft.r`, not pydantic's `peft.lora.r`); the loader turns it into a located `Problem`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe


@dataclass(frozen=True)
class Violation:
    """One broken rule: where (dotted path as written), what, and how to fix it."""

    path: str
    message: str
    hint: str | None = None


Rule = Callable[["Recipe"], Iterable[Violation]]

# Rule modules, in the order their violations are reported.
MODULES: tuple[str, ...] = (
    "ftune.recipe.rules.core",
    "ftune.recipe.rules.quantization",
    "ftune.recipe.rules.distributed",
)


def all_rules() -> list[Rule]:
    """Every registered rule, module by module."""
    rules: list[Rule] = []
    for name in MODULES:
        rules.extend(importlib.import_module(name).RULES)
    return rules


def check(recipe: Recipe) -> list[Violation]:
    """Run every rule on a validated recipe; all violations, in rule order."""
    return [v for rule in all_rules() for v in rule(recipe)]
