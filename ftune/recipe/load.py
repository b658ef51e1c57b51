"""Load a recipe: YAML with positions → extends → overrides → `${}` → typed Recipe → rules.

Every problem is collected and raised at once as `RecipeError`, each located at the key as the
user wrote it (in a base file when the key came from one, or the override that set it).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ftune.errors import Location, Problem, RecipeError, UsageError
from ftune.recipe import _yaml
from ftune.recipe._interp import MASK, interpolate
from ftune.recipe._secrets import Masked, mask_secrets, override_secrets, shown_override
from ftune.recipe._overrides import apply_overrides, parse_overrides
from ftune.recipe._schema import Issue, did_you_mean, translate
from ftune.recipe._yaml import Marks
from ftune.recipe.schema import Recipe

__all__ = ["MASK", "LoadedRecipe", "load_recipe", "recipe_bases"]

KeyPath = tuple[str | int, ...]
DEFAULT = Location(origin="default")


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

    def secret(self, path: str) -> str | None:
        """The real value of the masked field at `path` (in this process: the generated variables too)."""
        env = self.secrets.get(path)
        return (self.secret_env.get(env) or os.environ.get(env)) if env else None

    def locate(self, path: str) -> Location:
        """Where the user set `path` (file position or override); for a default, the nearest enclosing key they
        wrote; else the recipe file. Every error about a recipe key is located through this."""
        probe = path
        while probe:
            where = self.origins.get(probe)
            if where is not None and where != DEFAULT:
                return where
            probe = probe.rpartition(".")[0]
        return Location(self.file)

    def error(self, problems: list[Problem]) -> RecipeError:
        """Problems found by any check, each located at the key the user wrote, as one error."""
        return RecipeError([replace(p, location=self.locate(p.path)) for p in problems], file=self.file)

    def resolved_yaml(self) -> str:
        """The full resolved recipe as YAML, keys in schema order, secrets masked."""
        import yaml

        data = self.recipe.model_dump(mode="json", exclude={"extends"})
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt", ".arrow")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def looks_local(value: str) -> bool:
    """A path the user means as local: absolute, ./ ~, a data file name, or not a hub id (org/name).
    `ftune validate --check-paths` and `ftune run` both decide with this."""
    return value.startswith(("/", ".", "~")) or value.endswith(_DATA_SUFFIXES) or not _HUB_ID.match(value)


def display(path: str | Path) -> str:
    """A file path as shown in messages: relative to the working directory when below it."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def dotted(path: KeyPath) -> str:
    return ".".join(map(str, path))


# --------------------------------------------------------------------------------------- context
@dataclass
class _Load:
    root: Path
    """The top-level recipe file: its folder, and the FTUNE_RECIPE_PATH roots, hold every base."""
    files: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    override_args: dict[KeyPath, str] = field(default_factory=dict)
    incomplete: bool = False  # a file couldn't be read or parsed: what's missing from it isn't reported
    lost_base: bool = False  # a base was refused or not found: a key missing may be one it would have set
    composed: dict[Path, tuple[dict, dict] | None] = field(default_factory=dict)
    """Each base composed once per load: a fan-out of bases costs their number, not the paths through them."""
    roots: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        self.roots = (self.root.parent, *recipe_roots())

    def add(self, message: str, path: KeyPath | str = "", hint: str | None = None, where: Location | None = None):
        loc = where or Location(str(self.root), 1, 1)
        self.problems.append(Problem(message, path if isinstance(path, str) else dotted(path), hint, loc))


# ------------------------------------------------------------------------------------ extends/merge
MAX_EXTENDS_DEPTH = 32
"""Files in one chain of `extends` (a recipe, its base, the base's base, ...)."""
MAX_RECIPE_BYTES = 1 << 20
"""Size of one recipe or base file (a real one is a few kB)."""
RECIPE_PATH_ENV = "FTUNE_RECIPE_PATH"
_YAML_SUFFIXES = (".yaml", ".yml")


def recipe_roots() -> list[Path]:
    """Folders named in FTUNE_RECIPE_PATH (os.pathsep-separated), resolved; bases may live there too."""
    return [Path(p).expanduser().resolve() for p in os.environ.get(RECIPE_PATH_ENV, "").split(os.pathsep) if p.strip()]


def _resolve(file: Path, rel: str) -> Path | None:
    """`extends: rel` in `file`, absolute with symlinks followed; None for a path that can't be one."""
    try:
        return (file.parent / rel).resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
        return None


def _refusal(rel: str, base: Path, ctx: _Load) -> tuple[str, str] | None:
    """Why `extends: rel` (resolved to `base`, symlinks followed) may not be read, or None. Decided on the
    name alone: the target is never opened, listed or stat'ed, so nothing of it reaches a message."""
    if not any(base.is_relative_to(root) for root in ctx.roots):
        return (
            f"base recipe {rel!r} is outside the recipe's folder",
            f"bases live under {display(ctx.root.parent)} (the folder of the recipe you ran) or under a folder "
            f"listed in ${RECIPE_PATH_ENV}; symlinks count where they point",
        )
    if base.suffix.lower() not in _YAML_SUFFIXES:
        return f"base recipe {rel!r} is not a YAML file", "a base is a .yaml or .yml recipe file"
    return None
def _method_changes(path: KeyPath, base: dict, top: dict) -> bool:
    """A `peft:` section naming another method replaces the base's instead of merging into it."""
    return path == ("peft",) and "method" in top and base.get("method", "lora") != top["method"]


def _merge(base: dict, top: dict, path: KeyPath, replaced: set[KeyPath]) -> dict:
    out = dict(base)
    for key, value in top.items():
        p = (*path, key)
        below = out.get(key)
        if isinstance(value, dict) and isinstance(below, dict) and not _method_changes(p, below, value):
            out[key] = _merge(below, value, p, replaced)
        else:
            out[key] = value
            replaced.add(p)
    return out


def _drop_below(marks: dict[KeyPath, Marks], roots: set[KeyPath]) -> dict[KeyPath, Marks]:
    return {p: m for p, m in marks.items() if not any(p[:k] in roots for k in range(len(p)))}


def _layer(base: tuple[dict, dict], top: tuple[dict, dict]) -> tuple[dict, dict]:
    """Deep-merge (data, marks) `top` over `base`: mappings merge, everything else (lists too) is replaced."""
    replaced: set[KeyPath] = set()
    data = _merge(base[0], top[0], (), replaced)
    return data, {**_drop_below(base[1], replaced), **top[1]}


def _extends_entries(doc: _yaml.Document, ctx: _Load, file: Path) -> list[tuple[str, Location]]:
    value = doc.data.get("extends")
    if value is None:
        return []
    if isinstance(value, str):
        return [(value, doc.marks[("extends",)].value)]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [(v, doc.marks[("extends", i)].value) for i, v in enumerate(value)]
    where = doc.marks[("extends",)].value
    ctx.add("expected a path or a list of paths", "extends", "e.g. `extends: bases/llama2-7b.yaml`", where)
    return []


_PARSED: dict[tuple[Path, str], _yaml.Document] = {}


def _parse_cached(text: str, file: Path) -> _yaml.Document:
    """Parse once per (file, content): `validate DIR` reads each base for every recipe that extends it.
    Documents are never mutated (merging copies what it changes)."""
    key = (file, text)
    if key not in _PARSED:
        if len(_PARSED) > 256:
            _PARSED.clear()
        _PARSED[key] = _yaml.parse(text, str(file))
    return _PARSED[key]


def _read(file: Path, ctx: _Load) -> str | None:
    try:
        if file.stat().st_size > MAX_RECIPE_BYTES:
            ctx.add(f"{display(file)} is larger than {MAX_RECIPE_BYTES >> 20} MiB: not a recipe",
                    hint="a recipe is a small YAML file", where=Location(str(file)))
            return None
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        ctx.add(f"can't read {display(file)}: not UTF-8 text (byte {err.start})", where=Location(str(file)))
    except OSError as err:
        ctx.add(f"can't read {display(file)}: {err.strerror or err}", where=Location(str(file)))
    return None


def _compose(file: Path, stack: tuple[Path, ...], ctx: _Load) -> tuple[dict, dict] | None:
    """The file's data and marks with its bases merged under it; problems go to ctx.

    A base is composed once per load (memoised in ctx), so its problems are reported once too.
    """
    if stack and file in ctx.composed:
        return ctx.composed[file]
    result = _compose_once(file, stack, ctx)
    if stack:
        ctx.composed[file] = result
    return result


def _compose_once(file: Path, stack: tuple[Path, ...], ctx: _Load) -> tuple[dict, dict] | None:
    if str(file) not in ctx.files:
        ctx.files.append(str(file))
    text = _read(file, ctx)
    if text is None:
        ctx.incomplete = True
        return None
    doc = _parse_cached(text, file)
    ctx.problems.extend(doc.problems)
    if doc.data is None:
        ctx.incomplete = True
        return None
    if not isinstance(doc.data, dict):
        ctx.add(
            "a recipe is a mapping of sections (name:, model:, data:, ...)",
            hint="start each top-level key at column 1: `name: my-run`",
            where=Location(str(file), 1, 1),
        )
        ctx.incomplete = True
        return None
    merged: tuple[dict, dict] = ({}, {})
    for rel, where in _extends_entries(doc, ctx, file):
        base = _resolve(file, rel)
        refused = _refusal(rel, base, ctx) if base is not None else (f"invalid path {rel!r}", "write a relative path")
        if refused:
            ctx.add(refused[0], "extends", refused[1], where)
            ctx.lost_base = True
            continue
        if len(stack) + 1 >= MAX_EXTENDS_DEPTH and base not in stack and base != file:
            ctx.add(f"the chain of `extends` is longer than {MAX_EXTENDS_DEPTH} files", "extends",
                    "a recipe needs a base or two: flatten the chain", where)
            ctx.lost_base = True
            continue
        if base == file or base in stack:
            loop = stack[stack.index(base) :] if base in stack else ()
            chain = " → ".join(os.path.relpath(p, ctx.root.parent) for p in (*loop, file, base))
            ctx.add(f"extends cycle: {chain}", "extends", "a base can't extend the recipes built on it", where)
            continue
        if not base.is_file():
            near = [p.name for p in base.parent.glob("*.y*ml")] if base.parent.is_dir() else []
            guess = did_you_mean(base.name, near)
            hint = f"did you mean '{guess}'?" if guess else "paths in `extends` are relative to the recipe file"
            ctx.add(f"base recipe not found: {rel} (looked for {display(base)})", "extends", hint, where)
            ctx.lost_base = True
            continue
        sub = _compose(base, (*stack, file), ctx)
        if sub is not None:
            merged = _layer(merged, sub)
    own, marks = dict(doc.data), doc.marks
    if stack:  # a base's own `extends` is resolved; only the top recipe's stays visible
        own.pop("extends", None)
        marks = _drop_below(marks, {("extends",)})
        marks.pop(("extends",), None)
    return _layer(merged, (own, marks))


def recipe_bases(path: str | Path) -> list[str]:
    """The files a recipe names in `extends` (absolute), read leniently; [] when unreadable."""
    file = Path(path).resolve()
    try:
        doc = _parse_cached(file.read_text(encoding="utf-8"), file)
    except (OSError, UnicodeDecodeError):
        return []
    if not isinstance(doc.data, dict):
        return []
    value = doc.data.get("extends")
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return [str(base) for n in names if isinstance(n, str) and (base := _resolve(file, n)) is not None]


# ------------------------------------------------------------------------------------- locating
def _locate(path: KeyPath, anchor: str, marks: dict[KeyPath, Marks], ctx: _Load) -> tuple[Location, str]:
    """Where to point for a problem at `path`, and a suffix quoting the override that set it."""
    p = path[:-1] if anchor == "parent" else path
    exact = p in marks
    while p and p not in marks:
        p = p[:-1]
    if not p:
        return Location(str(ctx.root), 1, 1), ""
    where = marks[p].value if exact and anchor == "value" else marks[p].key
    if where.origin == "override":
        arg = ctx.override_args.get(p) or next((a for q, a in ctx.override_args.items() if q == p[: len(q)]), "")
        return where, f" (override '{shown_override(arg)}')" if arg else ""
    return where, ""


def _problem(issue: Issue, marks: dict[KeyPath, Marks], ctx: _Load) -> Problem:
    where, suffix = _locate(issue.path, issue.anchor, marks, ctx)
    return Problem(issue.message + suffix, dotted(issue.path), issue.hint, where)


def _related(a: KeyPath, b: KeyPath) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _validate(data: dict) -> tuple[Recipe | None, list[Issue]]:
    from pydantic import ValidationError

    try:
        return Recipe.model_validate(data), []
    except ValidationError as err:
        return None, translate(err.errors(include_url=False))


def _without(data: dict, paths: list[KeyPath]) -> dict:
    """A copy of data with the keys at `paths` removed (the bad values), so the rest can be checked."""
    out = copy.deepcopy(data)
    for path in paths:
        node = out
        for part in path[:-1]:
            node = node[part] if isinstance(node, dict) and part in node else None
            if node is None:
                break
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def _rule_issues(data: dict, known: list[Issue], first: tuple[Recipe | None, list[Issue]]) -> list[Issue]:
    """Cross-field rules, also when some keys are invalid: checked on the recipe without them.

    A violation is dropped when it concerns a bad value (its path and the value's are related): it
    may only be a consequence of the value's removal. Unknown keys change nothing, so they hide only
    what is below them.
    """
    from ftune.recipe import rules

    values = [i.path for i in known if i.anchor != "key"]
    keys = [i.path for i in known if i.anchor == "key"]
    recipe, issues = first
    for _ in range(3):
        if recipe is not None:
            break
        values += [i.path for i in issues if i.anchor != "key"]
        keys += [i.path for i in issues if i.anchor == "key"]
        recipe, issues = _validate(_without(data, values + keys))
    if recipe is None:
        return []
    found = []
    for v in rules.check(recipe):
        path = tuple(int(p) if p.isdigit() else p for p in v.path.split(".")) if v.path else ()
        if any(_related(path, b) for b in values) or any(path[: len(k)] == k for k in keys):
            continue
        found.append(Issue(path, v.message, v.hint, "key"))
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
    ctx = _Load(root=file)
    composed = _compose(file, (), ctx)
    if composed is None or ctx.incomplete:
        raise RecipeError(_sorted(ctx), display(file))
    data, marks = copy.deepcopy(composed[0]), dict(composed[1])
    apply_overrides(data, marks, parsed, ctx)
    if isinstance(data.get("peft"), dict) and "method" not in data["peft"]:
        data["peft"] = {"method": "lora", **data["peft"]}  # a peft section without a method is LoRA
    raw = data
    data, issues = interpolate(data)
    masked = mask_secrets(raw, data)
    masked.values |= override_secrets(overrides)
    issues += masked.issues
    bad = [i.path for i in issues]
    recipe, schema_issues = _validate(data)
    reported = {p.path for p in ctx.problems}  # e.g. a bad `extends` value, already reported while composing
    issues += [i for i in schema_issues if i.path not in bad and dotted(i.path) not in reported
               and not (ctx.lost_base and i.anchor == "parent")]  # "missing": the lost base may set it
    issues += _rule_issues(data, issues, (recipe, schema_issues))
    ctx.problems.extend(_problem(i, marks, ctx) for i in issues)
    if ctx.problems or recipe is None:
        ctx.problems = [_scrubbed(p, masked) for p in ctx.problems]
        raise RecipeError(_sorted(ctx), display(file))
    return LoadedRecipe(recipe, str(file), list(ctx.files), _origins(recipe, marks), masked.secrets, masked.env)


def _scrubbed(p: Problem, masked: Masked) -> Problem:
    """The problem with any secret value in its text masked (a message may quote a value or an override)."""
    if not masked.values:
        return p
    return Problem(masked.scrub(p.message) or "", p.path, masked.scrub(p.hint), p.location, p.severity)


def _sorted(ctx: _Load) -> list[Problem]:
    order = {display(f): i for i, f in enumerate(ctx.files)}

    def key(p: Problem) -> tuple:
        loc = p.location
        return (loc.file is None, order.get(loc.file or "", len(order)), loc.line or 0, loc.column or 0)

    shown = [
        Problem(p.message, p.path, p.hint, Location(display(p.location.file), p.location.line, p.location.column), p.severity)
        if p.location.file and os.path.isabs(p.location.file)
        else p
        for p in ctx.problems
    ]
    return sorted(dict.fromkeys(shown), key=key)
