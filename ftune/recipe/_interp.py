"""`${...}` interpolation with omegaconf, and secret masking.

`${name}`, `${model.path}` refer to other keys (by dotted path from the top); `${env:VAR}` and
`${env:VAR,default}` (or omegaconf's `${oc.env:...}`) read the environment. Each reference is
resolved on its own so that every bad one is reported, at its own key. A value read from an
environment variable whose name marks a secret (TOKEN, KEY, ...) is masked afterwards (`_secrets`).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from typing import Any

from ftune.errors import Problem
from ftune.recipe._schema import did_you_mean

Path = tuple[str | int, ...]
KeyPath = Path

MASK = "***"
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASS", "CREDENTIAL", "AUTH")
_ENV_REF = re.compile(r"\$\{\s*(?:oc\.)?env\s*:\s*([A-Za-z_][A-Za-z0-9_]*)")
_UNSET = re.compile(r"[Ee]nvironment variable '?([A-Za-z_][A-Za-z0-9_]*)'? (?:is not set|not found)")
_MISSING_KEY = re.compile(r"Interpolation key '([^']*)' not found")
_NO_DEFAULT = object()


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def _env(name: str, default: Any = _NO_DEFAULT) -> Any:
    value = os.environ.get(name)
    if value is None:
        if default is _NO_DEFAULT:
            raise ValueError(f"environment variable {name} is not set")
        return default
    return value


def leaves(data: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every scalar leaf with its path."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from leaves(v, (*path, i))
    else:
        yield path, data


def _set(data: Any, path: Path, value: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def _dotted(path: Path) -> str:
    return ".".join(map(str, path))


def _message(err: Exception, raw: str, data: Any) -> tuple[str, str]:
    text = str(err).splitlines()[0]
    if unset := _UNSET.search(text):
        name = unset.group(1)
        return (
            f"environment variable {name} is not set (in {raw!r})",
            f"export {name}=..., or give a default: ${{env:{name},default}}",
        )
    if missing := _MISSING_KEY.search(text):
        ref = missing.group(1)
        guess = did_you_mean(ref, [_dotted(p) for p, _ in leaves(data)])
        return (
            f"unknown reference '${{{ref}}}'" + (f" (did you mean '${{{guess}}}'?)" if guess else ""),
            "a reference names another key by its dotted path from the top, e.g. ${name} or ${model.path}",
        )
    if "Recursive interpolation" in text:
        return f"recursive interpolation in {raw!r}", "a value can't refer to itself, directly or through others"
    if "GrammarParseError" in type(err).__name__ or "no viable alternative" in text or "mismatched input" in text:
        return f"invalid interpolation {raw!r}", "write ${key.path} or ${env:VAR,default}; escape a literal $ as \\${"
    return f"can't resolve {raw!r}: {text}", "write ${key.path} or ${env:VAR,default}"


_TOKEN = re.compile(r"\$\{\s*([A-Za-z_][\w-]*)\s*(:?)")


def _needed(data: dict, raws: list[str]) -> dict:
    """The top-level sections the references can reach (building omegaconf's tree of the whole recipe
    costs more than the rest of validation). Any resolver but env needs everything."""
    keys: set[str] = set()
    pending = list(raws)
    while pending:
        for name, colon in _TOKEN.findall(pending.pop()):
            if colon and name not in ("env", "oc"):
                return data
            if not colon and name in data and name not in keys:
                keys.add(name)
                pending += [v for _, v in leaves(data[name]) if isinstance(v, str) and "${" in v]
    if any(re.search(r"\$\{\s*(oc\.(?!env\b)|\.)", raw) for raw in raws):  # other resolvers, relative keys
        return data
    holders = {p[0] for p, v in leaves(data) if isinstance(v, str) and "${" in v}
    return {k: v for k, v in data.items() if k in keys | holders}


MAX_NESTING = 8
"""`${...}` inside `${...}` (a default that is itself a reference), this many levels at most."""


def _nesting(raw: str) -> int:
    depth = deepest = 0
    for i, ch in enumerate(raw):
        if ch == "{" and i and raw[i - 1] == "$":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == "}" and depth:
            depth -= 1
    return deepest


def interpolate(data: dict) -> tuple[dict, list[Problem]]:
    """Resolve every `${...}` in `data`; returns (resolved copy, issues). Secrets are masked after (_secrets)."""
    refs = [(p, v) for p, v in leaves(data) if isinstance(v, str) and "${" in v]
    if not refs:
        return data, []
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not OmegaConf.has_resolver("env"):
        OmegaConf.register_resolver("env", _env, annotation_validation="off")
    issues: list[Problem] = []
    staged = copy.deepcopy(data)
    good: list[tuple[Path, str]] = []
    for path, raw in refs:  # check each string's syntax alone: one bad string must not hide the others
        if _nesting(raw) > MAX_NESTING:  # omegaconf's grammar recurses: deep enough, it overflows the stack
            issues.append(Problem.at(path, f"interpolations nested deeper than {MAX_NESTING} levels",
                                "write ${key.path} or ${env:VAR,default}; a default may hold one more ${...}", anchor="value"))
            _set(staged, path, None)
            continue
        try:
            OmegaConf.create({"v": raw})
            good.append((path, raw))
        except (OmegaConfBaseException, RecursionError) as err:
            issues.append(Problem.at(path, *_message(err, raw, data), anchor="value"))
            _set(staged, path, None)
    cfg = OmegaConf.create(_needed(staged, [raw for _, raw in good] if good else []))
    out = copy.deepcopy(staged)
    for path, raw in good:
        node: Any = cfg
        try:
            for part in path[:-1]:
                node = node[part]
            value = node[path[-1]]
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
            _set(out, path, value)
        except (OmegaConfBaseException, RecursionError) as err:  # a chain of references too long to follow
            issues.append(Problem.at(path, *_message(err, raw, data), anchor="value"))
            _set(out, path, None)
    return out, issues
