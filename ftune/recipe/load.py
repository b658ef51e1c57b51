"""Load a recipe: YAML → extends → overrides → typed, validated Recipe (minimal first version)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from ftune.errors import Location, Problem, RecipeError, UsageError
from ftune.recipe.schema import Recipe

MASK = "***"


@dataclass(frozen=True)
class LoadedRecipe:
    recipe: Recipe
    file: str
    files: list[str] = field(default_factory=list)
    origins: dict[str, Location] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)

    def resolved_yaml(self) -> str:
        return yaml.safe_dump(self.recipe.model_dump(mode="json"), sort_keys=False)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read(path: Path, seen: tuple[Path, ...]) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    bases = data.get("extends") or []
    merged: dict = {}
    for b in [bases] if isinstance(bases, str) else bases:
        merged = _merge(merged, _read((path.parent / b).resolve(), (*seen, path)))
    return _merge(merged, data)


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> LoadedRecipe:
    p = Path(path).resolve()
    if not p.is_file():
        raise UsageError(f"recipe file not found: {path}")
    data = _read(p, ())
    for ov in overrides:
        key, _, value = ov.partition("=")
        node = data
        *parents, last = key.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[last] = yaml.safe_load(value)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        problems = [
            Problem(err["msg"], ".".join(map(str, err["loc"])), location=Location(str(p)))
            for err in e.errors()
        ]
        raise RecipeError(problems, str(p)) from None
    return LoadedRecipe(recipe, str(p), [str(p)])
