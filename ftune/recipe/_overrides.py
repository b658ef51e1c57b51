"""Command-line overrides `key.path=value` and `~key.path`, checked against the schema.

List items are addressed by index, `data.train.0.path` or `data.train[0].path` (as errors spell keys).
A value is parsed as YAML (`5` → int, `[a, b]` → list, `null` → None; text that isn't YAML stays
text) and typed later by validation. The key must exist in the schema (the `peft` keys depend on
`peft.method`); setting another `peft.method` starts that section afresh.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from ftune.errors import Location, UsageError, key_path
from ftune.methods import DEFAULT as DEFAULT_METHOD
from ftune.recipe import _yaml
from ftune.recipe._schema import check_key
from ftune.recipe._secrets import shown_override
from ftune.recipe._yaml import Marks

KeyPath = tuple[str | int, ...]
OVERRIDE = Location(origin="override")
_OVERRIDE_MARKS = Marks(OVERRIDE, OVERRIDE)


@dataclass(frozen=True)
class Override:
    arg: str
    parts: KeyPath
    value: object = None
    delete: bool = False


def parse_overrides(args: Sequence[str]) -> list[Override]:
    out, bad = [], []
    for arg in args:
        delete = arg.startswith("~")
        key, eq, text = arg[1 if delete else 0 :].partition("=")
        parts = key_path(key)  # `data.train[0].path`, as errors spell keys, is `data.train.0.path`
        if not key or (delete and eq) or (not delete and not eq) or any(p == "" for p in parts):
            bad.append(arg)
            continue
        out.append(Override(arg, parts, _override_value(text), delete))
    if bad:
        raise UsageError(
            "invalid override" + ("s" if len(bad) > 1 else "") + ": " + ", ".join(repr(shown_override(b)) for b in bad),
            hint="write key.path=value (e.g. train.max_steps=5) or ~key.path to delete a key",
        )
    return out


def _override_value(text: str) -> object:
    """The value parsed as YAML (5 → int, [a, b] → list, null → None); plain text if it isn't YAML."""
    if not text.strip():
        return None
    doc = _yaml.parse(text, "<override>")
    if doc.problems:
        if any("tag" in p.message for p in doc.problems):
            return _Refused(doc.problems[0].message)
        return text
    return doc.data


@dataclass(frozen=True)
class _Refused:
    reason: str


def apply_overrides(data: dict, marks: dict[KeyPath, Marks], overrides: list[Override], ctx) -> None:
    """Apply overrides in order to (data, marks); problems go to ctx (quoting the argument)."""
    last_method = next((o.value for o in reversed(overrides) if o.parts == ("peft", "method")), None)
    peft = data.get("peft")
    method = last_method or (peft.get("method") if isinstance(peft, dict) else None) or DEFAULT_METHOD
    for o in overrides:
        if isinstance(o.value, _Refused):
            ctx.add(f"{o.value.reason} (override '{shown_override(o.arg)}')", o.parts, "recipes are data, never code", OVERRIDE)
            continue
        if o.parts[0] == "extends":
            ctx.add(f"`extends` can't be overridden (override '{shown_override(o.arg)}')", "extends",
                    "write a small recipe that extends the one you want", OVERRIDE)
            continue
        problem = None if o.delete and _exists(data, o.parts) else check_key(o.parts, str(method), data)
        if problem is not None:
            ctx.add(f"{problem.message} (override '{shown_override(o.arg)}')", problem.path, problem.hint, OVERRIDE)
            continue
        node = data
        for part in o.parts[:-1]:
            if isinstance(node, dict) and not isinstance(node.get(part), (dict, list)):
                if o.delete:
                    break
                node[part] = {}
            node = node[part]
        else:
            last = o.parts[-1]
            gone = {o.parts}
            if o.delete:
                if isinstance(node, dict):
                    node.pop(last, None)
            elif o.parts == ("peft", "method") and node and node.get(last, DEFAULT_METHOD) != o.value:
                data["peft"] = {"method": o.value}  # another method: the old method's keys don't apply
                gone = {("peft",)}
            else:
                node[last] = copy.deepcopy(o.value)
            for p in [p for p in marks if any(p[:k] in gone for k in range(len(p)))]:
                del marks[p]  # what was below the replaced or deleted key
            if o.delete:
                marks.pop(o.parts, None)
                continue
            for p in [o.parts, *(o.parts + sub for sub in _subpaths(o.value))]:
                marks[p] = _OVERRIDE_MARKS
                ctx.override_args[p] = o.arg


def _exists(data: object, parts: KeyPath) -> bool:
    for part in parts:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return False
    return True


def _subpaths(value: object, path: KeyPath = ()) -> list[KeyPath]:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [q for k, v in items for q in [(*path, k), *_subpaths(v, (*path, k))]]
