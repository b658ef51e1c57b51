"""The one walk over a recipe's data sources, keyed as the recipe writes them (`data.train[0]`)."""

from __future__ import annotations

from collections.abc import Iterator

from ftune.recipe.schema import DataSource, Recipe


def sources(recipe: Recipe, *, splits: tuple[str, ...] = ("train", "eval")) -> Iterator[tuple[str, DataSource]]:
    """(key, source) for every `data.train` entry, then every `data.eval` entry (when eval is a list of
    sources, not a split of train): key `data.train[0]`, `data.eval[1]`, ..."""
    for split in splits:
        items = getattr(recipe.data, split)
        if isinstance(items, list):
            for i, spec in enumerate(items):
                yield f"data.{split}[{i}]", spec
