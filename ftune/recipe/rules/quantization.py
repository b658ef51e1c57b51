"""Quantization rules (bitsandbytes 4/8-bit loading vs. method, dtypes, strategy).

Owned by the quantization engineer: add `rule(recipe) -> Iterable[Violation]` functions to RULES.
"""

from __future__ import annotations

from ftune.recipe.rules import Rule

RULES: list[Rule] = []
