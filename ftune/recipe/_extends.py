"""`extends`: a recipe composed over its bases, each read once, with every key's position kept.

Mappings merge and everything else (lists too) is replaced; a `peft:` naming another method replaces the base's
section. Bases must live under the top recipe's folder or a folder in $FTUNE_RECIPE_PATH; paths are decided on
their names alone. Problems go to the load context (`LoadContext`), which `ftune.recipe.load` turns into one error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ftune.errors import Location, Problem, key
from ftune.methods import DEFAULT as DEFAULT_METHOD
from ftune.recipe import _yaml
from ftune.recipe._schema import did_you_mean
from ftune.recipe._yaml import Marks

KeyPath = tuple[str | int, ...]


def display(path: str | Path) -> str:
    """A file path as shown in messages: relative to the working directory when below it."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def dotted(path: KeyPath) -> str:
    return ".".join(map(str, path))


# --------------------------------------------------------------------------------------- context
@dataclass
class LoadContext:
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
        self.problems.append(Problem(message, path if isinstance(path, str) else key(path), hint, loc))


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


def _refusal(rel: str, base: Path, ctx: LoadContext) -> tuple[str, str] | None:
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
    return path == ("peft",) and "method" in top and base.get("method", DEFAULT_METHOD) != top["method"]


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


def _extends_entries(doc: _yaml.Document, ctx: LoadContext, file: Path) -> list[tuple[str, Location]]:
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


def _read(file: Path, ctx: LoadContext) -> str | None:
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


def compose(file: Path, stack: tuple[Path, ...], ctx: LoadContext) -> tuple[dict, dict] | None:
    """The file's data and marks with its bases merged under it; problems go to ctx.

    A base is composed once per load (memoised in ctx), so its problems are reported once too.
    """
    if stack and file in ctx.composed:
        return ctx.composed[file]
    result = _compose_once(file, stack, ctx)
    if stack:
        ctx.composed[file] = result
    return result


def _compose_once(file: Path, stack: tuple[Path, ...], ctx: LoadContext) -> tuple[dict, dict] | None:
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
        sub = compose(base, (*stack, file), ctx)
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


def named_config_files(path: str | Path) -> list[str]:
    """The accelerate and DeepSpeed config files a recipe names (`distributed.accelerate_config`,
    `distributed.deepspeed.config`), and those its bases name, absolute (each relative to the file that names it);
    read leniently: [] when unreadable. `ftune validate DIR` leaves them out: they are not recipes."""
    out: list[str] = []
    todo, seen = [Path(path).resolve()], set()
    while todo:
        file = todo.pop()
        if file in seen:
            continue
        seen.add(file)
        try:
            doc = _parse_cached(file.read_text(encoding="utf-8"), file)
        except (OSError, UnicodeDecodeError):
            continue
        if not isinstance(doc.data, dict):
            continue
        dist = doc.data.get("distributed")
        if isinstance(dist, dict):
            ds = dist.get("deepspeed")
            for value in (dist.get("accelerate_config"), ds.get("config") if isinstance(ds, dict) else None):
                if isinstance(value, str):
                    out.append(str((file.parent / value).resolve()))
        todo += [Path(b) for b in recipe_bases(file)]
    return out
