"""Load a recipe: YAML with positions → extends → overrides → `${}` → typed Recipe → rules.

Every problem is collected and raised at once as `RecipeError`, each located at the key as the
user wrote it (in a base file when the key came from one, or the override that set it).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ftune.errors import Location, Problem, RecipeError, UsageError, key, key_path
from ftune.methods import DEFAULT as DEFAULT_METHOD
from ftune.recipe._extends import (
    MAX_EXTENDS_DEPTH,
    KeyPath,
    LoadContext,
    compose,
    display,
    dotted,
    named_config_files,
    recipe_bases,
)
from ftune.recipe._interp import MASK, interpolate
from ftune.recipe._secrets import Masked, mask_secrets, override_secrets, shown_override
from ftune.recipe._overrides import apply_overrides, parse_overrides
from ftune.recipe._schema import translate
from ftune.recipe._yaml import Marks
from ftune.recipe.schema import Recipe

__all__ = ["MASK", "MAX_EXTENDS_DEPTH", "LoadedRecipe", "display", "load_recipe", "named_config_files",
           "recipe_bases"]

DEFAULT = Location(origin="default")


@dataclass(frozen=True)
class Positions:
    """Where each key of a recipe is written (the YAML marks after `extends` and overrides) and which override set
    it: the one way from a key (`data.train[0].path`, or the dotted `data.train.0.path`) to file:line:column. The
    loader locates its own problems with it, and `LoadedRecipe` every later check's (validate, plan, run)."""

    file: str
    """The recipe, absolute: where a problem points when no enclosing key is written."""
    marks: Mapping[KeyPath, Marks] = field(default_factory=dict)
    overrides: Mapping[KeyPath, str] = field(default_factory=dict)
    """Key path → the override (`train.seed=3`) that set it."""

    def _find(self, path: str | KeyPath, anchor: str) -> tuple[Location, KeyPath]:
        p = key_path(path) if isinstance(path, str) else path
        p = p[:-1] if anchor == "parent" else p
        exact = p in self.marks
        while p and p not in self.marks:
            p = p[:-1]  # a default or a missing key: the nearest enclosing key written
        if not p:
            return Location(self.file, 1, 1), p
        return (self.marks[p].value if exact and anchor == "value" else self.marks[p].key), p

    def locate(self, path: str | KeyPath, anchor: str = "key") -> Location:
        """Where a problem at `path` points: the key (anchor `key`), its value (`value`, when written) or the mapping
        holding it (`parent`); for a key not written, the nearest enclosing key written; else the recipe file at
        1:1; an override's Location(origin="override"). Files are absolute (`shown` makes them relative)."""
        return self._find(path, anchor)[0]

    def located(self, problem: Problem) -> Problem:
        """`problem` located, its message quoting the override that set the key (`(override 'train.seed=3')`)."""
        where, p = self._find(problem.path, problem.anchor)
        suffix = ""
        if where.origin == "override":
            arg = self.overrides.get(p) or next((a for q, a in self.overrides.items() if q == p[: len(q)]), "")
            suffix = f" (override '{shown_override(arg)}')" if arg else ""
        return replace(problem, message=problem.message + suffix, location=where)


def shown(problem: Problem) -> Problem:
    """`problem` with its file as the loader's errors and `validate` name it: relative to the working directory when
    below it."""
    loc = problem.location
    if not (loc.file and os.path.isabs(loc.file)):
        return problem
    return replace(problem, location=Location(display(loc.file), loc.line, loc.column, loc.origin))


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe and where each of its values came from."""

    recipe: Recipe
    file: str
    """The recipe file, absolute."""
    files: list[str] = field(default_factory=list)
    """The recipe and every base it extends (absolute)."""
    origins: dict[str, Location] = field(default_factory=dict)
    """Dotted path → file:line:col, Location(origin="override") or Location(origin="default")."""
    secrets: dict[str, str] = field(default_factory=dict)
    """Dotted path → environment variable whose (masked) value belongs there."""
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    """Variables ftune generated for secrets that came without one (an override `model.hub_token=hf_...`,
    a literal): name → real value. `ftune run` sets them in the workers' environment, never on disk."""
    positions: Positions | None = field(default=None, repr=False)
    """Where each key is written: `locate` and `error` go through it, as the loader's own problems did."""

    def __post_init__(self) -> None:
        if self.positions is None:  # built without marks: every key points at the recipe file
            object.__setattr__(self, "positions", Positions(self.file))

    def secret(self, path: str) -> str | None:
        """The real value of the masked field at `path` (in this process: the generated variables too)."""
        env = self.secrets.get(path)
        return (self.secret_env.get(env) or os.environ.get(env)) if env else None

    def locate(self, path: str) -> Location:
        """Where the user set `path` (file position or override); for a default, the nearest enclosing key they
        wrote; else the recipe file (`Positions.locate`). A list index may be written either way: `data.train[0]`
        or `data.train.0`."""
        return self.positions.locate(path)

    def located(self, problem: Problem) -> Problem:
        """A problem found by any check, located at the key the user wrote (`Positions.located`)."""
        return self.positions.located(problem)

    def error(self, problems: list[Problem]) -> RecipeError:
        """Problems found by any check, each located at the key the user wrote, as one error."""
        return RecipeError([self.located(p) for p in problems], file=self.file)

    def resolved_yaml(self) -> str:
        """The full resolved recipe as YAML, keys in schema order, secrets masked."""
        import yaml

        data = self.recipe.model_dump(mode="json", exclude={"extends"})
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def _related(a: KeyPath, b: KeyPath) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _validate(data: dict) -> tuple[Recipe | None, list[Problem]]:
    from pydantic import ValidationError

    try:
        return Recipe.model_validate(data), []
    except ValidationError as err:
        return None, translate(err.errors(include_url=False))


def _without(data: dict, paths: list[KeyPath]) -> dict:
    """A copy of data with the keys at `paths` removed (the bad values), so the rest can be checked. A key inside a
    list item (`data.train[1].format`) is removed from that item."""
    out = copy.deepcopy(data)
    for path in paths:
        if not path:  # a problem at the root (an empty key): nothing under it to remove
            continue
        node = out
        for part in path[:-1]:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                node = None
            if node is None:
                break
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def _rule_problems(data: dict, known: list[Problem], first: tuple[Recipe | None, list[Problem]]) -> list[Problem]:
    """Cross-field rules, also when some keys are invalid: checked on the recipe without them.

    A violation is dropped when it concerns a bad value (its path and the value's are related): it
    may only be a consequence of the value's removal. Unknown keys change nothing, so they hide only
    what is below them.
    """
    from ftune.recipe import rules

    values = [key_path(p.path) for p in known if p.anchor != "key"]
    keys = [key_path(p.path) for p in known if p.anchor == "key"]
    recipe, problems = first
    for _ in range(3):
        if recipe is not None:
            break
        values += [key_path(p.path) for p in problems if p.anchor != "key"]
        keys += [key_path(p.path) for p in problems if p.anchor == "key"]
        recipe, problems = _validate(_without(data, values + keys))
    if recipe is None:
        return []
    found = []
    for v in rules.check(recipe):
        path = key_path(v.path)
        if any(_related(path, b) for b in values) or any(path[: len(k)] == k for k in keys):
            continue
        found.append(v)  # a rule's Problem as it is: anchored at the key
    return found


def _origins(recipe: Recipe, marks: dict[KeyPath, Marks]) -> dict[str, Location]:
    dump = recipe.model_dump(mode="python")
    paths: list[KeyPath] = []

    def walk(value: object, path: KeyPath) -> None:
        if path:
            paths.append(path)
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, (*path, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, (*path, i))

    walk(dump, ())
    return {dotted(p): marks[p].key if p in marks else DEFAULT for p in paths}


# ------------------------------------------------------------------------------------------ load
def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> LoadedRecipe:
    """Load, compose and validate a recipe; raises RecipeError listing every problem at once.

    Raises UsageError when `path` isn't a readable file or an override is malformed.
    """
    file = Path(path).resolve()
    if file.is_dir():
        raise UsageError(f"{path} is a directory", hint="give a recipe file (ftune validate takes directories)")
    if not file.is_file():
        raise UsageError(f"recipe file not found: {path}", hint="check the path (it is relative to the working directory)")
    if not os.access(file, os.R_OK):
        raise UsageError(f"can't read recipe file {path}: permission denied", hint="check the file's permissions")
    parsed = parse_overrides(overrides)
    ctx = LoadContext(root=file)
    composed = compose(file, (), ctx)
    if composed is None or ctx.incomplete:
        raise RecipeError(_sorted(ctx), display(file))
    data, marks = copy.deepcopy(composed[0]), dict(composed[1])
    apply_overrides(data, marks, parsed, ctx)
    if isinstance(data.get("peft"), dict) and "method" not in data["peft"]:
        data["peft"] = {"method": DEFAULT_METHOD, **data["peft"]}  # a peft section without a method
    raw = data
    data, issues = interpolate(data)
    masked = mask_secrets(raw, data)
    masked.values |= override_secrets(overrides)
    issues += masked.issues
    bad = {p.path for p in issues}
    recipe, schema_issues = _validate(data)
    reported = {p.path for p in ctx.problems}  # e.g. a bad `extends` value, already reported while composing
    issues += [p for p in schema_issues if p.path not in bad and p.path not in reported
               and not (ctx.lost_base and p.anchor == "parent")]  # "missing": the lost base may set it
    issues += _rule_problems(data, issues, (recipe, schema_issues))
    positions = Positions(str(file), marks, dict(ctx.override_args))
    ctx.problems.extend(positions.located(p) for p in issues)
    if ctx.problems or recipe is None:
        ctx.problems = [_scrubbed(p, masked) for p in ctx.problems]
        raise RecipeError(_sorted(ctx), display(file))
    return LoadedRecipe(recipe, str(file), list(ctx.files), _origins(recipe, marks), masked.secrets, masked.env,
                        positions)


def _scrubbed(p: Problem, masked: Masked) -> Problem:
    """The problem with any secret value in its text masked (a message may quote a value or an override)."""
    if not masked.values:
        return p
    return Problem(masked.scrub(p.message) or "", p.path, masked.scrub(p.hint), p.location, p.severity)


def _sorted(ctx: LoadContext) -> list[Problem]:
    order = {display(f): i for i, f in enumerate(ctx.files)}

    def key(p: Problem) -> tuple:
        loc = p.location
        return (loc.file is None, order.get(loc.file or "", len(order)), loc.line or 0, loc.column or 0)

    return sorted(dict.fromkeys(shown(p) for p in ctx.problems), key=key)
