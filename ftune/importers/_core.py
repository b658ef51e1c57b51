"""What every importer shares: reading a peer's YAML with line numbers, walking its mapping table,
collecting the keys that can't be mapped (each with its line and the reason), and writing the recipe.

A peer module holds a `TABLE` (peer key, dotted for nested sections → `Key` or `Skip`) and a
`finish(ctx)` for what depends on several keys (defaults that differ from ftune's, cross-key values).
Value translators the peers share live in `_values`. Nothing here imports the training stack:
`ftune import` is a light command.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ftune.errors import FtuneError, Location, Problem, RecipeError

PeerPath = tuple[str | int, ...]


class Unmappable(Exception):
    """Raised by a translate function: this value has no ftune equivalent (the message is the reason)."""


class ChangesBehaviour(Unmappable):
    """Unmappable, and leaving it out makes the run train differently from the peer's: listed loudly."""


NOTHING = object()
"""A translate function's return value when it set what it needed itself (or there is nothing to set)."""


@dataclass(frozen=True)
class Key:
    """A peer key with an ftune equivalent: `target` (dotted ftune key) gets `translate(value, ctx)`."""

    target: str | None
    translate: Callable[[Any, Context, PeerPath], Any] | None = None
    """(value, ctx, peer key path) -> ftune value; may call ctx.set itself (and return NOTHING) or raise Unmappable."""


@dataclass(frozen=True)
class Skip:
    """A peer key ftune knows but has no key for; `reason` is what the user reads. `changes`: leaving it out
    makes the run train differently (the objective, loss masking, clipping, template, precision, optimizer or
    schedule), so it is listed under the loud "changes behaviour" heading, not with the harmless ones."""

    reason: str
    changes: bool = False


@dataclass(frozen=True)
class Unmapped:
    key: str
    """The peer key as written, dotted (datasets.0.shards)."""
    line: int | None
    reason: str
    changes: bool = False
    """Leaving it out changes what the run trains (listed under "changes behaviour")."""

    def render(self) -> str:
        return f"line {self.line}: {self.key}: {self.reason}" if self.line else f"{self.key}: {self.reason}"


def dotted(path: PeerPath) -> str:
    return ".".join(map(str, path))


@dataclass
class Context:
    """One import in progress: the peer's data and key positions, the recipe being built, and the findings."""

    peer: str
    file: Path
    config: dict
    lines: dict[PeerPath, int]
    out: dict = field(default_factory=dict)
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def line(self, path: PeerPath) -> int | None:
        """The line of `path`, or of the nearest enclosing key written in the file (a default has no line)."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def set(self, target: str, value: Any) -> None:
        """Set a dotted ftune key (`train.epochs`) in the recipe being built."""
        *parents, last = target.split(".")
        node = self.out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def get(self, target: str, default: Any = None) -> Any:
        node: Any = self.out
        for part in target.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def skip(self, path: PeerPath, reason: str, changes: bool = False) -> None:
        self.unmapped.append(Unmapped(dotted(path), self.line(path), reason, changes))

    def refuse(self, path: PeerPath, message: str, hint: str) -> None:
        """A value whose run ftune can't reproduce, where any recipe would train something else: exit 1, located."""
        raise FtuneError(f"{dotted(path)}: {message}", hint=hint, location=Location(str(self.file), self.line(path)))

    def note(self, path: PeerPath | None, text: str) -> None:
        where = f"line {self.line(path)}: " if path and self.line(path) else ""
        self.notes.append(f"{where}{dotted(path) + ': ' if path else ''}{text}")


# ------------------------------------------------------------------------------------------ reading
MAX_CONFIG_BYTES = 4 << 20
"""A peer config is a few kB; anything past this is not one (and is never read whole)."""


def read(peer: str, file: str | Path) -> tuple[dict, dict[PeerPath, int]]:
    """The peer config as plain data and the line of each key; a located FtuneError (exit 1) when it can't be read."""
    from ftune.recipe import parse_yaml

    path = Path(file)
    shown = str(file)
    if path.is_dir():
        raise FtuneError(f"{shown} is a directory", hint=f"give the {peer} config file", location=Location(shown))
    if path.exists() and not path.is_file():  # /dev/full, a FIFO: reading would never end
        raise FtuneError(f"{shown} is not a regular file", hint=f"give the {peer} config file", location=Location(shown))
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise FtuneError(f"{shown} is {path.stat().st_size:,} bytes; a {peer} config is at most "
                             f"{MAX_CONFIG_BYTES:,}", hint=f"give the {peer} config file", location=Location(shown))
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FtuneError(f"{peer} config not found: {shown}", hint="check the path", location=Location(shown)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise FtuneError(f"can't read {shown}: {err}", hint="give a readable YAML file", location=Location(shown)) from None
    doc = parse_yaml(text, shown)
    if doc.problems:
        raise RecipeError(doc.problems, shown)
    if doc.data is None or doc.data == {}:
        raise FtuneError(f"{shown} is empty", hint=f"give a {peer} config file", location=Location(shown, 1, 1))
    if not isinstance(doc.data, dict):
        raise FtuneError(
            f"{shown} is not a {peer} config: expected a mapping of keys, got a {type(doc.data).__name__}",
            hint=f"give a {peer} YAML config (key: value lines)",
            location=Location(shown, 1, 1),
        )
    return doc.data, {p: m.key.line for p, m in doc.marks.items() if m.key.line is not None}


# ------------------------------------------------------------------------------------------ walking
def apply_table(ctx: Context, table: dict[str, Key | Skip], unknown: str) -> None:
    """Translate every key of the peer config through `table`; keys it lacks are unmapped with `unknown`."""
    sections = {k.rpartition(".")[0] for k in table if "." in k}

    def visit(data: dict, prefix: PeerPath) -> None:
        for key, value in data.items():
            path = (*prefix, key)
            name = dotted(path)
            if value is None:  # an empty key (`wandb_watch:`) is unset in every peer: nothing to translate
                continue
            entry = table.get(name)
            if entry is None and isinstance(value, dict) and name in sections:
                visit(value, path)  # a section whose keys have their own rows
                continue
            if entry is None and prefix:
                entry = table.get(f"{dotted(prefix)}.*")
            if entry is None:
                ctx.skip(path, unknown)
                continue
            if isinstance(entry, Skip):
                if value not in (None, False, "", [], {}):  # an unset option needs no translation
                    ctx.skip(path, entry.reason, entry.changes)
                continue
            try:
                result = entry.translate(value, ctx, path) if entry.translate else value
            except Unmappable as why:
                ctx.skip(path, str(why), isinstance(why, ChangesBehaviour))
                continue
            if result is not NOTHING and entry.target is not None:
                ctx.set(entry.target, result)

    visit(ctx.config, ())


# ------------------------------------------------------------------------------------------ finishing
_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def run_name(*candidates: Any) -> str:
    """A valid recipe name from the first usable candidate (output dir, run name, file stem)."""
    for candidate in candidates:
        if not candidate:
            continue
        text = _NAME.sub("-", Path(str(candidate).rstrip("/")).name).strip("-._")
        if text:
            return text
    return "imported"


def finish_common(ctx: Context) -> None:
    """Cross-key facts every peer shares, applied after its own finish."""
    if "seed" in ctx.config and ctx.config["seed"] is None:  # skipped as unset by apply_table: say what it becomes
        ctx.note(("seed",), f"seed: null draws a new seed each {ctx.peer} run; the recipe keeps ftune's train.seed "
                 "(42: runs repeat); set train.seed to vary it")
    strategy = ctx.get("distributed.strategy")
    if strategy is None and ctx.get("distributed.fsdp") is not None:  # fsdp_config / fsdp_version alone mean FSDP
        strategy = "fsdp"
        ctx.set("distributed.strategy", strategy)
    if strategy in ("fsdp", "deepspeed", "ddp") and ctx.get("distributed.num_processes") is None:
        ctx.set("distributed.num_processes", "auto")
    q = ctx.get("quantization")
    dtype = ctx.get("model.dtype")
    shards = strategy == "fsdp" or (strategy == "deepspeed" and ctx.get("distributed.deepspeed.stage") == 3)
    if q and q.get("bits") == 4 and shards:
        if dtype in (None, "auto"):
            dtype = "bfloat16"
            ctx.set("model.dtype", dtype)
        if q.get("quant_storage") != dtype:
            ctx.set("quantization.quant_storage", dtype)
            ctx.note(None, f"quantization.quant_storage set to {dtype} (= model.dtype), which sharding a 4-bit base needs")


@dataclass(frozen=True)
class Imported:
    """The result of an import: the recipe (plain data, section order), and what didn't carry over."""

    peer: str
    source: str
    recipe: dict
    unmapped: list[Unmapped]
    notes: list[str]

    def yaml(self, command: str) -> str:
        head = [f"# Imported from the {self.peer} config {self.source} by `{command}`.",
                "# Mapping tables: docs/import.md. Check it with `ftune validate` and `ftune data` before training."]
        changes = [u for u in self.unmapped if u.changes]
        quiet = [u for u in self.unmapped if not u.changes]
        if changes:
            head += ["#", f"# CHANGES BEHAVIOUR: not imported, and this run trains differently from the {self.peer} "
                     f"run ({len(changes)} key{'s' if len(changes) != 1 else ''}):"]
            head += [f"#   {u.render()}" for u in changes]
        if quiet:
            head += ["#", f"# Not imported ({len(quiet)} key{'s' if len(quiet) != 1 else ''}):"]
            head += [f"#   {u.render()}" for u in quiet]
        if self.notes:
            head += ["#", "# Check:"] + [f"#   {n}" for n in self.notes]
        body = yaml.dump(self.recipe, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
        return "\n".join(head) + "\n" + body


class _Dumper(yaml.SafeDumper):
    """Sections in block style, lists of scalars on one line (`target_modules: [q_proj, v_proj]`)."""


def _list(dumper, data: list):
    flow = all(not isinstance(v, (dict, list)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _list)


def _schema_order(out: dict) -> dict:
    """The recipe's sections and keys in the schema's order (as `ftune show` prints them)."""
    import typing

    from pydantic import BaseModel

    from ftune.methods import METHODS, method_module
    from ftune.recipe.schema import Recipe

    def model_of(annotation) -> type[BaseModel] | None:
        for candidate in (annotation, *typing.get_args(annotation)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                return candidate
        return None

    def order(data: dict, model: type[BaseModel] | None) -> dict:
        if model is None:
            return data
        names = list(model.model_fields)
        keys = sorted(data, key=lambda k: names.index(k) if k in names else len(names))
        return {k: order(data[k], model_of(model.model_fields[k].annotation)) if isinstance(data[k], dict)
                and k in model.model_fields else data[k] for k in keys}

    result = order(out, Recipe)
    peft = result.get("peft")
    if isinstance(peft, dict) and peft.get("method", "lora") in METHODS:
        result["peft"] = order(peft, method_module(peft.get("method", "lora")).Config)
    return result


_SOURCE_ORDER = ("path", "type", "format", "split", "fields", "roles", "template", "limit")


def _source_order(source: dict) -> dict:
    return {k: source[k] for k in sorted(source, key=lambda k: _SOURCE_ORDER.index(k) if k in _SOURCE_ORDER else 99)}


def build(peer: str, file: str | Path, table: dict[str, Key | Skip], unknown: str,
          finish: Callable[[Context], None]) -> Imported:
    config, lines = read(peer, file)
    ctx = Context(peer, Path(file), config, lines)
    apply_table(ctx, table, unknown)
    finish(ctx)
    finish_common(ctx)
    ctx.out.setdefault("schema_version", 1)
    for split in ("train", "eval"):
        if isinstance(ctx.get(f"data.{split}"), list):
            ctx.out["data"][split] = [_source_order(s) for s in ctx.out["data"][split]]
    ordered = _schema_order(ctx.out)
    unmapped = sorted(ctx.unmapped, key=lambda u: (u.line or 0, u.key))
    return Imported(peer, os.path.relpath(file) if not str(file).startswith("..") else str(file), ordered,
                    unmapped, ctx.notes)


def validate(text: str, where: str) -> list[Problem]:
    """Problems ftune's own loader finds in an imported recipe (empty when it validates)."""
    import tempfile

    from ftune.recipe.load import load_recipe

    with tempfile.TemporaryDirectory(prefix="ftune-import-") as tmp:
        target = Path(tmp) / "recipe.yaml"
        target.write_text(text, encoding="utf-8")
        try:
            load_recipe(target)
        except RecipeError as err:
            return [Problem(p.message, p.path, p.hint, Location(where, p.location.line, p.location.column))
                    for p in err.problems]
    return []
