"""Distributed rules (strategy vs. processes, machines, FSDP/DeepSpeed options).

Owned by the distributed engineer: add `rule(recipe) -> Iterable[Violation]` functions to RULES.
"""

from __future__ import annotations

from ftune.recipe.rules import Rule

RULES: list[Rule] = []
