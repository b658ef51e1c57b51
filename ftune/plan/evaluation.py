"""Which generation metrics score a run's greedy answers (eval.generate), decided before launch.

Exact match fits short, closed answers (a label, a number, an extraction); free-form chat answers almost never
match a reference to the character, so exact match would report 0 for a model that learned its task. Unless the
recipe names `eval.generate.metrics`: exact match and F1 for instruction data, F1 (word overlap) alone for chat.
"""

from __future__ import annotations

from ftune.recipe.schema import Recipe


def generation_metrics(recipe: Recipe) -> list[str]:
    section = recipe.eval.generate
    if section is not None and section.metrics is not None:
        return list(section.metrics)
    chat = any(s.format == "chat" or s.as_chat for s in recipe.data.train)
    return ["f1"] if chat else ["exact_match", "f1"]
